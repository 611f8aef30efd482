"""benchmarks.rlaif_arms's results: one JSON (every arm, seed and evaluation set: sampled and
greedy pass@1 with 95% intervals, the paired after - before against the shared "before", the
curves, the judges' AUCs, the targets met or not) and one PNG, from the run folders in `work`.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from benchmarks.common import RESULTS, write_result
from mlxio.rl import rollout_log
from mlxio.rl.evaluation import EvalConfig, compare, load_problems
from mlxio.run.runlog import save_figure

SETS = ("heldout", "heldout_families", "humaneval")
CURVE_KEYS = ("reward_mean", "pass_rate", "entropy", "kl", "reward/ai_feedback", "reward/execution", "step_s",
              "gen_tokens_per_s")
ARM_NOTES = {
    "execution": "(a) the sandbox's verdict (+ format 0.2); every arm: entropy floor 0.3, equal-group skipping",
    "trained_judge": "(b) the trained verdict judge (its own seed) as the only reward; no test runs in training",
    "untrained_judge": "(c) the judge's base with LoRA off as the only reward (control)",
}


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def side(res: dict | None) -> dict | None:
    """pass@1 and 95% interval of one phase of one set, sampled and greedy."""
    if not res:
        return None
    s, g = res.get("sampled") or {}, res.get("greedy") or {}
    return {"sampled": s.get("pass@1"), "sampled_ci95": s.get("ci95"), "n": s.get("n"),
            "greedy": g.get("pass@1"), "greedy_ci95": g.get("ci95"), "problems": res.get("problems"),
            "missing": (s.get("missing") or 0) + (g.get("missing") or 0)}


def curves(run: Path) -> list[dict]:
    """The run's metrics.jsonl records, the plotted keys only."""
    path = run / "metrics.jsonl"
    if not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [{"step": r["step"], **{k: r.get(k) for k in CURVE_KEYS if k in r}} for r in rows]


