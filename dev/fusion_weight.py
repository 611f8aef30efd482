"""How the hybrid's fusion weight is chosen on dev queries, measured offline (issue 17).

Two steps:

  dump     re-create a finished `recipes.xtr_lora` run's held-out tasks (test AND dev queries of
           held-out files and held-out packages) from its config.json, score them with the
           untrained encoder and with the run's exported model (`merged/`), and write every
           query's rank of its positive under BM25 fusion at each weight of GRID
           (dev/results/<machine>/fusion_ranks_<name>.json: small, committed).
  analyse  every weight-choice rule of `RULES` on those ranks: what it picks on the run's own dev
           queries and the test hybrid-minus-semantic MRR@10 at that pick, plus the same over
           `--splits` random re-splits of each task's dev + test queries into dev / test of the
           run's sizes (what the rule does in expectation, and how often hybrid trails semantic);
           and the test-only curves of eval.json files given with --eval (runs whose dev ranks
           were not kept: which weights would have been safe). Writes
           dev/results/<machine>/fusion_weight.json.

    # the CPU default run (make train of session 5; its cache holds the mined sources)
    nice -n 10 python dev/fusion_weight.py dump --run /tmp/qs5/runs/xtr_lora --name cpu_quick_s0
    # two session-4 quick runs (same tasks; only their fine-tuned model differs)
    nice -n 10 python dev/fusion_weight.py dump --run /tmp/qs/runs/xtr_lora \
        --cache_dir /tmp/qs5/runs/.cache --name cpu_quick_s0_session4_default --models fine-tuned
    nice -n 10 python dev/fusion_weight.py dump --run /tmp/retr4/after \
        --cache_dir /tmp/qs5/runs/.cache --name cpu_quick_s0_session4_hn --models fine-tuned
    python dev/fusion_weight.py analyse --splits 2000 --dev_sizes 400 --eval \
        /tmp/h100full/full_s{0,1,2}_inbatch/eval.json /tmp/h100full/full_s0_hn/eval.json

A run on another machine: `dump --machine h100 ...`, then `analyse --machine h100`.
"""

from __future__ import annotations

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # first: MLX's CPU BLAS is chosen when mlx.core loads (mlxio.runtime)

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import write_result  # noqa: E402
from dev import RESULTS  # noqa: E402
from mlxcore.retrieval import ranking  # noqa: E402

# weights stored per query: the recipe's candidates, 1.0 (semantic alone) and a few between
GRID = tuple(sorted({*ranking.ALPHAS, 0.85, 0.93, 1.0}))
K = 10  # MRR@K


def positive_ranks_at(semantic: np.ndarray, bm25: np.ndarray, positives: np.ndarray) -> dict[str, list[int]]:
    """{"%g" % alpha: rank of each query's positive (1-based) under `interpolate` at alpha} for GRID."""
    return {f"{a:g}": ranking.positive_ranks(ranking.interpolate(semantic, bm25, a), positives).tolist()
            for a in GRID}


def dump(args) -> int:
    import attrs
    import mlx.core as mx

    from mlxio.data import xtr_data
    from mlxio.run import config as run_config
    from mlxio.search import embeddings
    from mlxio.weights.encoders import default_encoder_path, load_encoder
    from recipes.xtr_lora_config import Config

    run = args.run
    raw = json.loads((run / "config.json").read_text())
    cfg = run_config.from_dict({k: v for k, v in raw.items() if k in {f.name for f in attrs.fields(Config)}},
                               Config, source=str(run / "config.json"))
    evaluated = json.loads((run / "eval.json").read_text())
    cache_dir = args.cache_dir or (run.parent / ".cache")
    data = xtr_data.load_data(cfg.data, cache_dir, cfg.train.seed)
    tasks = {"heldout_files": data.task, "heldout_packages": data.package_task}
    out = {"run": str(run), "command": evaluated.get("run", {}).get("command"), "seed": cfg.train.seed,
           "grid": list(GRID), "k": K, "models": {}}
    for model_name, path in (("untrained", default_encoder_path()), ("fine-tuned", run / "merged")):
        if model_name not in args.models.split(","):
            continue
        enc = load_encoder(path)
        model = {}
        for task_name, task in tasks.items():
            if task is None:
                continue
            started = time.perf_counter()
            texts = list(task.queries + task.dev_queries)
            q = embeddings.embed_texts(enc.params, enc.spec, enc.tokenizer, texts, cfg.data.max_query_len,
                                       cfg.train.eval_batch, desc=f"{model_name} {task_name} queries")
            d = embeddings.embed_texts(enc.params, enc.spec, enc.tokenizer, list(task.candidates),
                                       cfg.data.max_doc_len, cfg.train.eval_batch,
                                       desc=f"{model_name} {task_name} documents")
            semantic = embeddings.maxsim_matrix(q, d)
            bm25 = ranking.bm25_text_matrix(texts, list(task.candidates))
            n = len(task.queries)
            model[task_name] = {
                "test": positive_ranks_at(semantic[:n], bm25[:n], task.positives),
                "dev": positive_ranks_at(semantic[n:], bm25[n:], task.dev_positives),
                "queries": n, "dev_queries": len(task.dev_queries), "candidates": len(task.candidates),
                "seconds": round(time.perf_counter() - started, 1),
            }
            # the reproduction check: semantic test MRR@10 as the run's eval.json has it
            block = evaluated.get(model_name) if task_name == "heldout_files" else \
                evaluated.get("heldout_packages", {}).get(model_name)
            model[task_name]["eval_json_semantic_mrr@10"] = block["semantic"]["mrr@10"] if block else None
            model[task_name]["semantic_mrr@10"] = float(mrr(np.asarray(model[task_name]["test"]["1"])))
            print(f"{model_name} {task_name}: semantic MRR@10 {model[task_name]['semantic_mrr@10']:.4f} "
                  f"(eval.json {model[task_name]['eval_json_semantic_mrr@10']}), {model[task_name]['seconds']} s",
                  flush=True)
        out["models"][model_name] = model
        del enc
        mx.clear_cache()
    path = write_result(f"fusion_ranks_{args.name}", out, args.machine, RESULTS)
    print(path)
    return 0


