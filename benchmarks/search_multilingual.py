"""The multilingual retriever against the Python-only one, per language, on packages neither
trained on: train each arm's seeds with `recipes.xtr_lora`, then evaluate every trained model
(and the untrained one) with `benchmarks.search_languages` on each language's held-out packages
(`mlxio.data.package_sources.HELDOUT`). Writes benchmarks/results/<machine>/search_multilingual.json.

    python -m benchmarks.search_multilingual --runs runs/multilingual --seeds 0,1,2 --jobs 9 --machine h200
    python -m benchmarks.search_multilingual --runs DIR --arms "quick=--preset quick" --seeds 0 --languages python
    python -m benchmarks.search_multilingual --runs DIR --report        # the JSON from what DIR holds

Arms (--arms "name=recipe flags;..."; default ARMS): the quick preset (Python-only, 15 steps:
today's default model), the same for 20 steps, the multilingual preset (quick's corpus plus
package_sources.TRAIN, 20 steps) and the same for 15 steps; --compare pairs each multilingual arm
with the Python-only arm of as many steps. Each (arm, seed) trains in DIR/<arm>_s<seed> (skipped
when its eval.json exists, resumed when it has checkpoints), --jobs at a time; then each model is
evaluated in DIR/languages/<model>.json (skipped when there), --jobs at a time. Per language and
model: MRR@10 of semantic and hybrid (RRF) search, and BM25's; per arm, the mean over seeds; per
compared pair, the paired difference over the same queries (each query's reciprocal rank averaged
over seeds first; mean +- 1.96 standard errors). Beside them, each run's own held-out Python
packages (networkx, pygments: eval.json).
"""

from __future__ import annotations

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # first: MLX's CPU BLAS is chosen when mlx.core loads (mlxio.runtime)

import argparse
import json
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from benchmarks.common import load, write_result
from mlxcore.retrieval.ranking import paired_difference

ARMS = ("python15=--preset quick;"
        "python20=--preset quick --train.steps 20 --optim.total_steps 20;"
        "multilingual=--preset multilingual;"
        "multilingual15=--preset multilingual --train.steps 15 --optim.total_steps 15")
# each multilingual arm against the Python-only arm of as many steps (python15: today's default model)
COMPARE = "multilingual=python20,multilingual15=python15"


def parse_compare(text: str, arms: dict) -> list[tuple[str, str]]:
    """[(arm, control arm)] of "arm=control,..." (both among `arms`)."""
    pairs = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        arm, sep, control = (x.strip() for x in part.partition("="))
        if not sep or arm not in arms or control not in arms:
            raise SystemExit(f"--compare: {part!r} is not arm=control with both among the arms {sorted(arms)}")
        pairs.append((arm, control))
    return pairs


def parse_arms(text: str) -> dict[str, list[str]]:
    """{arm name: recipe flags} of "name=flags;name=flags"."""
    arms = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        name, sep, flags = part.partition("=")
        if not sep or not name.strip().isidentifier():
            raise SystemExit(f"--arms: {part!r} is not name=recipe flags")
        arms[name.strip()] = shlex.split(flags)
    return arms


