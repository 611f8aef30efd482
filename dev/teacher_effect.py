"""What the AI-feedback teacher adds: a real teacher server (`mlx_lm server` on 127.0.0.1 serving
the embedded SmolLM2-135M-Instruct, imported float32 by `mlxio.weights.llm.import_gguf`) judged
against execution, and the RLAIF recipe run with and without its reward.

(a) Agreement with execution: the N shortest HumanEval problems, each with its canonical solution and a
    mutated one (the first of a fixed list of operator / constant / return mutations that fails
    the tests in the sandbox). The teacher scores each (rubric, "verdict" scoring: 10 * P(yes));
    execution labels them. Reported: ROC AUC of the score for pass vs fail, accuracy at 0.5,
    mean score per label; plus how often the free-text rubric ("Score: N/10") yields a score.
(b) Effect on training: `recipes.rlaif_qwen.run` for a few steps with the same seeds, without
    and with the teacher reward (weight 0.5, verdict scoring): per-step reward components,
    execution pass rate, KL, loss, step time; and the teacher's agreement with execution on the
    training rollouts themselves.

    nice python -m dev.teacher_effect                       # -> dev/results/cpu/teacher_effect.json
    nice python -m dev.teacher_effect --problems 10 --steps 2   # quicker
"""

from __future__ import annotations

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # first: MLX's CPU BLAS is chosen when mlx.core loads (mlxio.runtime)

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

import attrs
import numpy as np

from benchmarks.common import write_result
from dev import RESULTS
from mlxcore.rl.tasks import Problem
from mlxcore.rl.verdict import roc_auc
from mlxio.rl.local_teacher import MlxLmServer
from mlxio.rl.mutants import as_completion, build_pairs
from mlxio.rl.problems import load_humaneval
from mlxio.rl.review_score import parse_score
from mlxio.rl.rewards import AIFeedbackReward, ExecutionReward
from mlxio.rl.teacher import HttpJudge, rubric_messages


def agreement_stats(scores, labels) -> dict:
    scores, labels = np.asarray(scores, float), np.asarray(labels, bool)
    ok = ~np.isnan(scores)
    s, y = scores[ok], labels[ok]
    return {
        "n": int(len(scores)), "missing": int((~ok).sum()), "n_pass": int(y.sum()),
        "n_fail": int((~y).sum()),
        "auc": roc_auc(s, y),
        "accuracy_at_0.5": float(((s >= 0.5) == y).mean()) if len(s) else None,
        "mean_score_pass": float(s[y].mean()) if y.any() else None,
        "mean_score_fail": float(s[~y].mean()) if (~y).any() else None,
    }


def judge_agreement(server: MlxLmServer, problems: list[Problem], workers: int) -> dict:
    execution = ExecutionReward(workers=2)
    t0 = time.perf_counter()
    rows = build_pairs(problems, execution)
    t_exec = time.perf_counter() - t0
    by_id = {p.task_id: p for p in problems}
    judge = HttpJudge(server.url, server.model, timeout_s=120.0, scoring="verdict")
    reward = AIFeedbackReward(judge, workers=workers)
    t0 = time.perf_counter()
    scores = reward.score([by_id[r["task_id"]] for r in rows], [r["completion"] for r in rows])
    t_judge = time.perf_counter() - t0
    for r, s in zip(rows, scores, strict=True):
        r["score"] = s
    stats = agreement_stats([np.nan if s is None else s for s in scores],
                            [r["passed"] for r in rows])
    # paired view: for problems with both a passing canonical and a failing mutant
    pairs = {}
    for r in rows:
        pairs.setdefault(r["task_id"], {})[r["kind"]] = r
    paired = [(d["canonical"]["score"], d["mutant"]["score"]) for d in pairs.values()
              if "mutant" in d and d["canonical"]["passed"]
              and d["canonical"]["score"] is not None and d["mutant"]["score"] is not None]
    return {
        **stats,
        "paired_problems": len(paired),
        "paired_canonical_higher": sum(c > m for c, m in paired),
        "paired_ties": sum(c == m for c, m in paired),
        "paired_mean_diff": float(np.mean([c - m for c, m in paired])) if paired else None,
        "judge_wall_s": round(t_judge, 1), "judge_s_per_call": round(t_judge / len(rows), 2),
        "exec_wall_s": round(t_exec, 1),
        "rows": [{k: r[k] for k in ("task_id", "kind", "mutation", "passed", "score")}
                 for r in rows],
    }


