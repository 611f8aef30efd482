"""benchmarks.xtr_heldout_packages's tables, and the README's default retriever run: every
recorded retriever run (<machine>/xtr_heldout_packages.json, xtr_grad_cache.json,
xtr_full_levers.json, xtr_quick_levers.json) as a row of its gain over the untrained model, the
mean over seeds of each setting run on 3 or more, and cpu/xtr_quick.json (the eval.json of
`make train`) as a table over both held-out tasks. Collected by benchmarks.make_table.
"""

from __future__ import annotations

from benchmarks.common import load


def negatives_label(run: dict) -> str:
    """'none', or the hard negatives per pair and their miners ('2 BM25+MaxSim, guarded')."""
    if not run["hard_negatives"]:
        return "none"
    counts = run.get("hard_negative_counts") or {}
    names = {"bm25": "BM25", "model": "MaxSim"}
    miners = "+".join(names.get(m, m) for m in counts.get("miners", ["bm25"]))
    return f"{counts.get('k', 1)} {miners}{', guarded' if 'dropped' in counts else ''}"


def _gains(run: dict) -> tuple[float | None, float | None, bool]:
    """(held-out packages gain, held-out files gain, hybrid >= semantic on both) of one run."""
    gains, hybrid_ok = [], True
    for task in (run, run.get("heldout_files") or {}):
        if "fine_tuned" not in task:
            gains.append(None)
            continue
        t = task["fine_tuned"]
        gains.append(t["semantic"]["mrr@10"] - task["untrained"]["semantic"]["mrr@10"])
        hybrid_ok &= t["hybrid"]["mrr@10"] >= t["semantic"]["mrr@10"]
    return gains[0], gains[1], hybrid_ok


def heldout_runs() -> list[tuple[str, dict]]:
    """(machine, entry) of every recorded retriever run: <machine>/xtr_heldout_packages.json,
    xtr_grad_cache.json, xtr_full_levers.json and xtr_quick_levers.json (benchmarks/xtr_heldout_packages.py
    writes them)."""
    return [(machine, r) for machine in ("cpu", "h100", "h200")
            for name in ("xtr_heldout_packages", "xtr_grad_cache", "xtr_full_levers", "xtr_quick_levers")
            for r in load(machine, name) or []]


OLD_PRESET_MICRO_BATCH = 12
# the presets' micro-batches while entries did not record grad_cache (quick's grew to 32 since)
LEGACY_MICRO_BATCH = {"quick": 12, "full": 32, "smoke": 4}
LEGACY_LR = {"quick": 2e-4, "full": 2e-4, "smoke": 1e-3}  # the presets' rates before entries recorded lr
PRESET_TEMPERATURE = 0.03  # quick's and full's InfoNCE temperature


def command_flag(r: dict, flag: str) -> str | None:
    """The value a run's command gave `flag` (e.g. "--train.micro_batch"), or None."""
    words = r["command"].split()
    return words[words.index(flag) + 1] if flag in words[:-1] else None


def contrastive_batch(r: dict) -> int:
    """The pairs one InfoNCE saw: recorded, or (entries older than the field, no grad cache)
    the command's micro-batch, else 12 (every preset's micro-batch until the field came)."""
    if r.get("contrastive_batch"):
        return r["contrastive_batch"]
    micro = command_flag(r, "--train.micro_batch")
    return OLD_PRESET_MICRO_BATCH if micro is None else int(micro)


def grad_cache(r: dict) -> bool:
    """Whether a run trained with `--train.grad_cache`: recorded, on its command line, or (older
    entries) its preset's as it was then (a contrastive batch larger than that micro-batch)."""
    if "grad_cache" in r:
        return bool(r["grad_cache"])
    flag = command_flag(r, "--train.grad_cache")
    if flag is not None:
        return flag == "true"
    if not r.get("contrastive_batch"):
        return False
    micro = command_flag(r, "--train.micro_batch")
    return r["contrastive_batch"] > (LEGACY_MICRO_BATCH[r["preset"]] if micro is None else int(micro))


# settings a run's command may change, named in its label where they differ from its preset's
COMMAND_SETTINGS = (("--lora.alpha", "LoRA alpha"), ("--loss.margin_weight", "margin weight"),
                    ("--optim.min_lr_ratio", "min lr ratio"), ("--optim.clip_norm", "clip"),
                    ("--optim.warmup_steps", "warm-up"), ("--train.batch_order", "batch order"))


def same_setting(given: str, preset) -> bool:
    """Whether a command's value of a setting (text) is the preset's: numbers as numbers."""
    return given == preset if isinstance(preset, str) else float(given) == preset


def shown_setting(value: str) -> str:
    """A setting's value as a label shows it: numbers as %g, words as they are."""
    try:
        return f"{float(value):g}"
    except ValueError:
        return value