def run_logged(command: list[str], log: Path) -> int:
    """Run `command` with its output in `log`; its exit status."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        return subprocess.run(command, stdout=out, stderr=subprocess.STDOUT).returncode


def train(run_dir: Path, flags: list[str], seed: int, cache_dir: Path, extra: list[str]) -> int:
    """Train one (arm, seed) into run_dir unless its eval.json is there; 0 on success."""
    if (run_dir / "eval.json").is_file() and (run_dir / "merged").is_dir():
        return 0
    resume = ["--resume"] if (run_dir / "checkpoints").is_dir() else []
    command = [sys.executable, "-m", "recipes.xtr_lora", *flags, "--train.seed", str(seed), "--out_dir", str(run_dir),
               "--cache_dir", str(cache_dir), *extra, *resume]
    return run_logged(command, run_dir.parent / "logs" / f"{run_dir.name}.log")


def evaluate(model: str | None, name: str, runs: Path, args) -> int:
    """search_languages for one model into runs/languages/<name>.json (skipped when there)."""
    out = runs / "languages" / f"{name}.json"
    if out.is_file():
        return 0
    command = [sys.executable, "-m", "benchmarks.search_languages", "--pool_factors", "1", "--per_query",
               "--languages", args.languages, "--max_queries", str(args.max_queries),
               "--max_candidates", str(args.max_candidates), "--cache_dir", str(args.cache_dir),
               "--work", str(runs / "languages" / name), "--out", str(out.with_suffix(".tmp.json"))]
    if model is not None:
        command += ["--model", model]
    code = run_logged(command, runs / "logs" / f"languages_{name}.log")
    if code == 0:
        out.with_suffix(".tmp.json").rename(out)
    return code


def summary(runs: Path, arms: dict[str, list[str]], seeds: list[int], compare: list[tuple[str, str]]) -> dict:
    """The JSON's body from what `runs` holds (runs that did not finish are left out and named)."""
    def languages_of(name: str) -> dict:
        path = runs / "languages" / f"{name}.json"
        return {e["language"]: e for e in json.loads(path.read_text())["languages"]} if path.is_file() else {}

    untrained = languages_of("untrained")
    per_model = {f"{arm}_s{s}": languages_of(f"{arm}_s{s}") for arm in arms for s in seeds}
    missing = sorted(name for name, langs in per_model.items() if not langs)
    langs = list(untrained) or sorted({lang for m in per_model.values() for lang in m})
    table = {}
    for lang in langs:
        row = {"bm25": None, "untrained": None, "arms": {}}
        if lang in untrained:
            row["bm25"] = untrained[lang]["bm25"]["mrr@10"]
            row["untrained"] = {m: untrained[lang][m]["mrr@10"] for m in ("semantic", "hybrid_rrf")}
            row["queries"], row["candidates"] = untrained[lang]["queries"], untrained[lang]["candidates"]
            row["packages"] = [f"{p['name']} {p['version']}" for p in untrained[lang]["packages"]]
        rr = {}
        for arm in arms:
            entries = [per_model[f"{arm}_s{s}"][lang] for s in seeds if lang in per_model[f"{arm}_s{s}"]]
            if not entries:
                continue
            cell = {"seeds": len(entries)}
            for mode in ("semantic", "hybrid_rrf"):
                values = [e[mode]["mrr@10"] for e in entries]
                cell[mode] = {"mean": round(float(np.mean(values)), 4), "per_seed": values}
                rr[(arm, mode)] = np.mean([e[mode]["rr"] for e in entries], axis=0)
            row["arms"][arm] = cell
        for arm, control in compare:
            if (arm, "semantic") in rr and (control, "semantic") in rr:
                row["arms"][arm]["minus_" + control] = {
                    mode: {k: round(v, 4) if isinstance(v, float) else v
                           for k, v in paired_difference(rr[(arm, mode)], rr[(control, mode)]).items()}
                    for mode in ("semantic", "hybrid_rrf")}
        table[lang] = row
    recipe = {}
    for arm in arms:
        values = []
        for s in seeds:
            path = runs / f"{arm}_s{s}" / "eval.json"
            if path.is_file():
                pkg = json.loads(path.read_text()).get("heldout_packages") or {}
                value = (pkg.get("fine-tuned") or {}).get("semantic", {}).get("mrr@10")
                if value is not None:
                    values.append(round(value, 4))
        recipe[arm] = {"heldout_packages_semantic_mrr@10": values,
                       "mean": round(float(np.mean(values)), 4) if values else None}
    return {"arms": {arm: " ".join(flags) for arm, flags in arms.items()}, "compare": compare, "seeds": seeds,
            "languages": table, "recipe_heldout_packages": recipe, "unfinished": missing}


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    shown = [a for i, a in enumerate(argv) if a != "--note" and (i == 0 or argv[i - 1] != "--note")]
    command = "python -m benchmarks.search_multilingual " + shlex.join(shown)  # the note is kept apart
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=Path, default=Path("runs/multilingual"))
    parser.add_argument("--arms", default=ARMS)
    parser.add_argument("--compare", default=COMPARE, help="arm=control pairs compared over the same queries")
    parser.add_argument("--note", default="", help="a line kept in the JSON and its table (e.g. the device calls)")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--jobs", type=int, default=1, help="runs (then evaluations) at a time")
    parser.add_argument("--languages", default="python,javascript,typescript,go,rust,java")
    parser.add_argument("--max_queries", type=int, default=500)
    parser.add_argument("--max_candidates", type=int, default=2500)
    parser.add_argument("--cache_dir", type=Path, default=Path("runs/.cache"))
    parser.add_argument("--machine", default="cpu")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--report", action="store_true", help="only write the JSON from what --runs holds")
    args = parser.parse_args(argv)
    arms, seeds = parse_arms(args.arms), [int(s) for s in args.seeds.split(",")]
    compare = parse_compare(args.compare, arms)
    runs = args.runs
    if not args.report:
        jobs = [(arm, s) for s in seeds for arm in arms]
        with ThreadPoolExecutor(max(args.jobs, 1)) as pool:
            codes = list(pool.map(lambda j: train(runs / f"{j[0]}_s{j[1]}", arms[j[0]], j[1], args.cache_dir, extra),
                                  jobs))
        for (arm, s), code in zip(jobs, codes, strict=True):
            print(f"train {arm} seed {s}: {'ok' if code == 0 else f'exit {code}'}", flush=True)
        models = [(None, "untrained")] + [(str(runs / f"{a}_s{s}" / "merged"), f"{a}_s{s}") for a, s in jobs
                                          if (runs / f"{a}_s{s}" / "merged").is_dir()]
        with ThreadPoolExecutor(max(args.jobs, 1)) as pool:
            codes = list(pool.map(lambda m: evaluate(m[0], m[1], runs, args), models))
        for (_, name), code in zip(models, codes, strict=True):
            print(f"evaluate {name}: {'ok' if code == 0 else f'exit {code}'}", flush=True)
    payload = {"command": command,
               "max_queries": args.max_queries, "max_candidates": args.max_candidates, "note": args.note,
               **summary(runs, arms, seeds, compare)}
    print(write_result("search_multilingual", payload, args.machine, path=args.out))


