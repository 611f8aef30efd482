"""Does RLAIF teach? Held-out pass@1 before and after a recipe run, with 95% intervals.

Runs `recipes.rlaif_qwen` with the given options (evaluation before and after on every
evaluation set: n sampled completions per problem + greedy, bootstrap CIs over problems, the
paired difference; see mlxio/rl/evaluation.py) and, once the run is complete, appends one entry
per evaluation set to benchmarks/results/<machine>/rlaif_learning.json:
  {"task_set", "model", "seed", "steps", "n_samples", "temperature", "before": {"pass_at_1",
   "ci95", "greedy", "greedy_ci95", "problems", "missing"}, "after": {...}, "diff": {"mean",
   "ci95", "greedy_mean", "greedy_ci95"}, "command", "wall_s", "run"}
A run longer than one sitting (a device call) continues with the same command: each call
passes `--resume` (and `--stop_after STEP`, the step to stop at in this sitting), and wall_s
sums the calls (recorded in the run's folder).

    python -m benchmarks.rlaif_learning --machine h100 --stop_after 60 -- --preset gpu --out_dir runs/learn
"""

from __future__ import annotations

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # first: MLX's CPU BLAS is chosen when mlx.core loads (mlxio.runtime)

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

from benchmarks.common import ci, load
from mlxio.atomic import write_text_atomic
from recipes import rlaif_qwen

RESULTS = Path(__file__).parent / "results"


def _config_value(cfg: dict, *path: str):
    """A value of the run's config: the sectioned key (e.g. train.steps) or, in results
    written before the config had sections, the top-level one."""
    node = cfg
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return cfg.get(path[-1])
        node = node[key]
    return node


