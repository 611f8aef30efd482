"""Every table of results in the README and docs/performance.md, generated from the committed
result JSONs under benchmarks/results/<machine>/ (so no figure is narrated by hand or drifts).

Writes the text between the GENERATED markers of README.md (what the default runs give) and of
docs/performance.md (every benchmark), and benchmarks/results/chart.png (MLX / PyTorch ratios).

A benchmark renders its own section (`results_section()` in benchmarks/<name>.py: cpu_blas,
cpu_malloc, memory_features, cold_start, worker_overhead, search_scale, search_serve,
search_batch, judge_auc, rlaif_learning, quantization_llm, generation; the RLAIF step's in
make_table_rlaif); this module collects them in order, with the sections that still read several
result files together (the retriever's step and runs, training, targets, held-out packages).

    python -m benchmarks.make_table
"""

from __future__ import annotations

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # first: MLX's CPU BLAS is chosen when mlx.core loads (mlxio.runtime)

import argparse
from pathlib import Path

from benchmarks import (
    cold_start,
    cpu_blas,
    cpu_malloc,
    generation,
    judge_auc,
    make_table_rlaif,
    memory_features,
    quantization_llm,
    rlaif_learning,
    search_batch,
    search_scale,
    search_serve,
    worker_overhead,
)
from benchmarks.common import RESULTS, ci, fmt, load


def times(ratio: float | None) -> str:
    """A ratio as "1.23x", or "-" when one side was not measured."""
    return "-" if ratio is None else f"{fmt(ratio, 2)}x"


def first_steps_s(run: dict | None) -> float | None:
    """Seconds a child took for its first `check_steps` identical steps, kernel compilation
    (MLX's NVRTC, torch.compile's Inductor) included, with the kernel caches as that run found
    them (often warm from an earlier run on the machine): not a fresh machine's cold start."""
    if run is None or "error" in run:
        return None
    return (run.get("check") or {}).get("seconds")