def preset_value(preset: str, flag: str):
    """The value `recipes.xtr_lora`'s PRESETS[preset] gives a setting (flag "--optim.lr")."""
    from recipes.xtr_lora_config import PRESETS

    value = PRESETS[preset]
    for name in flag[2:].split("."):
        value = getattr(value, name)
    return value


def data_label(r: dict) -> str:
    """The libraries a run trained on (the stdlib counted), a LoRA rank set on its command, its
    learning rate and a temperature other than the presets' 0.03 (recorded in the entry, else on
    its command, else - older entries - the preset's learning rate as it was then), then any
    COMMAND_SETTINGS its command sets to another value than its preset's."""
    rank = command_flag(r, "--lora.rank")
    lr = r.get("lr") or command_flag(r, "--optim.lr") or LEGACY_LR.get(r["preset"])
    temperature = r.get("temperature") or command_flag(r, "--loss.temperature")
    shown = temperature is not None and float(temperature) != PRESET_TEMPERATURE
    others = [(name, value) for flag, name in COMMAND_SETTINGS
              if (value := command_flag(r, flag)) is not None and not same_setting(value, preset_value(r["preset"], flag))]
    return (f"{len(r.get('train_sources') or [])}{', LoRA r' + rank if rank else ''}"
            f"{f', lr {float(lr):g}' if lr else ''}{f', temperature {float(temperature):g}' if shown else ''}"
            + "".join(f", {name} {shown_setting(value)}" for name, value in others))


def run_label(r: dict) -> str:
    """What a run varied: its training libraries, hard negatives, contrastive batch and dev evaluation."""
    batch = contrastive_batch(r)
    dev = r.get("dev_eval")
    return (f"{data_label(r)} | {negatives_label(r)} | {batch if batch else '-'}"
            f"{' (grad cache)' if grad_cache(r) else ''}"
            f" | {'every ' + str(dev['every']) + ', best ' + str(dev['best_step']) if dev else 'no'}")


def setting_means(runs: list[tuple[str, dict]], min_seeds: int = 3) -> list[str]:
    """One table row per setting of `runs` ((machine, entry) pairs) run on `min_seeds` seeds or more,
    in the order of its first run: the mean gains over its seeds (a seed run again: its last entry)
    and how many of them had hybrid >= semantic on both held-out sets."""
    groups: dict[tuple, dict] = {}
    for machine, r in runs:
        key = (machine, r["preset"], r["steps"], run_label(r).split(", best")[0])
        groups.setdefault(key, {})[r.get("seed", 0)] = _gains(r)
    means = []
    for (machine, preset, steps, label), by_seed in groups.items():
        got = [g for g in by_seed.values() if g[0] is not None]
        if len(got) < min_seeds:
            continue
        pkg, files = (sum(g[i] for g in got) / len(got) for i in (0, 1))
        means.append(f"| {machine} | {preset} | {steps} | {label} | {len(got)} | {pkg:+.3f} | {files:+.3f} "
                     f"| {sum(g[2] for g in got)} of {len(got)} |")
    return means


MEANS_HEADER = ("| machine | preset | steps | libraries, settings | hard negatives | batch | dev evaluation | seeds "
                "| packages gain | files gain | hybrid >= semantic |", "|---|---|---|---|---|---|---|---|---|---|---|")


def sweep_section(*files: tuple[str, str]) -> list[str]:
    """docs/retriever.md's table of one sweep: each setting run on 3 seeds or more in the result
    files `files` ((machine, name) of <machine>/<name>.json), its mean gains over the untrained model."""
    runs = [(machine, r) for machine, name in files for r in load(machine, name) or []]
    means = setting_means(runs)
    if not means:
        return []
    names = ", ".join(f"`benchmarks/results/{machine}/{name}.json`" for machine, name in files)
    return [f"Generated from {names}: per setting, the mean over its seeds of the gain in semantic MRR@10 over "
            "the untrained model on held-out packages and held-out files, and the seeds whose hybrid MRR@10 >= "
            "semantic on both. Libraries, settings: the training libraries, then each setting the run's command "
            "gave another value than its preset's; batch: the pairs one InfoNCE sees.", "", *MEANS_HEADER, *means]