def entries(eval_json: dict, command: str, wall_s: float | None, run: str) -> list[dict]:
    """One record per evaluation set of a finished run's eval.json."""
    cfg = eval_json["config"]
    out = []
    for name, res in eval_json["eval"].items():
        if "before" not in res or "after" not in res:
            continue

        def side(r: dict) -> dict:
            sampled, greedy = r.get("sampled", {}), r.get("greedy", {})
            return {"pass_at_1": sampled.get("pass@1"), "ci95": sampled.get("ci95"),
                    "greedy": greedy.get("pass@1"), "greedy_ci95": greedy.get("ci95"),
                    "problems": r["problems"],
                    "missing": sampled.get("missing", 0) + greedy.get("missing", 0)}

        d = res.get("diff", {})
        out.append({
            "task_set": name, "model": cfg.get("model") or "SmolLM2-135M-Instruct (embedded GGUF)",
            "seed": _config_value(cfg, "train", "seed"), "steps": _config_value(cfg, "train", "steps"),
            "n_samples": res["before"].get("n"),
            "temperature": res["before"].get("sampled", {}).get("temperature"),
            "before": side(res["before"]), "after": side(res["after"]),
            "diff": {"mean": d.get("sampled", {}).get("mean"), "ci95": d.get("sampled", {}).get("ci95"),
                     "greedy_mean": d.get("greedy", {}).get("mean"),
                     "greedy_ci95": d.get("greedy", {}).get("ci95")},
            "command": command, "wall_s": wall_s, "run": run,
        })
    return out


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    cut = argv.index("--") if "--" in argv else len(argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--machine", required=True, help="results/<machine>/rlaif_learning.json")
    ap.add_argument("--stop_after", type=int, default=None, metavar="STEP",
                    help="stop this sitting after this optimizer step (the run resumes next call)")
    ap.add_argument("--results", default=None, help="JSON to append to (default: results/...)")
    ap.add_argument("--from-eval", default=None, metavar="EVAL_JSON",
                    help="no run: the entries of a finished run's eval.json (e.g. one made on a "
                         "machine whose results could not all be copied back)")
    ap.add_argument("--wall-s", type=float, default=None, help="with --from-eval: the run's wall time")
    ap.add_argument("--run-command", default=None, help="with --from-eval: the command that ran it")
    args = ap.parse_args(argv[:cut])
    path = Path(args.results) if args.results else RESULTS / args.machine / "rlaif_learning.json"
    if args.from_eval:
        append(path, entries(json.loads(Path(args.from_eval).read_text()), args.run_command or "",
                             args.wall_s, Path(args.from_eval).parent.name))
        return
    recipe_args = argv[cut + 1:]
    command = "python -m benchmarks.rlaif_learning --machine " + args.machine + " -- " + shlex.join(recipe_args)
    t0 = time.perf_counter()
    extra = ["--resume"] + (["--stop_after", str(args.stop_after)] if args.stop_after else [])
    results = rlaif_qwen.main(recipe_args + extra)
    out = Path(_config_value(results["config"], "out_dir") or results["config"]["out"])
    timing = out / "wall_s.json"
    calls = json.loads(timing.read_text()) if timing.exists() else []
    calls.append(time.perf_counter() - t0)
    timing.write_text(json.dumps(calls))
    if not any("after" in r for r in results["eval"].values()):
        print(f"run not finished yet ({len(calls)} sittings); call again to continue", file=sys.stderr)
        return
    append(path, entries(results, command, sum(calls), out.name))


def append(path: Path, new: list[dict]) -> None:
    """Add `new` entries to the JSON list at `path` (written atomically) and print them."""
    old = json.loads(path.read_text()) if path.exists() else []
    write_text_atomic(path, json.dumps(old + new, indent=1) + "\n")

    def num(x, fmt: str) -> str:
        return "-" if x is None else format(x, fmt)

    for e in new:
        lo, hi = e["diff"]["ci95"] or (None, None)
        print(f"{e['task_set']:<18} seed {e['seed']} pass@1 {num(e['before']['pass_at_1'], '.3f')} -> "
              f"{num(e['after']['pass_at_1'], '.3f')} diff {num(e['diff']['mean'], '+.3f')} "
              f"[{num(lo, '+.3f')}, {num(hi, '+.3f')}]")


def results_section() -> list[str]:
    """Does RLAIF learn? (h100/rlaif_learning.json: the gpu preset, before / after training)."""
    rows = load("h100", "rlaif_learning")
    if not rows:
        return []
    first = rows[0]
    out = [f"### RLAIF: before and after training (h100, {first['model']}, {first['steps']} steps, pass@1 of "
           f"{first['n_samples']} samples at temperature {first['temperature']}; benchmarks/rlaif_learning.py)", "",
           "| evaluation set (problems) | before | after | after - before | greedy: before / after |",
           "|---|---|---|---|---|"]
    for row in rows:
        b, a, d = row["before"], row["after"], row["diff"]
        out.append(f"| {row['task_set']} ({b['problems']}) | {b['pass_at_1']:.3f} {ci(b['ci95'])} "
                   f"| {a['pass_at_1']:.3f} {ci(a['ci95'])} | {d['mean']:+.3f} {ci(d['ci95'])} "
                   f"| {b['greedy']:.3f} / {a['greedy']:.3f} |")
    return out + ["", "One training run (seed 0): the intervals cover the choice of problems and samples, not "
                  "the run's own variance. Curves: `benchmarks/results/h100/rlaif_runs/gpu_seed0/curves.png`.", ""]


def default_run_section() -> list[str]:
    """The README's table of what `make rlaif` gives (cpu/rlaif_quick.json: the eval.json of a default
    run on a 2-core CPU): pass@1 before and after on each held-out set, sampled and greedy."""
    out = []
    r = load("cpu", "rlaif_quick")
    if r:
        cfg = r["config"]
        out += [f"**RLAIF** (`python -m recipes.rlaif_qwen`: {cfg['optim']['total_steps']} steps x "
                f"{cfg['prompts_per_step']} prompts x {cfg['group_size']} completions; pass@1 of "
                f"{cfg['eval']['samples']} samples per problem and of the greedy completion, 95% bootstrap "
                f"intervals over problems; the run took {r['wall_s'] / 60:.1f} min on a 2-core CPU):", "",
                "| evaluation set | decoding | before | after | after - before |", "|---|---|---|---|---|"]
        for name, label in (("heldout", "held-out instances"), ("heldout_families", "held-out family")):
            e = r["eval"].get(name)
            if not e:
                continue
            for mode in ("sampled", "greedy"):
                b, a, d = e["before"][mode], e["after"][mode], e["diff"][mode]
                out.append(f"| {label} ({e['before'].get('problems', len(e['before'].get('per_problem', {})))} problems) "
                           f"| {mode} | {b['pass@1']:.3f} {ci(b['ci95'])} | {a['pass@1']:.3f} {ci(a['ci95'])} "
                           f"| {d['mean']:+.3f} {ci(d['ci95'])} |")
        out.append("")
    return out


if __name__ == "__main__":
    main()