def retriever_section(machine: str, data: dict, bars: list, name: str = "retriever") -> list[str]:
    runs = {(r["model"], r["batch"], r["framework"]): r for r in data["runs"]}
    keys = sorted({(m, b) for m, b, _ in runs}, key=lambda k: (k[0], k[1]))
    checked = any("agreement" in r for r in data["runs"])
    out = [f"### Retriever training step and encoding, {machine} ({data['settings']['dtype']}"
           f"{', ' + data['gpu'] if data.get('gpu') else ''}; {name}.json"
           f"{', both sides checked to take the same steps' if checked else ', before the agreement check'})", "",
           "| model | batch | step pairs/s MLX | PyTorch eager | torch.compile | MLX / eager | MLX / compile "
           "| MLX MFU | peak GB MLX / eager | encode docs/s MLX | encode eager (SDPA) | encode compile "
           "| encode MLX / eager | first 5 steps s incl. compilation, caches as found: MLX / eager / compile |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for model, batch in keys:
        m, t, c = (runs.get((model, batch, f)) for f in ("mlx", "torch", "torch_compile"))

        def get(r, k):
            return None if r is None or "error" in r else r.get(k)

        def ratio(a, b, k):
            x, y = get(a, k), get(b, k)
            return None if x is None or y is None else x / y

        step_e, step_c = ratio(m, t, "step_samples_per_s"), ratio(m, c, "step_samples_per_s")
        enc_e = ratio(m, t, "encode_samples_per_s")
        mfu = get(m, "step_mfu")
        peaks = [get(r, "step_peak_bytes") or get(r, "process_max_rss_bytes") for r in (m, t)]
        out.append(
            f"| {model} | {batch} | {fmt(get(m, 'step_samples_per_s'), 1)} | {fmt(get(t, 'step_samples_per_s'), 1)} "
            f"| {fmt(get(c, 'step_samples_per_s'), 1)} | {times(step_e)} | {times(step_c)} "
            f"| {fmt(mfu * 100 if mfu else None, 1)}% | {' / '.join(fmt(p / 1e9 if p else None, 1) for p in peaks)} "
            f"| {fmt(get(m, 'encode_samples_per_s'), 1)} | {fmt(get(t, 'encode_samples_per_s'), 1)} "
            f"| {fmt(get(c, 'encode_samples_per_s'), 1)} | {times(enc_e)} "
            f"| {' / '.join(fmt(first_steps_s(r), 1) for r in (m, t, c))} |")
        for label, val in ((f"{machine} {model} b{batch} step vs eager", step_e),
                           (f"{machine} {model} b{batch} step vs compile", step_c),
                           (f"{machine} {model} b{batch} encode vs eager", enc_e)):
            if val:
                bars.append((label, val))
    errors = [f"{k[0]} b{k[1]} {k[2]}: {r['error'][:80]!r}" for k, r in runs.items() if "error" in r]
    if errors:
        out += ["", "Not measured: " + "; ".join(errors)]
    for key, note in (data.get("notes") or {}).items():
        out += ["", f"- {key}: {note}"]
    load = data.get("load_avg_before")
    if load and machine == "cpu":
        busy = max(load[0], data["load_avg_after"][0]) > 3.0  # 2 cores: above ~3, other jobs shared them
        out += ["", f"CPU load average during the run: {load[0]:.1f} (before) / {data['load_avg_after'][0]:.1f} "
                "(after) on 2 cores" + (" shared with other jobs: CPU figures are noisy." if busy else ".")]
    return out + [""]


def other_sections() -> list[str]:
    out = []
    s = load("h200x2", "scaling")
    if s and "speedup" in s:
        rows = {r["world"]: r for r in s["runs"] if "samples_per_s" in r}
        out += ["### Data-parallel scaling (h200x2, mx.distributed NCCL, t5-base bf16)", "",
                "| GPUs | per-GPU batch | global batch | step ms | pairs/s | speedup | target |", "|---|---|---|---|---|---|---|"]
        for w, r in sorted(rows.items()):
            out.append(f"| {w} | {r['per_gpu_batch']} | {r['global_batch']} | {fmt(r['median_step_s'] * 1e3, 1)} "
                       f"| {fmt(r['samples_per_s'])} | {fmt(s['speedup'][str(w)], 2)}x | {'1.8x' if w == 2 else ''} |")
        out.append("")
    p = load("h200x2", "parity_minilm") or load("cpu", "parity_minilm")
    if p:
        st = p["settings"]
        out += [f"### Convergence parity ({st['steps']} steps, {st['model']}, batch {st['batch']}, float32)", "",
                f"Loss at step {st['steps']}: MLX {p['final_loss']['mlx']:.5f}, PyTorch {p['final_loss']['torch']:.5f}; "
                f"relative difference {p['final_rel_diff']:.2e} (target <= 1%: "
                f"{'met' if p['meets_target'] else 'missed'}); max over all steps {p['max_rel_diff']:.2e}. "
                "Curves: parity_minilm.png.", ""]
    cpu_rows = []
    e = load("cpu", "encode")
    if e:
        cpu_rows.append(f"| encoding, MiniLM real code (benchmarks/encode.py) | {fmt(e['median_tokens_per_s']['mlx'])} tok/s "
                        f"| {fmt(e['median_tokens_per_s']['torch'])} tok/s | {e['mlx_over_torch']:.2f}x |")
    d = load("cpu", "data_pipeline")
    if d:
        cpu_rows.append(f"| data pipeline, prefetch vs none (benchmarks/data_pipeline.py) | - | - "
                        f"| {d['prefetch_speedup']:.2f}x batches/s |")
    if cpu_rows:
        out += ["### Other CPU benchmarks", "", "| benchmark | MLX | PyTorch | ratio |",
                "|---|---|---|---|", *cpu_rows, ""]
    return out


def training_sections() -> list[str]:
    """RLAIF update step (h200, h100) and QAT vs PTQ on the retriever task (h100)."""
    out = []
    for machine in ("h200", "h100", "cpu"):
        r = load(machine, "rlaif_step")
        if not r:
            continue
        for section in r["sections"].values():
            st = section["settings"]
            out += [f"### RLAIF update step ({machine}, {st['shape']} shape, {st['dtype']}, {st['rows']} rows x "
                    f"{st['prompt_len']}+{st['completion_len']} tokens, micro-batch {st['micro_batch']}, {st['loss']}; "
                    "rlaif_step.json)", "", f"`{section['command']}`", "",
                    "| framework | step s | tokens/s | peak GB | same steps as MLX | MLX / this |", "|---|---|---|---|---|---|"]
            ref = next((fw for fw, run in section["runs"].items() if fw.startswith("mlx") and "_qlora" not in fw
                        and "error" not in run), None)
            for fw, run in section["runs"].items():
                if "error" in run:
                    out.append(f"| {fw} | failed: {run['error'][:80]} | | | | |")
                    continue
                agreed = {True: "yes", False: "no"}.get((run.get("agreement") or {}).get("ok"), "")
                ratio = section["ratios"].get(f"{ref}_over_{fw}")
                out.append(f"| {fw} | {run['median_s']:.3f} | {fmt(run['tokens_per_s'])} "
                           f"| {fmt((run.get('peak_bytes') or 0) / 1e9, 1)} | {agreed} | {times(ratio)} |")
            out.append("")
            out += step_phases(section["runs"])
        for key, text in r.get("notes", {}).items():
            out += [f"{key}: {text}", ""]
        for key, section in ((load(machine, "rlaif_step_profile") or {}).get("sections") or {}).items():
            out += [f"Profile run ({key}; rlaif_step_profile.json): `{section['command']}`", ""]
            out += step_phases(section["runs"])
    q = load("h100", "quantization_qat")
    if q:
        out += ["### QAT vs PTQ (retriever, all-MiniLM-L6-v2, quick task, MRR@10; benchmarks/results/h100/quantization_qat.json)", "",
                "| weights | linear compression | float fine-tune | PTQ | QAT then PTQ | share of PTQ's loss recovered |",
                "|---|---|---|---|---|---|"]
        for name, v in q["summary"].items():
            out.append(f"| {name} | {v['linear_compression']:.1f}x | {v['float']:.3f} | {v['ptq']:.3f} "
                       f"| {v['qat_then_ptq']:.3f} | {v['recovered_share'] * 100:.0f}% |")
        out += ["", q["note"], ""]
    return out


def step_phases(runs: dict) -> list[str]:
    """The rows' steps split into phases (`rlaif_step --profile`), ms, when measured."""
    split = {fw: run["phases"] for fw, run in runs.items() if run.get("phases")}
    if not split:
        return []
    cols = ("forward_ms", "backward_ms", "optimizer_ms", "step_ms")
    return ["Where the step's time goes (`--profile`: each phase timed alone between barriers; backward = "
            "forward+backward - forward, optimizer = step - forward+backward), ms:", "",
            "| framework | forward | backward | clip + optimizer | step |", "|---|---|---|---|---|",
            *(f"| {fw} | " + " | ".join(f"{p[c]:.1f}" if c in p else "" for c in cols) + " |" for fw, p in split.items()),
            ""]


def rlaif_speed_section(machine: str = "h200") -> list[str]:
    """The RLAIF recipe's own speed (`<machine>/rlaif_recipe_speed.json`, dev/gpu/rlaif_speed.sh):
    each run's steps against the targets, and the cold start (`cold_start_rlaif.json`)."""
    out = []
    for name in ("rlaif_recipe_speed", "cold_start_rlaif"):
        data = load(machine, name)
        for label, run in ((data or {}).get("runs") or {}).items():
            if not isinstance(run, dict):
                continue
            if "summary" not in run:  # a run cut off: what it reached, as recorded
                out += [f"### RLAIF recipe speed ({machine}, run `{label}`; {name}.json)", "", f"`{run['command']}`",
                        "", run.get("note", "no summary recorded"), ""]
                continue
            sm = run["summary"]
            out += [f"### RLAIF recipe speed ({machine}, run `{label}`; {name}.json)", "", f"`{run['command']}`", "",
                    "| to step 1's end s | step 1 s | median later step s | max later step s | spikes | "
                    "gen s | reward wait s | update s | gen tokens/s | engine tokens/s | decode ms/step by rows |",
                    "|---|---|---|---|---|---|---|---|---|---|---|",
                    f"| {fmt(sm.get('to_first_step_end_s'), 1)} | {fmt(sm.get('first_step_s'), 2)} "
                    f"| {fmt(sm.get('median_later_step_s'), 2)} | {fmt(sm.get('max_later_step_s'), 2)} "
                    f"| {', '.join(map(str, sm.get('spikes_after_step_1') or [])) or 'none'} "
                    f"| {fmt(sm.get('median_gen_s'), 2)} | {fmt(sm.get('median_reward_s'), 2)} "
                    f"| {fmt(sm.get('median_update_s'), 2)} | {fmt(sm.get('median_gen_tokens_per_s'))} "
                    f"| {fmt(sm.get('engine_tokens_per_s'))} "
                    f"| {', '.join(f'{b}: {ms:.2f}' for b, ms in (sm.get('decode_ms_per_step_by_batch') or {}).items())} |",
                    ""]
    return out


def rlaif_speed_goals(machine: str) -> list[tuple[str, float | None, float]]:
    """Issue 48's targets as (goal, measured, target) rows with larger = better: the update step
    against torch.compile + logits_to_keep (agreement-checked), `--preset gpu`'s generation and
    steps (`rlaif_recipe_speed.json`'s last run) and the cold start's first step."""
    m = machine.upper()
    step = (load(machine, "rlaif_step") or {}).get("sections", {})
    speed = list(((load(machine, "rlaif_recipe_speed") or {}).get("runs") or {}).values())
    cold = list(((load(machine, "cold_start_rlaif") or {}).get("runs") or {}).values())
    runs = (load(machine, "rlaif_recipe_speed") or {}).get("runs") or {}
    sm = (runs.get("after48") or (speed[-1] if speed else {})).get("summary", {})  # the preset as it is
    gen, engine, steady = sm.get("median_gen_tokens_per_s"), sm.get("engine_tokens_per_s"), sm.get("median_later_step_s")
    # a run cut off before its first step counts as its limit (the time is at least that)
    first = (cold[-1].get("summary", {}).get("to_first_step_end_s") or cold[-1].get("cut_at_s")) if cold else None
    return [
        *((f"{m} RLAIF update step {key.split('_')[0]} vs torch.compile + logits_to_keep (agreement-checked)",
           sec["ratios"].get("mlx_over_torch_compile_keep"), 1.0) for key, sec in step.items()),
        (f"{m} --preset gpu generation tokens/s / 10k", gen / 1e4 if gen else None, 1.0),
        (f"{m} --preset gpu generation / (decode engine / 1.5)", gen * 1.5 / engine if gen and engine else None, 1.0),
        (f"{m} --preset gpu steady step: 1 s / median step", 1.0 / steady if steady else None, 1.0),
        (f"{m} cold start: 60 s / time to step 1's end (empty kernel cache; a cut-off run: its limit)",
         60.0 / first if first else None, 1.0)]


def _ratio(data, model, batch, kind, peer):
    for r in (data or {}).get("ratios", []):
        if (r["model"], r["batch"], r["kind"], r["peer"]) == (model, batch, kind, peer):
            return r["mlx_over_peer"]
    return None


def _mfu(data, model, batch):
    for r in (data or {}).get("runs", []):
        if (r["model"], r["batch"], r["framework"]) == (model, batch, "mlx"):
            return r.get("step_mfu")
    return None


def targets() -> list[str]:
    """The project's performance goals, each read off the JSONs: reached, or missed and by how much."""
    h, c = load("h100", "retriever"), load("cpu", "retriever")
    g, s = load("h100", "generation"), load("h200x2", "scaling")
    gen64 = min((r.get("static_over_torch", r.get("mlx_over_torch")) for r in (g or {}).get("runs", [])
                 if r["batch"] == 64), default=None)
    gen_old = min((r["static_over_batch"] for r in (g or {}).get("runs", []) if "static_over_batch" in r), default=None)
    checked = load("h100", "retriever_minilm_b128")
    checks = [
        ("H100 retriever step t5-base b128 vs PyTorch eager", _ratio(h, "t5-base", 128, "step", "torch"), 1.5),
        ("H100 retriever step t5-base b128 vs torch.compile", _ratio(h, "t5-base", 128, "step", "torch_compile"), 1.0),
        ("H100 retriever step t5-base b128 MFU", _mfu(h, "t5-base", 128), 0.35),
        ("H100 retriever step t5-base b128 MFU, stretch goal", _mfu(h, "t5-base", 128), 0.45),
        ("H100 retriever step minilm b128 vs torch.compile (agreement-checked run)",
         _ratio(checked, "minilm", 128, "step", "torch_compile"), 1.0),
        ("H100 encoding t5-base b128 vs PyTorch SDPA", _ratio(h, "t5-base", 128, "encode", "torch"), 1.0),
        ("H100 encoding minilm b128 vs PyTorch SDPA (agreement-checked run)",
         _ratio(checked, "minilm", 128, "encode", "torch") or _ratio(h, "minilm", 128, "encode", "torch"), 1.0),
        ("H100 encoding minilm b128 vs torch.compile (for scale, not a goal)",
         _ratio(checked, "minilm", 128, "encode", "torch_compile"), 1.0),
        ("H100 generation batch 64 vs transformers generate (worst shape)", gen64, 2.0),
        ("H100 decode batch 64, static engine vs mlx-lm BatchGenerator (qwen2.5-0.5b)", gen_old, 2.0),
        ("CPU retriever step minilm b12 vs PyTorch eager", _ratio(c, "minilm", 12, "step", "torch"), 1.0),
        ("CPU retriever step minilm b12 vs torch.compile", _ratio(c, "minilm", 12, "step", "torch_compile"), 1.0),
        ("CPU encoding MiniLM, 2,000 code snippets (benchmarks/encode.py)",
         (load("cpu", "encode") or {}).get("mlx_over_torch"), 1.0),
        ("2 x H200 data-parallel speedup", (s or {}).get("speedup", {}).get("2"), 1.8),
        *rlaif_speed_goals("h200"),
        ("QAT recovers PTQ's loss, 2-bit retriever (share)",
         (load("h100", "quantization_qat") or {}).get("summary", {}).get("2bit_g64", {}).get("recovered_share"), 0.5),
    ]
    out = ["### Goals", "", "| goal | measured | target | status |", "|---|---|---|---|"]
    for name, val, goal in checks:
        short = None if val is None else (1 - val / goal) * 100
        status = ("not measured" if val is None else "reached" if val >= goal
                  else f"missed by {short:.2g}% (parity)" if short < 1 else f"missed by {short:.0f}%")
        digits = 3 if goal < 1 else 2  # shares (MFU 0.355) need the third digit
        out.append(f"| {name} | {fmt(val, digits) if val is not None else '-'} | {goal} | {status} |")
    return out + [""]


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


def default_run_sections() -> list[str]:
    """What `make train` and `make rlaif` give (cpu/xtr_quick.json, cpu/rlaif_quick.json: each the
    eval.json of a default run on a 2-core CPU)."""
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
    out += make_table_rlaif.arms_section("h200")
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


def heldout_packages_section() -> list[str]:
    """The retriever's gain over the untrained model, run by run (seeds, presets, hard negatives,
    contrastive batch), and the mean over seeds of each setting run on 3 or more."""
    rows, groups = [], {}
    for machine, r in heldout_runs():
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
        key = (machine, r["preset"], r["steps"], run_label(r).split(", best")[0])
        groups.setdefault(key, {})[r.get("seed", 0)] = _gains(r)  # a seed run again: its last entry
    if not rows:
        return []
    from recipes.xtr_lora_config import PRESETS

    quick, full = (f"{PRESETS[p].train.steps:,}" for p in ("quick", "full"))
    means = []
    for (machine, preset, steps, label), by_seed in groups.items():
        got = [g for g in by_seed.values() if g[0] is not None]
        if len(got) < 3:
            continue
        pkg, files = (sum(g[i] for g in got) / len(got) for i in (0, 1))
        means.append(f"| {machine} | {preset} | {steps} | {label} | {len(got)} | {pkg:+.3f} | {files:+.3f} "
                     f"| {sum(g[2] for g in got)} of {len(got)} |")
    return ["### Retriever quality over seeds and presets (benchmarks/xtr_heldout_packages.py)", "",
            "Mean over seeds of the gain in semantic MRR@10 over the untrained model (settings run on 3 seeds or "
            "more); the last column counts the runs whose hybrid MRR@10 >= semantic on both held-out sets. "
            "Batch: the pairs one InfoNCE sees (a micro-batch, or every pair of a step with `--train.grad_cache`).",
            "Libraries: the training sources (the standard library and PyPI packages; 7 by default, 23 with "
            "`pypi_sources.WIDE_PACKAGES`, the `full` preset's since its 400-step runs: their held-out files differ, "
            "capped at 15,000 candidates), then the learning rate and any temperature other than the presets' 0.03.",
            "", "| machine | preset | steps | libraries, settings | hard negatives | batch | dev evaluation | seeds | packages gain "
            "| files gain | hybrid >= semantic |", "|---|---|---|---|---|---|---|---|---|---|---|", *means, "",
            "Run by run: semantic MRR@10 of the untrained -> fine-tuned model, its gain, and the fine-tuned hybrid "
            "(with, where recorded, hybrid minus semantic ± the standard error of the paired per-query difference), "
            "on the held-out packages (never trained on) and the held-out files. Rows record the preset as it was "
            f"run (its steps here; every setting in the JSON's `command`); the current `quick` is {quick} steps, `full` "
            f"{full}. The cpu and h100/h200 runs differ in data: the GPU hosts' Python 3.12 standard library "
            "yields other pairs than 3.11's.", "",
            "| machine | preset | steps | seed | libraries, settings | hard negatives | batch | dev evaluation | package queries "
            "| packages: semantic | gain | hybrid | files: semantic | gain | hybrid |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|", *rows, ""]


ROOT = RESULTS.parent.parent
BEGIN, END = "<!-- GENERATED:BEGIN (python -m benchmarks.make_table) -->", "<!-- GENERATED:END -->"


def splice(path: Path, lines: list[str]) -> None:
    """Replace the text between `path`'s GENERATED markers with `lines`."""
    text = path.read_text()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{path}: no {BEGIN} ... {END} markers to write between")
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    path.write_text(f"{head}{BEGIN}\n" + "\n".join(lines).strip("\n") + f"\n{END}{tail}")


def performance_sections(bars: list) -> list[str]:
    lines = []
    for machine, name in (("h100", "retriever_minilm_b128"), ("h100", "retriever"), ("cpu", "retriever")):
        r = load(machine, name)
        if r:
            lines += retriever_section(machine, r, bars, name)
    for machine in ("h200", "h100"):
        g = load(machine, "generation")
        if g:
            lines += generation.results_section(machine, g, bars)
    lines += training_sections()
    lines += rlaif_speed_section()
    lines += other_sections()
    lines += quantization_llm.results_section()
    lines += memory_features.results_section()
    lines += cpu_blas.results_section()
    lines += cpu_malloc.results_section()
    lines += cold_start.results_section()
    lines += worker_overhead.results_section()
    lines += search_scale.results_section()
    lines += search_batch.results_section()
    lines += search_serve.results_section()
    lines += heldout_packages_section()
    lines += rlaif_learning.results_section()
    lines += judge_auc.results_section()
    lines += targets()
    return lines


def main(argv=None) -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    bars: list[tuple[str, float]] = []
    splice(ROOT / "README.md", default_run_sections())
    splice(ROOT / "docs" / "performance.md", performance_sections(bars))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 0.32 * len(bars) + 1.2))
    names, vals = zip(*bars, strict=True) if bars else ((), ())
    ax.barh(range(len(vals)), vals, color=["tab:green" if v >= 1 else "tab:red" for v in vals])
    ax.axvline(1.0, color="k", lw=0.8)
    ax.set_yticks(range(len(names)), names, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("MLX / PyTorch throughput (>1: MLX faster)")
    fig.tight_layout()
    fig.savefig(RESULTS / "chart.png", dpi=110)
    print("README.md, docs/performance.md, benchmarks/results/chart.png")


if __name__ == "__main__":
    main()
