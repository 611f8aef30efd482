"""How many worker threads batched and single-query search want on a many-core host: times
`Index.search_many` (300 queries) and `Index.search` (p50 of 50 queries) on the 1,000-function
stdlib index of `benchmarks.search_batch` with `maxsim_many`'s workers forced to 1..16.

    PYTHONPATH=. python -m dev.search_workers /tmp/search_batch dev/results/<machine>/search_workers.json
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
from mlxio.search.index import Index


def main(work: Path, out: Path) -> dict:
    from mlxio.search.searcher import Searcher

    index_dir, queries_path, _ = prepare(work, 1000)
    texts = [json.loads(line)["query"] for line in queries_path.read_text().splitlines()]
    searcher = Searcher(index_dir)
    index = searcher.index
    vecs = [v.astype(np.float32) for v in searcher.embedder.embed(texts)]
    original = Index.maxsim_many
    result: dict = {"cores": len(os.sched_getaffinity(0)), "search_many_300_s": {}, "single_p50_ms": {}}
    reference = None
    for workers in (1, 2, 4, 8, 16):
        Index.maxsim_many = lambda self, *a, _w=workers, **k: original(self, *a, **{**k, "workers": _w})
        t = time.perf_counter()
        many = index.search_many(texts[:300], vecs[:300], "semantic")
        result["search_many_300_s"][workers] = round(time.perf_counter() - t, 3)
        reference = reference or many
        assert many == reference, "results depend on the worker count"
        times = []
        for text, v in zip(texts[:51], vecs[:51], strict=True):
            t = time.perf_counter()
            index.search(text, v, "semantic")
            times.append((time.perf_counter() - t) * 1e3)
        result["single_p50_ms"][workers] = round(float(np.median(times[1:])), 2)
        print(workers, result["search_many_300_s"][workers], result["single_p50_ms"][workers], flush=True)
    Index.maxsim_many = original
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
