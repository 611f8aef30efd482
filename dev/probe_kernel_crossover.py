"""Where `index_scoring.probe_estimate`'s two paths cross: the gathered one (`np.maximum.at`, a few
NumPy calls per query) against one assignment per probed list, on synthetic inverted lists of
POSTINGS documents each (1,024 lists), 24 query tokens x 8 probes, one core. Sets
`index_scoring.GATHER_MAX_POSTINGS` (its comment quotes this).

    PYTHONPATH=. python -m dev.probe_kernel_crossover dev/results/cpu/probe_kernel_crossover.json
"""

from __future__ import annotations

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # first: MLX's CPU BLAS is chosen when mlx.core loads (mlxio.runtime)

import json
import sys
import time
from pathlib import Path

import numpy as np

from mlxcore.retrieval import index_scoring

POSTINGS = (30, 100, 300, 1000, 3000)
DOCUMENTS = (5000, 50000)
LISTS, TOKENS, PROBES, QUERIES = 1024, 24, 8, 30


def time_paths(n_docs: int, per_list: int, seed: int = 0) -> dict:
    """{"gathered_ms", "assigned_ms"}: mean per query of each path (the same bits, checked)."""
    rng = np.random.default_rng(seed)
    indptr = np.arange(LISTS + 1, dtype=np.int64) * per_list
    blocks = [np.sort(rng.choice(n_docs, per_list, replace=False)) for _ in range(64)]
    docs = np.resize(np.concatenate(blocks).astype(np.int32), int(indptr[-1]))  # each list sorted, unique
    queries = [(rng.choice(LISTS, (TOKENS, PROBES)), rng.uniform(0, 1, (TOKENS, PROBES)).astype(np.float32))
               for _ in range(QUERIES)]
    out, results = {}, {}
    for name, limit in (("gathered_ms", 1 << 30), ("assigned_ms", -1)):
        index_scoring.GATHER_MAX_POSTINGS = limit
        t = time.perf_counter()
        results[name] = [index_scoring.probe_estimate(indptr, docs, n_docs, p, s) for p, s in queries]
        out[name] = round((time.perf_counter() - t) / QUERIES * 1e3, 3)
    same = all(np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
               for a, b in zip(results["gathered_ms"], results["assigned_ms"], strict=True))
    assert same, "the two paths differ"
    return {"documents": n_docs, "postings_per_list": per_list, **out}


def main(out: Path) -> dict:
    default = index_scoring.GATHER_MAX_POSTINGS
    try:
        result = {"lists": LISTS, "tokens": TOKENS, "probes": PROBES, "queries": QUERIES,
                  "runs": [time_paths(n, p) for n in DOCUMENTS for p in POSTINGS]}
    finally:
        index_scoring.GATHER_MAX_POSTINGS = default
    for r in result["runs"]:
        print(r, flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main(Path(sys.argv[1]))