def text_rubric_probe(server: MlxLmServer, problems: list[Problem], n: int,
                      max_tokens: int) -> dict:
    """How often the free-text rubric answer of this teacher holds a parseable score."""
    judge = HttpJudge(server.url, server.model, timeout_s=120.0, max_tokens=max_tokens)
    answers = []
    t0 = time.perf_counter()
    for p in problems[:n]:
        text = judge.complete(rubric_messages(p.prompt, as_completion(p, p.canonical_solution)))
        answers.append({"task_id": p.task_id, "score": parse_score(text),
                        "answer_head": (text or "")[:160]})
    return {"calls": n, "max_tokens": max_tokens,
            "with_score": sum(a["score"] is not None for a in answers),
            "wall_s": round(time.perf_counter() - t0, 1), "answers": answers}


def recipe_run(server: MlxLmServer | None, args, out: Path) -> dict:
    """Train a few steps (optionally with the teacher); per-step metrics and reward components."""
    import recipes.rlaif_qwen as rq
    from mlxcore.train.optim import OptimConfig
    from mlxio.rl import rewards
    from mlxio.rl.evaluation import EvalConfig
    from mlxio.rl.rewards import RewardConfig, TeacherConfig
    from recipes.rlaif_config import PRESETS

    base = PRESETS["quick"]
    teacher = (TeacherConfig(url=server.url, model=server.model, timeout_s=120.0,
                             scoring="verdict") if server else TeacherConfig())
    cfg = attrs.evolve(
        base, prompts_per_step=1, group_size=args.group_size, max_new_tokens=args.max_new_tokens,
        train=attrs.evolve(base.train, steps=args.steps, accum=2, checkpoint_every=args.steps, keep_checkpoints=1,
                           seed=args.seed), out_dir=str(out),
        optim=attrs.evolve(base.optim, total_steps=args.steps) if isinstance(base.optim, OptimConfig)
        else base.optim,
        rewards=attrs.evolve(base.rewards, ai_feedback=0.5 if server else 0.0)
        if isinstance(base.rewards, RewardConfig) else base.rewards,
        teacher=teacher,
        eval=attrs.evolve(base.eval, before=False, after=False) if isinstance(base.eval, EvalConfig)
        else base.eval)
    components: list[dict] = []
    original = rewards.combine_rewards  # the recipe calls it through the module: patched there

    def recording(fns, problems, completions, cache=None, *a, **kw):
        res = original(fns, problems, completions, cache, *a, **kw)
        components.append({
            "means": {k: float(np.nanmean(v)) if np.isfinite(v).any() else None
                      for k, v in res.per_reward.items()},
            "per_completion": {k: [None if not np.isfinite(x) else float(x) for x in v]
                               for k, v in res.per_reward.items()},
            "missing": int(res.missing.sum())})
        return res

    rewards.combine_rewards = recording
    t0 = time.perf_counter()
    try:
        rq.run(cfg)
    finally:
        rewards.combine_rewards = original
    wall = time.perf_counter() - t0
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()
               if line.strip()]
    steps = []
    for m, c in zip(metrics, components, strict=False):
        steps.append({"step": m["step"], "reward_mean": m["reward_mean"],
                      "reward_std": m["reward_std"], "pass_rate": m.get("pass_rate"),
                      "kl": m.get("kl"), "loss": m.get("loss"),
                      "components": c["means"], "missing_rewards": c["missing"],
                      "completion_tokens": m.get("completion_tokens"),
                      "step_s": round(m["step_s"], 1)})
    result = {"teacher": bool(server), "steps": steps, "wall_s": round(wall, 1)}
    if server:  # the teacher vs execution on the training rollouts themselves
        aif = sum((c["per_completion"].get("ai_feedback", []) for c in components), [])
        exe = sum((c["per_completion"].get("execution", []) for c in components), [])
        keep = [(a, e) for a, e in zip(aif, exe, strict=True) if a is not None and e is not None]
        result["rollout_agreement"] = agreement_stats([a for a, _ in keep],
                                                      [e == 1.0 for _, e in keep])
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--problems", type=int, default=16,
                        help="HumanEval problems for (a): the N shortest")
    parser.add_argument("--text-probe", type=int, default=2, help="free-text rubric calls")
    parser.add_argument("--text-max-tokens", type=int, default=64)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2, help="concurrent judge calls")
    parser.add_argument("--skip-training", action="store_true")
    parser.add_argument("--work", type=Path, default=None, help="scratch dir (default: a tmp dir)")
    args = parser.parse_args(argv)

    from mlxio.weights.llm import default_gguf_path, import_gguf

    t_start = time.perf_counter()
    work = args.work or Path(tempfile.mkdtemp(prefix="teacher_effect-"))
    model_dir = work / "smollm2-f32"
    if not (model_dir / "config.json").exists():
        import_gguf(default_gguf_path(), model_dir, dequantize=True, dtype="float32")
    # the shortest problems (prompt + solution): a judge call on a busy 2-core CPU is prefill-bound
    problems = sorted(load_humaneval(), key=lambda p: len(p.prompt) + len(p.canonical_solution))
    problems = problems[:args.problems]
    random.Random(args.seed).shuffle(problems)
    payload = {
        "teacher": {"server": "mlx_lm server (mlx-lm 0.32.2), 127.0.0.1",
                    "model": "SmolLM2-135M-Instruct (embedded GGUF, imported float32)",
                    "scoring": "verdict: 10 * P(yes) of a one-token Yes/No answer after the "
                               "rubric (top_logprobs 10)"},
        "settings": vars(args) | {"work": str(work)},
    }
    with MlxLmServer(model_dir, log_path=work / "server.log") as server:
        payload["command_server"] = " ".join(server.command())
        payload["agreement_humaneval"] = judge_agreement(server, problems, args.workers)
        a = payload["agreement_humaneval"]
        print(f"(a) judge vs execution on {a['n']} HumanEval solutions: AUC {a['auc']}, "
              f"acc@0.5 {a['accuracy_at_0.5']}, mean pass {a['mean_score_pass']} "
              f"fail {a['mean_score_fail']}, {a['judge_s_per_call']} s/call", flush=True)
        if args.text_probe:
            payload["text_rubric_probe"] = text_rubric_probe(server, problems, args.text_probe,
                                                             args.text_max_tokens)
            print(f"text rubric: {payload['text_rubric_probe']['with_score']} of "
                  f"{args.text_probe} answers held a score", flush=True)
        if not args.skip_training:
            runs = {}
            for name, srv in (("without_teacher", None), ("with_teacher", server)):
                runs[name] = recipe_run(srv, args, work / name)
                last = runs[name]["steps"][-1]
                print(f"(b) {name}: " + ", ".join(
                    f"step {s['step']} reward {s['reward_mean']:.3f} pass {s['pass_rate']} "
                    f"kl {s['kl']:.2e}" for s in runs[name]["steps"]) + f" ({last['step_s']} s "
                    "last step)", flush=True)
            payload["training"] = runs
    payload["wall_s"] = round(time.perf_counter() - t_start, 1)
    print(write_result("teacher_effect", payload, root=RESULTS))


if __name__ == "__main__":
    main()
