"""Does the verdict judge carry signal? The untrained judge (the base model, LoRA off) beside the
trained one (`recipes.rlaif_judge`) on the same held-out completions, by ROC AUC of the verdict
score (P(yes) + P(neither) / 2) for pass vs fail, with 95% bootstrap intervals over problems.

Sets: the recipe's held-out instances (other problems of the training templates) and held-out
family (never trained on), and the HumanEval canonical / mutant pairs of
`mlxio.rl.mutants` (where the untrained judge served over HTTP scored AUC 0.49:
dev/results/cpu/teacher_effect.json). Then
the trained adapters are served by a real `mlx_lm.server --adapter-path` and a sample of the
held-out completions is scored over HTTP (`HttpJudge(scoring="verdict")`, what the RLAIF recipe's
teacher reads), beside the in-process scores of the same completions.

    nice python -m benchmarks.judge_auc                  # the quick preset -> results/cpu/judge_auc.json
    nice python -m benchmarks.judge_auc --work DIR --resume   # continue a run in DIR (its samples kept)
    nice python -m benchmarks.judge_auc --preset smoke --served 4 --humaneval 2 --name judge_auc_smoke

Any other flag goes to the recipe (`--lora_layers 4`, `--train.steps 300`, ...). One training run
and one sampling seed: a CPU-scale, single-seed figure.
"""

from __future__ import annotations

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # first: MLX's CPU BLAS is chosen when mlx.core loads (mlxio.runtime)

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks import rlaif_parts
from benchmarks.common import ci, load, write_result
from mlxcore.rl import policy as pg
from mlxcore.rl import verdict
from mlxio.rl import rollout_log, verifier
from mlxio.run import checkpoint
from mlxio.run.flags import parse_args
from mlxio.weights import llm, llm_lora
from recipes import rlaif_judge as rj
from recipes.rlaif_judge_config import PRESETS

TARGET = 0.75


def humaneval_pairs(cfg, out: Path, n: int, seed: int) -> dict:
    """The teacher_effect set: the `n` shortest HumanEval problems, canonical solution (passes)
    and first failing mutant each, scored in-process by the untrained and the trained judge."""
    from mlxio.rl.mutants import build_pairs
    from mlxio.rl.problems import load_humaneval
    from mlxio.rl.rewards import ExecutionReward

    problems = sorted(load_humaneval(), key=lambda p: len(p.prompt) + len(p.canonical_solution))[:n]
    random.Random(seed).shuffle(problems)
    by_id = {p.task_id: p for p in problems}
    rows = build_pairs(problems, ExecutionReward(workers=cfg.sandbox.workers))
    judged = [rollout_log.Judged(task_id=r["task_id"], prompt=by_id[r["task_id"]].prompt, completion=r["completion"],
                                 passed=r["passed"]) for r in rows]
    policy = rlaif_parts.judge_policy(cfg)
    params = checkpoint.load_latest(out)[1]["trainable"]
    cut = len(policy.model.layers) - (cfg.lora_layers or len(policy.model.layers))
    data = verifier.with_states(verifier.encode(policy.tokenizer, judged, cfg.data.max_tokens),
                                llm_lora.trunk(policy.model, cut), cfg.eval.batch)
    answers = verifier.answer_ids(policy.tokenizer)
    logits = llm_lora.last_logits(policy.model, cut)
    probs = {label: verifier.answer_probs(logits, tree, data, answers, cfg.eval.batch)
             for label, tree in (("untrained", pg.reference_params(params)), ("trained", params))}
    return verifier.auc_report(probs, data, cfg.eval.resamples)


