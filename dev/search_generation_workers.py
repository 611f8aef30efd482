"""How many threads batched candidate generation wants: times `Index.generate` for every query of
`benchmarks.search_batch`'s stdlib index of N functions (its queries: one per function, at most
2,000) on 1..16 threads (`index._map`, as `Index.search_many` runs it), checks that the pools do
not depend on the thread count, and writes {"functions": N, "generate_s": {threads: s}} per N.

    PYTHONPATH=. python -m dev.search_generation_workers /tmp/search_batch dev/results/<machine>/search_generation_workers.json 1000 3700
"""

from __future__ import annotations

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # first: MLX's CPU BLAS is chosen when mlx.core loads (mlxio.runtime)

import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.search_batch import prepare
from mlxio.search import index as search_index

THREADS = (1, 2, 4, 8, 16)


def time_generation(work: Path, functions: int) -> dict:
    """{"functions", "documents", "tokens", "queries", "generate_s": {threads: seconds}} on one index."""
    from mlxio.search.searcher import Searcher

    index_dir, queries_path, _ = prepare(work, functions)
    texts = [json.loads(line)["query"] for line in queries_path.read_text().splitlines()][:2000]
    searcher = Searcher(index_dir)
    index = searcher.index
    vecs = [v.astype(np.float32) for v in searcher.embedder.embed(texts)]
    result = {"functions": functions, "documents": index.n_docs, "tokens": int(index.n_tokens),
              "queries": len(texts), "generate_s": {}}
    reference = None
    for threads in THREADS:
        t = time.perf_counter()
        pools = search_index._map(lambda i: index.generate(vecs[i], index.nprobe, index.candidates),
                                  range(len(vecs)), threads)
        result["generate_s"][threads] = round(time.perf_counter() - t, 3)
        reference = reference or pools
        assert all(np.array_equal(a, b) for a, b in zip(pools, reference, strict=True)), "pools depend on threads"
        print(functions, threads, result["generate_s"][threads], flush=True)
    return result


def main(work: Path, out: Path, sizes: list[int]) -> dict:
    result = {"cores": len(os.sched_getaffinity(0)), "runs": [time_generation(work, n) for n in sizes]}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), [int(n) for n in sys.argv[3:]] or [1000])
