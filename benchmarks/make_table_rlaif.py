"""The README's RLAIF reward-arms table (benchmarks.make_table's generated block), from the
committed results/<machine>/rlaif_arms.json (benchmarks.rlaif_arms) and cpu/judge_auc.json."""

from __future__ import annotations

import json
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
SETS = (("heldout", "held-out instances", "sampled"), ("heldout_families", "held-out family", "greedy"),
        ("humaneval", "HumanEval", "sampled"))
LABELS = {"execution": "(a) execution reward", "trained_judge": "(b) trained judge only",
          "untrained_judge": "(c) untrained judge only"}


def _load(machine: str, name: str) -> dict | None:
    path = RESULTS / machine / f"{name}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _gain(d: dict | None) -> str:
    if not d:
        return "-"
    lo, hi = d["ci95"]
    return f"{d['mean']:+.3f} [{lo:+.3f}, {hi:+.3f}]"


def _ci(pair) -> str:
    return "" if not pair else f"[{pair[0]:.3f}, {pair[1]:.3f}]"


def _pct(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def arms_section(machine: str = "h200") -> list[str]:
    """One row per arm: each seed's paired after - before (95% interval) on every evaluation set;
    then the base's pass@1, the judges' AUCs and the targets as the JSON states them."""
    r = _load(machine, "rlaif_arms")
    if not r:
        return []
    runs, before = r["runs"], r["before"]["sets"]
    exp = r.get("experiment", {})
    recipe = exp.get("recipe", [])
    extra = " ".join(recipe[recipe.index("--train.steps"):recipe.index("--train.steps") + 2]) if "--train.steps" in recipe else ""
    out = [f"**RLAIF reward arms** ({machine}, SmolLM2-135M-Instruct, `--preset gpu` with the experiment's "
           f"evaluation, seeds {', '.join(map(str, r['seeds']))}; `python -m benchmarks.rlaif_arms --work DIR -- {extra}`"
           " over device calls, dev/gpu/rlaif_calls.md; each call's command in the JSON): "
           "pass@1 after - before, paired over problems, 95% bootstrap interval, one entry per seed "
           "(`-`: the run did not finish). Curves and intervals: `benchmarks/results/"
           f"{machine}/rlaif_arms.png`; what each arm shows: docs/rlaif.md.", "",
           "| arm | " + " | ".join(f"{label} ({mode})" for _, label, mode in SETS) + " |",
           "|---|" + "---|" * len(SETS)]
    for arm in r["arms"]:
        cells = []
        for name, _, mode in SETS:
            seeds = [x for x in runs if x["arm"] == arm]
            cells.append("<br>".join(f"s{x['seed']}: " + _gain(x["sets"].get(name, {}).get("diff", {}).get(mode))
                                     for x in seeds))
        out.append(f"| {LABELS.get(arm, arm)} | " + " | ".join(cells) + " |")
    base = "; ".join(f"{label} {_pct((before.get(name) or {}).get('sampled'))} sampled / "
                     f"{_pct((before.get(name) or {}).get('greedy'))} greedy ({(before.get(name) or {}).get('problems')} problems)"
                     for name, label, _ in SETS if name in before)
    out += ["", f"Before (the base model, evaluated once for every arm and seed): {base}."]
    aucs = [(s, j["heldout"]) for s, j in r.get("judges", {}).items() if j.get("status") == "done" and "heldout" in j]
    if aucs:
        out.append("Judge ROC AUC on held-out instances, per judge-training seed (untrained -> trained): "
                   + "; ".join(f"s{s} {_pct(a['untrained']['auc'])} -> {_pct(a['trained']['auc'])}" for s, a in aucs)
                   + ".")
    jm = _load("cpu", "judge_mutants")
    mut = (_load("cpu", "judge_auc") or {}).get("sets", {}).get("humaneval_mutants")
    if jm:
        out.append(f"HumanEval canonical vs mutant AUC (cpu/judge_mutants.json, {jm['pairs']} completions of "
                   f"{jm['problems']} problems, 95% CI): "
                   + "; ".join(f"{name} {_pct(j['auc'])} {_ci(j['ci95'])}" for name, j in jm["judges"].items()) + ".")
    elif mut and "trained" in mut:
        out.append(f"HumanEval canonical vs mutant AUC (cpu/judge_auc.json, {mut['n']} completions): untrained "
                   f"{mut['untrained']['auc']:.3f}, trained {mut['trained']['auc']:.3f}.")
    t = r.get("targets", {})
    out.append("Targets: " + "; ".join(f"{k} {'met' if v.get('met') else 'NOT met' if v.get('met') is False else 'not measured'}"
                                       for k, v in t.items()) + ".")
    return out + [""]
