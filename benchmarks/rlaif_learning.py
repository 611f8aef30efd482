"""Does RLAIF teach? Held-out pass@1 before and after a recipe run, with 95% intervals.

Runs `recipes.rlaif_qwen` with the given options (evaluation before and after on every
evaluation set: n sampled completions per problem + greedy, bootstrap CIs over problems, the
paired difference; see mlxio/rl/evaluation.py) and, once the run is complete, appends one entry
per evaluation set to benchmarks/results/<machine>/rlaif_learning.json:
  {"task_set", "model", "steps", "n_samples", "before": {"pass_at_1", "ci95", "greedy",
   "greedy_ci95"}, "after": {...}, "diff": {"mean", "ci95", "greedy_mean", "greedy_ci95"},
   "command", "wall_s", "run"}
A run longer than one sitting (a device call) continues with the same command: each call
passes `--resume` and `--stop-after`, and wall_s sums the calls (recorded in the run's folder).

    python -m benchmarks.rlaif_learning --machine h100 --stop-after 60 -- --out runs/learn ...
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import benchmarks  # noqa: F401  (fast BLAS first)
from recipes import rlaif_qwen

RESULTS = Path(__file__).parent / "results"


def entries(eval_json: dict, command: str, wall_s: float, run: str) -> list[dict]:
    """One record per evaluation set of a finished run's eval.json."""
    cfg = eval_json["config"]
    out = []
    for name, res in eval_json["eval"].items():
        if "before" not in res or "after" not in res:
            continue

        def side(r: dict) -> dict:
            return {"pass_at_1": r["sampled"]["pass@1"], "ci95": r["sampled"]["ci95"],
                    "greedy": r["greedy"]["pass@1"], "greedy_ci95": r["greedy"]["ci95"],
                    "problems": r["problems"]}

        d = res["diff"]
        out.append({
            "task_set": name, "model": cfg["model"] or "SmolLM2-135M-Instruct (embedded GGUF)",
            "steps": cfg.get("train", cfg)["steps"],  # train.steps (top-level "steps" in older results) "n_samples": res["before"]["n"],
            "temperature": res["before"]["sampled"]["temperature"],
            "before": side(res["before"]), "after": side(res["after"]),
            "diff": {"mean": d["sampled"]["mean"], "ci95": d["sampled"]["ci95"],
                     "greedy_mean": d["greedy"]["mean"], "greedy_ci95": d["greedy"]["ci95"]},
            "command": command, "wall_s": wall_s, "run": run,
        })
    return out


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    cut = argv.index("--") if "--" in argv else len(argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--machine", required=True, help="results/<machine>/rlaif_learning.json")
    ap.add_argument("--stop-after", type=int, default=None, help="steps in this sitting")
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
    extra = ["--resume"] + (["--stop-after", str(args.stop_after)] if args.stop_after else [])
    results = rlaif_qwen.main(recipe_args + extra)
    out = Path(results["config"]["out"])
    timing = out / "wall_s.json"
    calls = json.loads(timing.read_text()) if timing.exists() else []
    calls.append(time.perf_counter() - t0)
    timing.write_text(json.dumps(calls))
    if not any("after" in r for r in results["eval"].values()):
        print(f"run not finished yet ({len(calls)} sittings); call again to continue", file=sys.stderr)
        return
    append(path, entries(results, command, sum(calls), out.name))


def append(path: Path, new: list[dict]) -> None:
    """Add `new` entries to the JSON list at `path` and print them."""
    path.parent.mkdir(parents=True, exist_ok=True)
    old = json.loads(path.read_text()) if path.exists() else []
    path.write_text(json.dumps(old + new, indent=1) + "\n")
    for e in new:
        print(f"{e['task_set']:<18} pass@1 {e['before']['pass_at_1']:.3f} -> {e['after']['pass_at_1']:.3f} "
              f"diff {e['diff']['mean']:+.3f} [{e['diff']['ci95'][0]:+.3f}, {e['diff']['ci95'][1]:+.3f}]")


if __name__ == "__main__":
    main()