def results_section() -> list[str]:
    """The retriever's gain over the untrained model, run by run (seeds, presets, hard negatives,
    contrastive batch), and the mean over seeds of each setting run on 3 or more."""
    rows, runs = [], heldout_runs()
    for machine, r in runs:
        cells = []
        for task in (r, r.get("heldout_files") or {}):
            if "fine_tuned" not in task:
                cells.append("- | - | -")
                continue
            u, t = task["untrained"]["semantic"]["mrr@10"], task["fine_tuned"]["semantic"]["mrr@10"]
            diff = task["fine_tuned"].get("hybrid_minus_semantic")  # recorded since the paired SE was
            paired = f" ({diff['mrr@10']:+.4f} ± {diff['se']:.4f})" if diff else ""
            cells.append(f"{u:.3f} -> {t:.3f} | {t - u:+.3f} | {task['fine_tuned']['hybrid']['mrr@10']:.3f}{paired}")
        rows.append(f"| {machine} | {r['preset']} | {r['steps']} | {r.get('seed', 0)} "
                    f"| {run_label(r)} | {r['queries']} | {' | '.join(cells)} |")
    if not rows:
        return []
    from recipes.xtr_lora_config import PRESETS

    quick, full = (f"{PRESETS[p].train.steps:,}" for p in ("quick", "full"))
    means = setting_means(runs)
    return ["### Retriever quality over seeds and presets (benchmarks/xtr_heldout_packages.py)", "",
            "Mean over seeds of the gain in semantic MRR@10 over the untrained model (settings run on 3 seeds or "
            "more); the last column counts the runs whose hybrid MRR@10 >= semantic on both held-out sets. "
            "Batch: the pairs one InfoNCE sees (a micro-batch, or every pair of a step with `--train.grad_cache`).",
            "Libraries: the training sources (the standard library and PyPI packages; 7 by default, 23 with "
            "`pypi_sources.WIDE_PACKAGES`, the `full` preset's since its 400-step runs: their held-out files differ, "
            "capped at 15,000 candidates), then the learning rate and any temperature other than the presets' 0.03.",
            "", *MEANS_HEADER, *means, "",
            "Run by run: semantic MRR@10 of the untrained -> fine-tuned model, its gain, and the fine-tuned hybrid "
            "(with, where recorded, hybrid minus semantic ± the standard error of the paired per-query difference), "
            "on the held-out packages (never trained on) and the held-out files. Rows record the preset as it was "
            f"run (its steps here; every setting in the JSON's `command`); the current `quick` is {quick} steps, `full` "
            f"{full}. The cpu and h100/h200 runs differ in data: the GPU hosts' Python 3.12 standard library "
            "yields other pairs than 3.11's.", "",
            "| machine | preset | steps | seed | libraries, settings | hard negatives | batch | dev evaluation | package queries "
            "| packages: semantic | gain | hybrid | files: semantic | gain | hybrid |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|", *rows, ""]


def retriever_run_table(results: dict) -> list[str]:
    """An xtr_lora run's eval.json as a table over both tasks: BM25, the untrained and the
    fine-tuned model (semantic MaxSim, hybrid with BM25), the single-vector view."""
    keys = (("p@1", "P@1"), ("mrr@10", "MRR@10"), ("recall@10", "Recall@10"), ("ndcg@10", "nDCG@10"))
    out = ["| task | model / mode | " + " | ".join(k for _, k in keys) + " |", "|---|---|" + "---|" * len(keys)]
    tasks = [("held-out packages", results.get("heldout_packages")), ("held-out files", results)]
    for task, entry in tasks:
        if not entry:
            continue
        rows = [("BM25", entry["bm25"])]
        for model in ("untrained", "fine-tuned"):
            if model in entry:
                rows += [(f"{model} semantic", entry[model]["semantic"]),
                         (f"{model} hybrid ({entry[model].get('hybrid_fusion', 'rrf')})", entry[model]["hybrid"])]
        if "single-vector view" in entry:
            rows.append(("single-vector view (sentence-transformers)", entry["single-vector view"]["semantic"]))
        for i, (name, m) in enumerate(rows):
            out.append(f"| {task if i == 0 else ''} | {name} | " + " | ".join(f"{m[k]:.3f}" for k, _ in keys) + " |")
    return out


def default_run_section() -> list[str]:
    """The README's table of what `make train` gives (cpu/xtr_quick.json: the eval.json of a default
    run on a 2-core CPU)."""
    out = []
    x = load("cpu", "xtr_quick")
    if x:
        run, data = x["run"], x["data"]
        pkg = x.get("heldout_packages", {})
        out += [f"**Retriever** (`{run['command']}`, seed {run['seed']}): {data['train_pairs']:,} training pairs, "
                f"{run['steps']} steps x {run['micro_batch'] * run['accum']} pairs; held-out files: "
                f"{run['queries']} test queries over {run['candidates']:,} candidates; held-out packages "
                f"({', '.join(pkg.get('packages', []))}, never trained on): {pkg.get('queries', 0)} queries over "
                f"{pkg.get('candidates', 0):,} candidates. The recipe took {run['wall_s'] / 60:.1f} min "
                "(training " + f"{run['phases']['train']['wall_s'] / 60:.1f} min) on a 2-core CPU.", "",
                *retriever_run_table(x), ""]
    return out