def mrr(ranks: np.ndarray) -> np.ndarray:
    """Mean reciprocal rank @K over the last axis of int ranks [..., n]."""
    return np.where(ranks <= K, 1.0 / ranks, 0.0).mean(axis=-1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="step", required=True)
    d = sub.add_parser("dump")
    d.add_argument("--run", type=Path, required=True, help="a finished recipes.xtr_lora out_dir (config, eval, merged/)")
    d.add_argument("--cache_dir", type=Path, help="its cache (default RUN/../.cache)")
    d.add_argument("--name", required=True)
    d.add_argument("--machine", default="cpu")
    d.add_argument("--models", default="untrained,fine-tuned", help="comma list of untrained, fine-tuned")
    a = sub.add_parser("analyse")
    a.add_argument("--machine", default="cpu")
    a.add_argument("--ranks", nargs="*", type=Path, help="fusion_ranks_*.json (default: all under results/MACHINE)")
    a.add_argument("--eval", nargs="*", type=Path, default=[], help="eval.json files: test-only curves")
    a.add_argument("--splits", type=int, default=2000)
    a.add_argument("--dev_sizes", type=lambda s: [int(x) for x in s.split(",") if x], default=[],
                   help="also re-split with this many dev queries per task (comma list)")
    args = parser.parse_args(argv)
    return dump(args) if args.step == "dump" else analyse(args)


# the rules compared: (candidate weights, standard-error multiple of `ranking.one_se_choice`)
RULES = {
    "argmax_0.3-0.99 (the rule before)": (tuple(a for a in ranking.ALPHAS if a < 1), 0.0),
    "argmax_with_1.0": (ranking.ALPHAS, 0.0),
    "one_se_0.5_with_1.0": (ranking.ALPHAS, 0.5),
    "one_se_with_1.0 (chosen)": (ranking.ALPHAS, 1.0),
    "one_se_2_with_1.0": (ranking.ALPHAS, 2.0),
    "one_se_0.3-0.99": (tuple(a for a in ranking.ALPHAS if a < 1), 1.0),
}


def rr_matrix(ranks: dict[str, list[int]], alphas: tuple[float, ...]) -> np.ndarray:
    """Reciprocal ranks @K float [len(alphas), n_queries] from a dump's {"%g" % alpha: ranks}."""
    r = np.asarray([ranks[f"{a:g}"] for a in alphas], np.float64)
    return np.where(r <= K, 1.0 / r, 0.0)


def pick(rule: str, dev: list[np.ndarray]) -> float:
    """The weight `rule` picks from per-task dev reciprocal ranks over GRID ([len(GRID), n])."""
    alphas, se_multiple = RULES[rule]
    rows = [GRID.index(a) for a in alphas]
    return alphas[ranking.one_se_choice([r[rows] for r in dev], se_multiple)]


def rule_table(dev: list[np.ndarray], test: list[np.ndarray], tasks: list[str]) -> dict:
    """Per rule: its pick on `dev` and the test MRR@K of hybrid minus semantic per task."""
    out = {}
    for rule in RULES:
        a = pick(rule, dev)
        i, sem = GRID.index(a), GRID.index(1.0)
        out[rule] = {"alpha": a, **{f"{t}_hybrid_minus_semantic": round(float(r[i].mean() - r[sem].mean()), 4)
                                    for t, r in zip(tasks, test, strict=True)}}
    best = [int(np.argmax(np.mean([r.mean(1) for r in test], axis=0)))]
    out["oracle (best on test, both tasks)"] = {"alpha": GRID[best[0]], **{
        f"{t}_hybrid_minus_semantic": round(float(r[best[0]].mean() - r[GRID.index(1.0)].mean()), 4)
        for t, r in zip(tasks, test, strict=True)}}
    return out


