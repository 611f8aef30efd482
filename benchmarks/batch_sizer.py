"""Memory-driven micro-batch: what the sizer picks under shrinking budgets, what it costs to
find out (probes in child processes), and the peak and speed of the chosen split against the
configured one, on the same effective batch (MiniLM, LoRA r=16, full-length batches).

    python -m benchmarks.batch_sizer --effective 16 --doc-len 64
"""

from __future__ import annotations

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # first: MLX's CPU BLAS is chosen when mlx.core loads (mlxio.runtime)

import argparse
import os
import time

from benchmarks.memory_features import child
from mlxio.run import batch_sizer

MB = 1024 * 1024


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--effective", type=int, default=16)
    parser.add_argument("--configured", type=int, default=4, help="the hand-set micro-batch to compare with")
    parser.add_argument("--doc-len", type=int, default=64)
    parser.add_argument("--query-len", type=int, default=32)
    args = parser.parse_args(argv)
    load_before, started = os.getloadavg(), time.perf_counter()
    spec = {"query_len": args.query_len, "doc_len": args.doc_len, "steps": 1}
    seen: dict[int, batch_sizer.Probe] = {}

    def probe(spec, micro):
        if micro not in seen:
            seen[micro] = batch_sizer.run_probe(spec, micro)
        return seen[micro]

    tic = time.perf_counter()
    roomy = batch_sizer.plan_micro_batch(spec, args.effective, 64 * 1024 * MB, max_micro=args.effective,
                                         min_micro=2, probe=probe)
    plans = [{"budget_mb": None, "micro_batch": roomy.micro_batch, "accum": roomy.accum,
              "planning_s": time.perf_counter() - tic, "probes": len(seen)}]
    full = roomy.predicted_peak(args.effective)
    for share in (0.75, 0.5):  # budgets below what the whole batch at once needs
        budget = int(full * share / 0.9)
        tic = time.perf_counter()
        plan = batch_sizer.plan_micro_batch(spec, args.effective, budget, max_micro=args.effective, min_micro=2,
                                            probe=probe)
        plans.append({"budget_mb": budget / MB, "micro_batch": plan.micro_batch, "accum": plan.accum,
                      "predicted_peak_mb": plan.predicted_peak() / MB,
                      "probed_peak_mb": seen[plan.micro_batch].peak_bytes / MB,
                      "planning_s": time.perf_counter() - tic, "probes": len(seen)})
        print(plans[-1], flush=True)
    chosen = plans[-1]["micro_batch"]
    runs = {}
    for name, micro in (("configured", args.configured), ("sized", chosen)):
        runs[name] = child({"model": "minilm", "micro": micro, "accum": args.effective // micro, "query_len": args.query_len,
                            "doc_len": args.doc_len, "dtype": "float32", "checkpointing": False, "steps": 2,
                            "repeats": 1, "warmup": 1})
    from benchmarks.gpu_common import write

    write("batch_sizer", {
        "settings": {"effective_batch": args.effective, "query_len": args.query_len, "doc_len": args.doc_len,
                     "probe_peaks_mb": {m: p.peak_bytes / MB for m, p in sorted(seen.items())},
                     "fit": {"fixed_mb": roomy.fixed_bytes / MB, "per_sample_mb": roomy.per_sample_bytes / MB}},
        "plans": plans, "runs": runs, "load_avg_before": load_before, "load_avg_after": os.getloadavg(),
        "wall_s": time.perf_counter() - started,
    }, "cpu")


if __name__ == "__main__":
    main()
