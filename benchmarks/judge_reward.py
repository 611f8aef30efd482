"""RLAIF where no tests exist: the RLAIF recipe with reward = a verdict judge (+ format) over HTTP and
execution reward off, evaluated with the real tests, beside the same run with execution reward
(the ceiling) and with the untrained judge (the control).

Three runs of `recipes.rlaif_qwen` (the given preset and flags, the same seed), one after the
other: "execution" (rewards.execution 1, format 0.2), "trained_judge" (execution 0, format 0.2,
ai_feedback 0.5 from `mlx_lm.server --adapter-path JUDGE` read with `--teacher.scoring verdict`)
and "untrained_judge" (the same server without the adapter). "Before" is the base model with
LoRA off and the same evaluation seeds in every run, so it is evaluated once (in the first run)
and each run's after - before is paired against it. For the judge runs the training rollouts
are judged in the sandbox afterwards: the judge's AUC on the policy's own completions.

    nice python -m benchmarks.judge_reward --judge runs/rlaif_judge/adapters      # -> results/cpu/judge_reward.json
    nice python -m benchmarks.judge_reward --judge ... --work DIR --resume        # continue the runs in DIR
    nice python -m benchmarks.judge_reward --judge ... -- --train.steps 4         # flags after -- go to the recipe

One seed: a CPU-scale, single-seed figure.
"""

from __future__ import annotations

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # first: MLX's CPU BLAS is chosen when mlx.core loads (mlxio.runtime)

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common import write_result
from mlxcore.rl import verdict
from mlxcore.rl.tasks import Problem
from mlxio.rl import rollout_log
from mlxio.rl.evaluation import compare, load_problems
from mlxio.rl.execution import CodeJudge
from mlxio.rl.local_teacher import MlxLmServer
from mlxio.run.flags import parse_args
from mlxio.weights import llm
from recipes import rlaif_qwen as rq
from recipes.rlaif_config import PRESETS

RUNS = {  # name: (reward flags, serve the judge's adapter?)
    "execution": (["--rewards.execution", "1", "--rewards.ai_feedback", "0"], None),
    "trained_judge": (["--rewards.execution", "0", "--rewards.ai_feedback", "0.5"], True),
    "untrained_judge": (["--rewards.execution", "0", "--rewards.ai_feedback", "0.5"], False),
}
TEACHER = ["--teacher.scoring", "verdict", "--teacher.timeout_s", "120", "--teacher.retries", "2"]


def on_policy_auc(out: Path, cfg) -> dict | None:
    """The judge's rewards on the run's own training rollouts against the sandbox's verdicts
    (judged now: the run itself never ran the tests)."""
    rows = [r for r in rollout_log.read_rows(out) if r.get("rewards", {}).get("ai_feedback") is not None]
    if not rows:
        return None
    problems = {p.task_id: p for p in load_problems(cfg.data)[0]}
    judge = CodeJudge(workers=cfg.sandbox.workers)
    passed = judge.passed([problems.get(r["task_id"]) or Problem(task_id=r["task_id"], prompt=r["prompt"],
                                                                 entry_point="", test="") for r in rows],
                          [r["completion"] for r in rows])
    keep = [(r["rewards"]["ai_feedback"], p) for r, p in zip(rows, passed, strict=True) if p is not None]
    scores, labels = np.array([s for s, _ in keep]), np.array([p for _, p in keep], bool)
    return {"rollouts": len(keep), "pass_rate": float(labels.mean()) if len(keep) else None,
            "auc": verdict.roc_auc(scores, labels),
            "mean_reward_pass": float(scores[labels].mean()) if labels.any() else None,
            "mean_reward_fail": float(scores[~labels].mean()) if (~labels).any() else None}


