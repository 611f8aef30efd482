"""Retriever transfer to unseen packages: run `recipes.xtr_lora` with and without hard negatives
and record one entry per run in benchmarks/results/<machine>/xtr_heldout_packages.json.

    python benchmarks/xtr_heldout_packages.py --preset quick                 # both variants
    python benchmarks/xtr_heldout_packages.py --preset quick --variants hn   # hard negatives only
    python benchmarks/xtr_heldout_packages.py --preset quick -- --train.steps 20   # extra recipe flags

Each run is a subprocess (its wall time is the whole recipe: mining or cache reads, baselines,
training, evaluation); the entry is read from the run's eval.json, never assembled by hand.
An entry replaces an earlier one with the same preset, hard_negatives and command.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def metrics(block: dict) -> dict:
    return {mode: {k: block[mode][k] for k in ("mrr@10", "p@1")} for mode in ("semantic", "hybrid")} | {
        "hybrid_fusion": block.get("hybrid_fusion")}


def entry(preset: str, hard: bool, command: list[str], wall_s: float, results: dict) -> dict:
    data = results.get("data", {})
    sources = data.get("sources", [])
    pkg = results.get("heldout_packages", {})
    train_sources = [f"{s['name']}=={s['version']}" if s.get("version") else s["name"]
                     for s in sources if s.get("role", "").startswith("train")]
    return {
        "preset": preset,
        "train_sources": train_sources,
        "heldout_packages": [f"{s['name']}=={s['version']}" for s in sources if s.get("role") == "heldout_package"],
        "queries": pkg.get("queries"),
        "candidates": pkg.get("candidates"),
        "bm25": {k: pkg["bm25"][k] for k in ("mrr@10", "p@1")} if pkg else None,
        "untrained": metrics(pkg["untrained"]) if pkg else None,
        "fine_tuned": metrics(pkg["fine-tuned"]) if pkg else None,
        "heldout_files": {"queries": results["run"]["queries"], "candidates": results["run"]["candidates"],
                          "bm25": {k: results["bm25"][k] for k in ("mrr@10", "p@1")},
                          "untrained": metrics(results["untrained"]), "fine_tuned": metrics(results["fine-tuned"])},
        "hard_negatives": hard,
        "hard_negative_counts": data.get("hard_negatives"),
        "train_pairs": data.get("train_pairs"),
        "train_queries_dropped_as_eval_queries": data.get("train_queries_dropped_as_eval_queries"),
        "cross_source_duplicates": data.get("cross_source_duplicates"),
        "sources": sources,
        "steps": results["run"]["steps"],
        "train_s": results["run"]["train_s"],
        "command": " ".join(shlex.quote(c) for c in command),
        "wall_s": wall_s,
    }


def record(path: Path, new: dict) -> None:
    rows = json.loads(path.read_text()) if path.exists() else []
    rows = [r for r in rows if (r["preset"], r["hard_negatives"], r["command"]) !=
            (new["preset"], new["hard_negatives"], new["command"])] + [new]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(rows, indent=1) + "\n")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="quick")
    parser.add_argument("--variants", default="hn,inbatch", help="comma list of hn (hard negatives) / inbatch")
    parser.add_argument("--machine", default="cpu")
    parser.add_argument("--runs", default="runs/bench_heldout_packages")
    parser.add_argument("--cache_dir", default="runs/.cache")
    parser.add_argument("--hard_negatives", type=int, default=0, help="K when on (0: the preset's)")
    args, extra = parser.parse_known_args(argv)
    extra = [e for e in extra if e != "--"]
    out = ROOT / "benchmarks" / "results" / args.machine / "xtr_heldout_packages.json"
    for variant in args.variants.split(","):
        hard = variant == "hn"
        k = ["--data.hard_negatives", str(args.hard_negatives)] if hard and args.hard_negatives else []
        command = [sys.executable, "-m", "recipes.xtr_lora", "--preset", args.preset,
                   "--out_dir", f"{args.runs}/{args.preset}_{variant}", "--cache_dir", args.cache_dir,
                   "--export", "false", *(k if hard else ["--data.hard_negatives", "0"]), *extra]
        started = time.perf_counter()
        subprocess.run(command, check=True, cwd=ROOT)
        wall = time.perf_counter() - started
        results = json.loads((ROOT / args.runs / f"{args.preset}_{variant}" / "eval.json").read_text())
        shown = ["python", *command[1:]]
        record(out, entry(args.preset, hard, shown, round(wall, 1), results))
        print(f"{variant}: recorded in {out} ({wall:.0f} s)")


if __name__ == "__main__":
    main()