def resampled(pooled: list[np.ndarray], n_dev: list[int], splits: int, seed: int = 0) -> dict:
    """Each rule over `splits` random re-splits of every task's pooled (dev + test) queries into
    n_dev dev queries and the rest test: mean pick, mean test hybrid-minus-semantic per task,
    how often hybrid trails semantic on a task (by any amount / by more than 0.005)."""
    rng = np.random.default_rng(seed)
    sem = GRID.index(1.0)
    picks = {rule: [] for rule in RULES}
    gains = {rule: [] for rule in RULES}
    for _ in range(splits):
        dev, test = [], []
        for r, n in zip(pooled, n_dev, strict=True):
            order = rng.permutation(r.shape[1])
            dev.append(r[:, order[:n]])
            test.append(r[:, order[n:]])
        test_gain = np.stack([t.mean(1) - t[sem].mean() for t in test])  # [tasks, GRID]
        for rule in RULES:
            a = pick(rule, dev)
            picks[rule].append(a)
            gains[rule].append(test_gain[:, GRID.index(a)])
    out = {}
    for rule in RULES:
        g = np.asarray(gains[rule])  # [splits, tasks]
        values, counts = np.unique(picks[rule], return_counts=True)
        out[rule] = {
            "picks": {f"{v:g}": int(c) for v, c in zip(values, counts, strict=True)},
            "mean_hybrid_minus_semantic": [round(float(x), 4) for x in g.mean(0)],
            "share_hybrid_below_semantic": [round(float(x), 3) for x in (g < -1e-12).mean(0)],
            "share_hybrid_below_semantic_by_0.005": [round(float(x), 3) for x in (g < -0.005).mean(0)],
            "share_any_task_below_semantic": round(float((g < -1e-12).any(1).mean()), 3),
        }
    return out


def analyse(args) -> int:
    paths = args.ranks or sorted((RESULTS / args.machine).glob("fusion_ranks_*.json"))
    runs = {}
    for path in paths:
        dumped = json.loads(path.read_text())
        for model_name, model in dumped["models"].items():
            tasks = list(model)
            dev = [rr_matrix(model[t]["dev"], GRID) for t in tasks]
            test = [rr_matrix(model[t]["test"], GRID) for t in tasks]
            pooled = [np.concatenate([d, t], axis=1) for d, t in zip(dev, test, strict=True)]
            n_dev = [d.shape[1] for d in dev]
            entry = {"tasks": tasks, "dev_queries": n_dev, "test_queries": [t.shape[1] for t in test],
                     "test_semantic_mrr@10": [round(float(t[GRID.index(1.0)].mean()), 4) for t in test],
                     "dev_curve": {f"{a:g}": [round(float(d[i].mean()), 4) for d in dev] for i, a in enumerate(GRID)},
                     "test_curve_minus_semantic": {f"{a:g}": [round(float(t[i].mean() - t[GRID.index(1.0)].mean()), 4)
                                                              for t in test] for i, a in enumerate(GRID)},
                     "this_split": rule_table(dev, test, tasks),
                     f"resampled_{args.splits}": resampled(pooled, n_dev, args.splits)}
            for extra in args.dev_sizes:  # more dev queries, fewer test ones (same pools)
                entry[f"resampled_{args.splits}_dev_{extra}"] = resampled(
                    pooled, [min(extra, p.shape[1] - 100) for p in pooled], args.splits, seed=1)
            runs[f"{dumped['run']} ({path.name}): {model_name}"] = entry
            print(f"{path.name} {model_name}: this split", json.dumps(entry["this_split"]), flush=True)
            for rule, r in entry[f"resampled_{args.splits}"].items():
                print(f"  {rule:38s} mean gain {r['mean_hybrid_minus_semantic']} below {r['share_hybrid_below_semantic']}"
                      f" any {r['share_any_task_below_semantic']} picks {r['picks']}", flush=True)
    test_only = {}
    for path in args.eval:  # eval.json files: the test curve of each task and what each run chose
        results = json.loads(path.read_text())
        for task, block in (("heldout_files", results.get("fine-tuned")),
                            ("heldout_packages", results.get("heldout_packages", {}).get("fine-tuned"))):
            if not block or "fusion" not in block:
                continue
            sem = block["semantic"]["mrr@10"]
            test_only[f"{path} {task}"] = {
                "command": results.get("run", {}).get("command"), "chosen": block.get("hybrid_fusion"),
                "semantic_mrr@10": round(sem, 4),
                "minus_semantic": {k: round(v["mrr@10"] - sem, 4) for k, v in block["fusion"].items()}}
    payload = {"command": " ".join(["python", "dev/fusion_weight.py", *sys.argv[1:]]), "grid": list(GRID),
               "rules": {k: {"alphas": list(v[0]), "se_multiple": v[1]} for k, v in RULES.items()},
               "runs": runs, "test_only_curves": test_only}
    print(write_result("fusion_weight", payload, args.machine, RESULTS))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