def section(payload: dict, machine: str) -> list[str]:
    """The docs' table of a search_multilingual.json (docs/performance.md, via benchmarks.make_table)."""
    arms, compare = list(payload["arms"]), [tuple(c) for c in payload["compare"]]
    out = [f"### The multilingual retriever per language, on held-out packages ({machine}, "
           f"benchmarks/search_multilingual.py, seeds {', '.join(map(str, payload['seeds']))})", "",
           f"`{payload['command']}`" + (f" ({payload['note']})" if payload.get("note") else "") + ". Arms: "
           + "; ".join(f"{a}: `{f}`" for a, f in payload["arms"].items())
           + ". Semantic MRR@10, mean over seeds; the last columns: an arm minus its control over the same "
           "queries (each query's reciprocal rank averaged over seeds first; +- 1.96 standard errors).", "",
           "| language | queries / candidates | BM25 | untrained | " + " | ".join(arms) + " | "
           + " | ".join(f"{a} - {c}" for a, c in compare) + " |",
           "|---|---|---|---|" + "---|" * (len(arms) + len(compare))]
    for lang, row in payload["languages"].items():
        cells = [f"{row['arms'][a]['semantic']['mean']:.3f}" if a in row["arms"] else "-" for a in arms]
        for arm, control in compare:
            diff = (row["arms"].get(arm) or {}).get(f"minus_{control}", {}).get("semantic")
            cells.append(f"{diff['mrr@10']:+.3f} +- {1.96 * diff['se']:.3f}" if diff else "-")
        out.append(f"| {lang} | {row.get('queries', '-')} / {row.get('candidates', '-')} "
                   f"| {row['bm25']:.3f} | {row['untrained']['semantic']:.3f} | " + " | ".join(cells) + " |")
    recipe = payload["recipe_heldout_packages"]
    out += ["", "The recipe's own held-out Python packages (networkx, pygments; eval.json), fine-tuned semantic "
            "MRR@10 per seed: " + "; ".join(f"{a} {', '.join(f'{v:.3f}' for v in r['heldout_packages_semantic_mrr@10']) or '-'}"
                                            for a, r in recipe.items()) + "."]
    if payload["unfinished"]:
        out.append(f"Unfinished runs (left out): {', '.join(payload['unfinished'])}.")
    return out + [""]


def results_section() -> list[str]:
    """Every machine's search_multilingual.json, as docs tables."""
    out = []
    for machine in ("cpu", "h100", "h200"):
        payload = load(machine, "search_multilingual")
        if payload:
            out += section(payload, machine)
    return out


if __name__ == "__main__":
    main()