def onpolicy_pass(run: Path, per_window: int = 16, workers: int = 8) -> list[dict] | None:
    """A judge arm's training pass rate, judged after training (the run itself ran no test):
    `per_window` of the rollouts of each logging window (train.log_every steps) run
    against their tests in the sandbox. [{"step": last step of the window, "pass_rate", "n"}],
    cached in run/onpolicy_pass.json; None without the run's rollouts."""
    cache = run / "onpolicy_pass.json"
    if cache.is_file():
        return json.loads(cache.read_text())
    log, cfg_path = run / rollout_log.LOG_NAME, run / "config.json"
    if not log.is_file() or not cfg_path.is_file():
        return None
    from mlxio.atomic import write_json_atomic
    from mlxio.rl.execution import CodeJudge
    from mlxio.run.flags import parse_args
    from recipes.rlaif_config import PRESETS

    cfg, _ = parse_args(["--config", str(cfg_path)], PRESETS, prog="rlaif_qwen", description="", default_preset="quick")
    problems = {p.task_id: p for p in load_problems(cfg.data)[0]}
    window = cfg.train.log_every
    by_window: dict[int, list[dict]] = {}
    for r in rollout_log.read_rows(log):
        if r["task_id"] in problems:
            by_window.setdefault((r["step"] - 1) // window, []).append(r)
    picked = {w: rows[:: max(1, len(rows) // per_window)][:per_window] for w, rows in sorted(by_window.items())}
    flat = [(w, r) for w, rows in picked.items() for r in rows]
    passed = CodeJudge(workers=workers).passed([problems[r["task_id"]] for _, r in flat], [r["completion"] for _, r in flat])
    out = []
    for w in picked:
        got = [p for (ww, _), p in zip(flat, passed, strict=True) if ww == w and p is not None]
        out.append({"step": (w + 1) * window, "pass_rate": float(np.mean(got)) if got else None, "n": len(got)})
    write_json_atomic(cache, out)
    return out


def run_errors(log: Path) -> list[str]:
    """The distinct error lines (RuntimeError, ..., "error:") of a run's log, in order: why it stopped."""
    if not log.is_file():
        return []
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines()
             if ln.startswith(("RuntimeError", "MemoryError")) or ": error:" in ln]
    return list(dict.fromkeys(lines))


def one_run(work: Path, arm: str, seed: int, before: dict, ev: EvalConfig) -> dict:
    """One arm x seed: its status, the sets before / after / paired diff, its curves."""
    run = work / f"{arm}_s{seed}"
    res = _read_json(run / "eval.json")
    cur = curves(run)
    out = {"arm": arm, "seed": seed, "judge_seed": seed if arm == "trained_judge" else None,
           "status": "done" if res else ("partial" if cur else "not run"),
           "steps_done": cur[-1]["step"] if cur else 0, "sets": {}, "curves": cur}
    if not res:
        out["errors"] = run_errors(work / f"{arm}_s{seed}.log")
    if res and arm != "execution":
        # no test ran in training: the pass rate of a sample of its rollouts, judged afterwards
        sampled = onpolicy_pass(run) or []
        rates = {x["step"]: x["pass_rate"] for x in sampled}
        for c in cur:
            if c["step"] in rates:
                c["pass_rate"] = rates[c["step"]]
        out["pass_rate_note"] = "judged after training, 16 rollouts per logging window" if sampled else None
    if res:
        out["wall_s"] = res.get("wall_s")
        for name, entry in res["eval"].items():
            after = entry.get("after")
            b = before.get(name)
            diff = compare(b, after, ev) if (b and after) else {}
            out["sets"][name] = {"before": side(b), "after": side(after), "diff": diff}
    return out


def judges(work: Path, seeds: list[int]) -> dict:
    """Each judge's held-out AUCs (untrained and trained, 95% intervals) and its data sizes."""
    out = {}
    for s in seeds:
        res = _read_json(work / f"judge_s{s}" / "eval.json")
        if not res or "eval" not in res:
            out[str(s)] = {"status": "not run"}
            continue
        out[str(s)] = {"status": "done", "data": res.get("data"), "wall_s": res.get("wall_s"),
                       **{name: {j: {k: r.get(j, {}).get(k) for k in ("auc", "ci95")} for j in ("untrained", "trained")}
                          for name, r in res["eval"].items()}}
    return out


def judge_overlap(work: Path, seeds: list[int], eval_ids: set[str]) -> dict:
    """How many of each judge's training problems (task ids) are in the RLAIF evaluation sets
    (0 expected: the judge trains on the procedural training split only)."""
    out = {}
    for s in seeds:
        jd = work / f"judge_s{s}"
        cfg = _read_json(jd / "config.json") or {}
        fams = tuple((cfg.get("data") or {}).get("heldout_families", ("parsing",)))
        frac = (cfg.get("data") or {}).get("heldout_fraction", 0.2)
        path = jd / rollout_log.LOG_NAME
        if not path.is_file():
            continue
        train = {r["task_id"] for r in rollout_log.read_rows(path)
                 if rollout_log.split_of(r["task_id"], fams, frac) == "train"}
        out[str(s)] = {"train_problems": len(train), "in_eval_sets": len(train & eval_ids)}
    return out


def gpu_use(work: Path) -> dict | None:
    """Mean / max GPU utilisation (%) and max memory used (MiB) of nvidia-smi's 15 s samples in
    work/gpu_util.log ("timestamp, 85 %, 12345 MiB" lines; dev/gpu/rlaif_arms_call.sh)."""
    path = work / "gpu_util.log"
    if not path.is_file():
        return None
    util, mem = [], []
    for line in path.read_text().splitlines():
        parts = [p.strip().split()[0] for p in line.split(",")[1:3] if p.strip()]
        if len(parts) == 2 and all(p.isdigit() for p in parts):
            util.append(int(parts[0]))
            mem.append(int(parts[1]))
    if not util:
        return None
    return {"samples": len(util), "util_mean_pct": round(float(np.mean(util)), 1), "util_max_pct": max(util),
            "memory_max_mib": max(mem)}


def _mean(xs: list[float]) -> float | None:
    return float(np.mean(xs)) if xs else None


def targets(runs: list[dict], seeds: list[int]) -> dict:
    """Issue 47's targets, each met / not met / not measured, with the figures they read."""
    def gains(arm: str, name: str = "heldout", mode: str = "sampled") -> list[dict]:
        return [r["sets"][name]["diff"][mode] for r in runs
                if r["arm"] == arm and name in r["sets"] and mode in r["sets"][name]["diff"]]

    out = {}
    a, b, c = gains("execution"), gains("trained_judge"), gains("untrained_judge")
    fam = gains("execution", "heldout_families", "greedy")
    if len(a) == len(seeds):
        out["a_heldout_gain_above_0_every_seed"] = {"met": all(g["ci95"][0] > 0 for g in a),
                                                   "lower_bounds": [g["ci95"][0] for g in a]}
    if len(fam) == len(seeds):
        # "not below its before-value by more than its interval": the paired greedy difference's
        # 95% interval reaches 0 (it is not significantly negative)
        out["a_family_greedy_not_below_before"] = {"met": all(g["ci95"][1] >= 0 for g in fam),
                                                  "diffs": [g["mean"] for g in fam],
                                                  "upper_bounds": [g["ci95"][1] for g in fam]}
    ma, mb, mc = _mean([g["mean"] for g in a]), _mean([g["mean"] for g in b]), _mean([g["mean"] for g in c])
    if b and ma is not None:
        out["b_half_of_a_gain"] = {"met": mb >= 0.5 * ma, "mean_gain_b": mb, "mean_gain_a": ma}
        out["b_gain_above_0_on_2_of_3"] = {"met": sum(g["ci95"][0] > 0 for g in b) >= 2,
                                          "lower_bounds": [g["ci95"][0] for g in b]}
    if b and c:
        # "clearly below": every seed's untrained-judge gain below the same seed's trained-judge gain
        per_seed = [(x["mean"], y["mean"]) for x, y in zip(b, c, strict=False)]
        out["c_clearly_below_b"] = {"met": mc < mb and all(y < x for x, y in per_seed), "mean_gain_b": mb,
                                    "mean_gain_c": mc}
    for key in ("a_heldout_gain_above_0_every_seed", "a_family_greedy_not_below_before", "b_half_of_a_gain",
                "b_gain_above_0_on_2_of_3", "c_clearly_below_b"):
        out.setdefault(key, {"met": None, "note": "not measured: runs missing"})
    return out


def gpu_name() -> str | None:
    """The GPU nvidia-smi names on this machine (None elsewhere)."""
    import subprocess

    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return out or None


def write(work: Path, seeds: list[int], arms: list[str], machine: str, path: Path | None, command: str) -> Path:
    """Write results/<machine>/rlaif_arms.json and .png from the run folders in `work`."""
    before_json = _read_json(work / "before" / "before.json") or {}
    before = before_json.get("sets", {})
    ev = EvalConfig()  # the paired bootstrap's resamples and seed (the recipe's defaults)
    runs = [one_run(work, arm, s, before, ev) for arm in arms for s in seeds]
    eval_ids = {t for res in before.values() for t in res.get("per_problem", {})}
    setup = _read_json(work / "command.json") or {}
    payload = {"command": command, "gpu": gpu_name(), "experiment": setup, "arms": {a: ARM_NOTES[a] for a in arms}, "seeds": seeds,
               "before": {"note": "the base model (LoRA off) with fixed evaluation seeds: the same for every arm and "
                                  "seed, evaluated once", "sets": {k: side(v) for k, v in before.items()}},
               "runs": runs, "judges": judges(work, seeds), "judge_training_overlap": judge_overlap(work, seeds, eval_ids),
               "timing": _read_json(work / "timing.json"), "gpu_use": gpu_use(work),
               "targets": targets(runs, seeds)}
    out = write_result("rlaif_arms", payload, machine, path=path)
    plot(payload, out.with_suffix(".png"))
    return out


def plot(payload: dict, path: Path) -> Path:
    """Reward, pass rate, entropy and KL per step (a line per run, colour per arm) above pass@1
    before / after with 95% interval bars per arm and seed on each evaluation set."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"execution": "tab:blue", "trained_judge": "tab:green", "untrained_judge": "tab:red"}
    fig, axes = plt.subplots(2, 4, figsize=(18, 8))
    for ax, key in zip(axes[0], ("reward_mean", "pass_rate", "entropy", "kl"), strict=True):
        for r in payload["runs"]:
            pts = [(c["step"], c[key]) for c in r["curves"] if c.get(key) is not None]
            if pts:
                ax.plot(*zip(*pts, strict=True), color=colours[r["arm"]], alpha=0.8, lw=1.2, marker=".", ms=3,
                        label=f"{r['arm']} s{r['seed']}")
        ax.set_title(key + (" (b, c: tests run after training, 16 per window)" if key == "pass_rate" else ""),
                     fontsize=9)
        ax.set_xlabel("step")
    axes[0][0].legend(fontsize=6, ncol=1)
    for ax, name in zip(axes[1], SETS, strict=False):
        b = payload["before"]["sets"].get(name)
        x = 0
        ticks, labels = [], []
        if b and b["sampled"] is not None:
            lo, hi = b["sampled_ci95"]
            ax.errorbar([x], [b["sampled"]], yerr=[[b["sampled"] - lo], [hi - b["sampled"]]], fmt="o", color="black")
            ticks.append(x)
            labels.append("before")
            x += 1
        for r in payload["runs"]:
            a = r["sets"].get(name, {}).get("after")
            if a and a["sampled"] is not None:
                lo, hi = a["sampled_ci95"]
                ax.errorbar([x], [a["sampled"]], yerr=[[a["sampled"] - lo], [hi - a["sampled"]]], fmt="o",
                            color=colours[r["arm"]])
                ticks.append(x)
                labels.append(f"{r['arm'].split('_')[0][:5]} s{r['seed']}")
                x += 1
        ax.set_xticks(ticks, labels, rotation=60, fontsize=7)
        ax.set_title(f"{name}: sampled pass@1, 95% CI (after; before in black)", fontsize=9)
    ax = axes[1][3]
    for i, j in enumerate(payload["judges"].values()):
        for k, judge in enumerate(("untrained", "trained")):
            r = (j.get("heldout") or {}).get(judge) or {}
            if r.get("auc") is not None and r.get("ci95"):
                ax.errorbar([i * 3 + k], [r["auc"]], yerr=[[r["auc"] - r["ci95"][0]], [r["ci95"][1] - r["auc"]]],
                            fmt="o", color="tab:green" if judge == "trained" else "tab:red")
    ax.axhline(0.5, color="grey", lw=0.8)
    ax.set_title("judge ROC AUC on held-out instances (red untrained, green trained; per judge seed)", fontsize=8)
    fig.suptitle("RLAIF arms x seeds (SmolLM2-135M): training curves and held-out pass@1", fontsize=11)
    fig.tight_layout()
    save_figure(fig, path)
    return path


README_SETS = (("heldout", "held-out instances", "sampled"), ("heldout_families", "held-out family", "greedy"),
        ("humaneval", "HumanEval", "sampled"))
LABELS = {"execution": "(a) execution reward", "trained_judge": "(b) trained judge only",
          "untrained_judge": "(c) untrained judge only"}


def _load(machine: str, name: str) -> dict | None:
    return _read_json(RESULTS / machine / f"{name}.json")


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
           "| arm | " + " | ".join(f"{label} ({mode})" for _, label, mode in README_SETS) + " |",
           "|---|" + "---|" * len(README_SETS)]
    for arm in r["arms"]:
        cells = []
        for name, _, mode in README_SETS:
            seeds = [x for x in runs if x["arm"] == arm]
            cells.append("<br>".join(f"s{x['seed']}: " + _gain(x["sets"].get(name, {}).get("diff", {}).get(mode))
                                     for x in seeds))
        out.append(f"| {LABELS.get(arm, arm)} | " + " | ".join(cells) + " |")
    base = "; ".join(f"{label} {_pct((before.get(name) or {}).get('sampled'))} sampled / "
                     f"{_pct((before.get(name) or {}).get('greedy'))} greedy ({(before.get(name) or {}).get('problems')} problems)"
                     for name, label, _ in README_SETS if name in before)
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


__all__ = ["RESULTS", "write", "plot", "targets", "arms_section"]