def one_run(name: str, flags: list[str], serve: bool | None, args, base: Path, work: Path) -> dict:
    out = work / name
    argv = [*args.recipe, *flags, "--out_dir", str(out), "--eval.before", "true" if name == "execution" else "false"]
    t0 = time.perf_counter()
    if serve is None:
        cfg, _ = parse_args(argv, PRESETS, prog="rlaif_qwen", description="", default_preset="quick")
        results = rq.run(cfg, resume=args.resume)
    else:
        with MlxLmServer(base, adapter_path=args.judge if serve else None, log_path=work / f"{name}_server.log") as srv:
            cfg, _ = parse_args([*argv, "--teacher.url", srv.url, "--teacher.model", srv.model, *TEACHER], PRESETS,
                                prog="rlaif_qwen", description="", default_preset="quick")
            results = rq.run(cfg, resume=args.resume)
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {"cfg": cfg, "results": results, "wall_s": round(time.perf_counter() - t0, 1),
            "curves": [{k: m.get(k) for k in ("step", "reward_mean", "reward/ai_feedback", "reward/execution",
                                               "reward/format", "kl", "missing_rewards")} for m in metrics],
            "on_policy_judge": on_policy_auc(out, cfg) if serve is not None else None}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--judge", type=Path, required=True, help="the trained judge's adapters/ (recipes.rlaif_judge)")
    parser.add_argument("--base", type=Path, default=None,
                        help="the judge's base as an mlx-lm folder (default: the embedded model, imported float32)")
    parser.add_argument("--work", type=Path, default=None, help="run folders (default: a tmp dir)")
    parser.add_argument("--resume", action="store_true", help="continue the runs in --work")
    parser.add_argument("--name", default="judge_reward", help="results/cpu/<name>.json")
    parser.add_argument("recipe", nargs="*", help="flags for recipes.rlaif_qwen (after --)")
    args = parser.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="judge_reward-"))
    base = args.base or work / "base"
    if args.base is None and not (base / "config.json").is_file():
        llm.import_gguf(llm.default_gguf_path(), base, dequantize=True, dtype="float32")
    runs = {name: one_run(name, flags, serve, args, base, work) for name, (flags, serve) in RUNS.items()}
    before = runs["execution"]["results"]["eval"]
    payload = {"command": "python -m benchmarks.judge_reward " + " ".join(argv), "seeds": 1,
               "seed": runs["execution"]["cfg"].train.seed,
               "scale": "CPU (2 shared cores), one seed per reward",
               "before": "the base model (LoRA off), evaluated once in the execution run: the same model and "
                         "evaluation seeds in every run", "runs": {}}
    for name, run in runs.items():
        cfg, ev = run["cfg"], run["results"]["eval"]
        sets = {}
        for set_name, res in ev.items():
            b, a = before[set_name]["before"], res["after"]
            sets[set_name] = {"problems": a["problems"], "before": {m: b[m]["pass@1"] for m in ("sampled", "greedy")},
                              "after": {m: a[m]["pass@1"] for m in ("sampled", "greedy")},
                              "after_ci95": {m: a[m]["ci95"] for m in ("sampled", "greedy")},
                              "diff": compare(b, a, cfg.eval)}
        payload["runs"][name] = {"rewards": {"execution": cfg.rewards.execution, "format": cfg.rewards.format,
                                             "ai_feedback": cfg.rewards.ai_feedback},
                                 "teacher": RUNS[name][1], "steps": cfg.train.steps,
                                 "prompts_per_step": cfg.prompts_per_step, "group_size": cfg.group_size,
                                 "eval_samples": cfg.eval.samples, "sets": sets, "curves": run["curves"],
                                 "on_policy_judge": run["on_policy_judge"], "wall_s": run["wall_s"]}
        print(f"{name}: " + "; ".join(f"{s} sampled {v['before']['sampled']:.3f} -> {v['after']['sampled']:.3f} "
                                       f"{v['diff'].get('sampled')}" for s, v in sets.items()), flush=True)
    print(write_result(args.name, payload))


if __name__ == "__main__":
    main()