def served_check(cfg, out: Path, work: Path, per_set: int, seed: int) -> dict:
    """A sample of `per_set` held-out completions per set scored by `mlx_lm.server` serving the
    adapters, beside the recipe's in-process trained scores (eval_rows.jsonl)."""
    from mlxio.rl.local_teacher import MlxLmServer
    from mlxio.rl.teacher import HttpJudge

    rows = [json.loads(line) for line in (out / "eval_rows.jsonl").read_text().splitlines()]
    rng = random.Random(seed)
    picked = []
    for name in rollout_log.HELDOUT_SETS:
        of_set = [r for r in rows if r["set"] == name]
        picked += rng.sample(of_set, min(per_set, len(of_set)))
    base = Path(cfg.model) if cfg.model else work / "base"
    if cfg.model is None and not (base / "config.json").is_file():
        llm.import_gguf(llm.default_gguf_path(), base, dequantize=cfg.dequantize, dtype="float32")
    t0 = time.perf_counter()
    with MlxLmServer(base, adapter_path=out / "adapters", log_path=work / "server.log") as server:
        judge = HttpJudge(server.url, server.model, timeout_s=120.0, scoring="verdict")
        served = [judge.judge(r["prompt"], r["completion"]) for r in picked]
        command = " ".join(server.command())
    ok = [(s / 10, r) for s, r in zip(served, picked, strict=True) if s is not None]
    diffs = np.array([abs(s - r["trained"]) for s, r in ok])
    labels = np.array([r["passed"] for _, r in ok], bool)
    return {"command_server": command, "rows": len(picked), "missing": len(picked) - len(ok),
            "max_abs_diff": float(diffs.max()) if len(ok) else None,
            "mean_abs_diff": float(diffs.mean()) if len(ok) else None,
            "auc_served": verdict.roc_auc(np.array([s for s, _ in ok]), labels),
            "auc_in_process": verdict.roc_auc(np.array([r["trained"] for _, r in ok]), labels),
            "s_per_call": round((time.perf_counter() - t0) / max(len(picked), 1), 2)}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=None, help="run folder parent (default: a tmp dir)")
    parser.add_argument("--resume", action="store_true", help="continue the run in --work (its samples kept)")
    parser.add_argument("--served", type=int, default=16, help="held-out completions per set scored over HTTP")
    parser.add_argument("--humaneval", type=int, default=16, help="HumanEval problems of the mutant pairs (0: none)")
    parser.add_argument("--name", default="judge_auc", help="results/cpu/<name>.json")
    args, rest = parser.parse_known_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="judge_auc-"))
    cfg, _ = parse_args([*rest, "--out_dir", str(work / "run")], PRESETS, prog="python -m benchmarks.judge_auc",
                        description=__doc__, default_preset="quick")
    t0 = time.perf_counter()
    results = rj.run(cfg, resume=args.resume, command="python -m benchmarks.judge_auc " + " ".join(argv))
    out = Path(cfg.out_dir)
    payload = {"command": "python -m benchmarks.judge_auc " + " ".join(argv),
               "seeds": 1, "train_seed": cfg.train.seed, "sample_seed": cfg.sample.seed,
               "scale": "CPU (2 shared cores), one training run, one sampling seed",
               "score": "P(yes) + P(neither) / 2 of the first answer token (the served verdict score / 10)",
               "target_auc": TARGET, "data": results["data"], "sets": results["eval"],
               "recipe_wall_s": round(time.perf_counter() - t0, 1), "config": results["config"]}
    if args.humaneval:
        payload["sets"]["humaneval_mutants"] = humaneval_pairs(cfg, out, args.humaneval, cfg.sample.seed)
    payload["target_met"] = {name: entry.get("trained", {}).get("auc") is not None
                             and entry["trained"]["auc"] >= TARGET for name, entry in payload["sets"].items()}
    for name, entry in payload["sets"].items():
        print(f"{name}: AUC untrained {entry.get('untrained', {}).get('auc')}, "
              f"trained {entry.get('trained', {}).get('auc')} {entry.get('trained', {}).get('ci95')}", flush=True)
    if args.served:
        payload["served"] = served_check(cfg, out, work, args.served, cfg.sample.seed)
        print(f"served: {payload['served']}", flush=True)
    payload["wall_s"] = round(time.perf_counter() - t0, 1)
    print(write_result(args.name, payload))


def results_section() -> list[str]:
    """Does the verdict judge carry signal? (cpu/judge_auc.json: untrained beside trained)."""
    r = load("cpu", "judge_auc")
    if not r:
        return []
    names = {"heldout": "held-out instances", "heldout_family": "held-out family",
             "humaneval_mutants": "HumanEval canonical vs mutant"}
    out = [f"### Verdict judge: ROC AUC of P(yes), pass vs fail (cpu, {r['seeds']} seed; benchmarks/judge_auc.py, "
           "its exact command in benchmarks/results/cpu/judge_auc.json)", "",
           "| held-out set | completions (pass) / problems | untrained | trained | trained - untrained |",
           "|---|---|---|---|---|"]
    for name, e in r["sets"].items():
        if "trained" not in e:
            continue
        u, t = e["untrained"], e["trained"]
        out.append(f"| {names.get(name, name)} | {e['n']} ({e['n_pass']}) / {e['problems']} | {u['auc']:.3f} "
                   f"{ci(u['ci95'])} | {t['auc']:.3f} {ci(t['ci95'])} | {e['diff']['auc']:+.3f} {ci(e['diff']['ci95'])} |")
    served = r.get("served")
    note = (f" Served by `mlx_lm.server --adapter-path` and read by `HttpJudge(scoring=\"verdict\")`, {served['rows']} "
            f"held-out completions score within {served['max_abs_diff']:.1e} of the in-process score."
            if served and served.get("max_abs_diff") is not None else "")
    return out + ["", f"Target AUC >= {r['target_auc']}. {r['scale']}: the intervals (bootstrap over problems) "
                  f"cover the choice of problems, not the run's own variance.{note}", ""]


def readme_section() -> list[str]:
    """The README's line on the AI-feedback judge (cpu/judge_auc.json): its ROC AUC untrained -> trained
    on the held-out sets."""
    out = []
    j = load("cpu", "judge_auc")
    if j:
        sets = j["sets"]
        auc = {name: (sets[name]["untrained"]["auc"], sets[name]["trained"]["auc"])
               for name in ("heldout", "heldout_family") if name in sets}
        out += ["**AI feedback** (`python -m recipes.rlaif_judge`, then `python -m benchmarks.judge_auc`): the "
                "embedded model as a Yes/No judge of code, ROC AUC of P(yes) for passing vs failing completions, "
                "untrained -> trained on the sandbox's verdicts: "
                + "; ".join(f"{label} {auc[name][0]:.2f} -> {auc[name][1]:.2f}"
                            for name, label in (("heldout", "held-out instances"),
                                                ("heldout_family", "held-out family")) if name in auc)
                + f" ({j['seeds']} training run on a 2-core CPU; intervals in docs/performance.md).", ""]
    return out


if __name__ == "__main__":
    main()
