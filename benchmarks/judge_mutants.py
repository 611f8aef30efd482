"""Verdict judges on HumanEval canonical vs mutant solutions: ROC AUC of the verdict score with a
95% bootstrap interval over problems, for the untrained judge (the base, LoRA off) and each
trained judge's adapters (e.g. the three of benchmarks.rlaif_arms, one per judge-training seed),
scored as the RLAIF reward scores them (`mlxio.rl.verdict_reward`).

The pairs are `benchmarks.judge_auc`'s: the `--humaneval` shortest HumanEval problems (shuffled
by seed 0), each canonical solution (passes its tests in the sandbox) beside its first failing
mutant (`mlxio.rl.mutants`).

    python -m benchmarks.judge_mutants --adapters /tmp/arms/judge_s0/adapters ... --machine cpu
"""

from __future__ import annotations

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # first: MLX's CPU BLAS is chosen when mlx.core loads (mlxio.runtime)

import argparse
import random
import sys

import numpy as np

from benchmarks.common import write_result
from mlxcore.rl import verdict
from mlxio.rl.verdict_reward import UNTRAINED, VerdictJudgeReward


def pairs(n: int, seed: int = 0, workers: int = 2) -> tuple[list, list[str], np.ndarray, np.ndarray]:
    """(problems, completions, passed [N] bool, groups [N]) of `n` problems' canonical / mutant pairs."""
    from mlxio.rl.mutants import build_pairs
    from mlxio.rl.problems import load_humaneval
    from mlxio.rl.rewards import ExecutionReward

    problems = sorted(load_humaneval(), key=lambda p: len(p.prompt) + len(p.canonical_solution))[:n]
    random.Random(seed).shuffle(problems)
    by_id = {p.task_id: p for p in problems}
    rows = build_pairs(problems, ExecutionReward(workers=workers))
    return ([by_id[r["task_id"]] for r in rows], [r["completion"] for r in rows],
            np.array([r["passed"] for r in rows], bool), np.array([r["task_id"] for r in rows], object))


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--adapters", nargs="+", required=True, help="trained judges' adapters/ folders")
    ap.add_argument("--humaneval", type=int, default=16, help="HumanEval problems (shortest first)")
    ap.add_argument("--resamples", type=int, default=10_000)
    ap.add_argument("--machine", default="cpu")
    ap.add_argument("--name", default="judge_mutants")
    args = ap.parse_args(argv)
    problems, completions, labels, groups = pairs(args.humaneval)
    judges = {"untrained": UNTRAINED, **{f"trained_{i}": a for i, a in enumerate(args.adapters)}}
    scores = {name: VerdictJudgeReward(a).scores(problems, completions) for name, a in judges.items()}
    boot = verdict.auc_bootstrap(scores, labels, groups, resamples=args.resamples, seed=0)
    sets = {name: {"adapters": judges[name], "auc": verdict.roc_auc(s, labels),
                   "ci95": None if (ci := verdict.interval(boot[name])) is None else list(ci)}
            for name, s in scores.items()}
    for name, r in sets.items():
        print(f"{name}: AUC {r['auc']:.3f} {r['ci95']}", flush=True)
    print(write_result(args.name, {"command": "python -m benchmarks.judge_mutants " + " ".join(argv),
                                   "pairs": int(len(labels)), "problems": int(len(set(groups.tolist()))),
                                   "n_pass": int(labels.sum()), "judges": sets}, args.machine))


if __name__ == "__main__":
    main()
