"""The RLAIF recipe's own speed, step by step: wall time, generation tokens/s and the array
shapes each step meets for the first time (on a GPU a new shape compiles, so a step that meets
one takes several times a steady step: the figures in rlaif_recipe_speed.json and dev/LOG.md).

Runs `recipes.rlaif_qwen` (evaluation off unless asked for) with spies that see every shape
independently of the recipe's own `new_shapes` metric, and the same way in older code: the
prefill's batch and width (`rollout.prefill_batch`), the decode step's batch and cache slots
(`decode_fused.forward` / `StaticKVCache.make_mask`: traced once per shape when compiled), the
update's micro-batch (the loss, traced once per shape) and the eager frozen log-probs
(`grpo.frozen_logprobs`). A step is one `generate_group` call. Appends one labelled run to
benchmarks/results/<machine>/rlaif_recipe_speed.json: per step `step_s`, `gen_tokens_per_s`,
`new_shapes` (the spies' count) and the recipe's own records, and a summary against the
issue's targets (no spike after step 1, steady steps <= 1.0 s, generation within 2x of the
engine benchmark's tokens/s, `--engine-tokens-per-s` or `generation.json`'s static figure).

    python -m benchmarks.rlaif_recipe_speed --machine h100 --label after -- --preset gpu --train.steps 12
    python -m benchmarks.rlaif_recipe_speed --machine h100 --label before -- --preset gpu --train.steps 12 \
        --shapes.fixed false --shapes.min_decode_batch 64 --shapes.warm_up false
"""

from __future__ import annotations

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # first: MLX's CPU BLAS is chosen when mlx.core loads (mlxio.runtime)

import argparse
import json
import shlex
import statistics
import sys
import time
from pathlib import Path

from benchmarks.common import RESULTS, fmt, load, machine, versions
from mlxio.atomic import write_text_atomic

SPIKE = 2.0  # a step slower than this many times the median of the later steps is a spike


class Spies:
    """Shape keys seen per step (a step = a `generate_group` call), by what saw them."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()  # before the recipe is imported: to_step_end_s counts its imports
        self.step = 0
        self.first: dict[tuple, int] = {}  # key -> the step that first saw it
        self.calls: list[dict] = []  # per generate_group call: seconds, tokens, decode stats

    def see(self, *key) -> None:
        self.first.setdefault(key, self.step)

    def install(self):
        """Put the spies in place; returns a function that takes them out."""
        try:
            from mlxcore.models import decode_fused, decode_step
        except ImportError:  # (older trees, for a before / after comparison: the step in mlxio)
            from mlxio.rl import decode as decode_step
            from mlxio.rl import decode_fused
        from mlxio.rl import grpo, rollout

        # the recipe's loss comes from the library's grpo.make_loss, looked up when its step is built
        # (older trees built it in the recipe module: `main` then finds no update shape and says so)
        gen, prefill, forward = rollout.generate_group, rollout.prefill_batch, decode_fused.forward
        mask, frozen, make_loss = decode_step.StaticKVCache.make_mask, grpo.frozen_logprobs, grpo.make_loss

        def generate_group(*a, **k):
            self.step += 1
            t0 = time.perf_counter()
            ro = gen(*a, **k)
            self.calls.append({"seconds": time.perf_counter() - t0, "tokens": sum(map(len, ro.completion_tokens)),
                               "decode_stats": getattr(ro, "decode_stats", None)})
            if len(self.calls) > 1:  # the previous step ended when this one started
                self.calls[-2]["end_s"] = t0 - self.t0
            return ro

        def prefill_batch(model, prompts, *a, **k):
            caches = prefill(model, prompts, *a, **k)
            self.see("prefill", len(prompts), int(caches[0]._idx))
            return caches

        def fused_forward(spec, weights, tokens, kv, *a, **k):
            self.see("decode", tokens.shape[0], kv[0].shape[2])
            return forward(spec, weights, tokens, kv, *a, **k)

        def make_mask(cache, n, *a, **k):
            self.see("decode", cache.keys.shape[0], cache.keys.shape[2], n)
            return mask(cache, n, *a, **k)

        def frozen_logprobs(model, params, tokens, mask_, positions, chunk):
            self.see("frozen", tuple(tokens.shape), tuple(positions.shape))
            return frozen(model, params, tokens, mask_, positions, chunk)

        def counting_loss(*a, **k):
            loss = make_loss(*a, **k)

            def spied(lora, micro, key):
                self.see("update", tuple(micro["tokens"].shape), tuple(micro["positions"].shape))
                return loss(lora, micro, key)

            return spied

        spied = [(rollout, "generate_group", generate_group), (rollout, "prefill_batch", prefill_batch),
                 (decode_fused, "forward", fused_forward), (decode_step.StaticKVCache, "make_mask", make_mask),
                 (grpo, "frozen_logprobs", frozen_logprobs), (grpo, "make_loss", counting_loss)]
        originals = [(owner, name, getattr(owner, name)) for owner, name, _ in spied]
        for owner, name, fn in spied:
            setattr(owner, name, fn)
        return lambda: [setattr(owner, name, fn) for owner, name, fn in originals]

    def new_per_step(self, steps: int) -> list[dict]:
        out = [{} for _ in range(steps + 1)]  # index 0: before the first step (warm-up, evaluation)
        for key, step in self.first.items():
            if step <= steps:
                out[step][key[0]] = out[step].get(key[0], 0) + 1
        return out


def summary(steps: list[dict], engine_tps: float | None, before: int) -> dict:
    """Figures against issue 33 item 5's targets (steps after the first); `before`: the shapes
    met before step 1 (a warm-up's)."""
    later = steps[1:]
    times = [s["step_s"] for s in later]
    gen = [s["gen_tokens_per_s"] for s in later if s.get("gen_tokens_per_s")]
    med = statistics.median(times) if times else None
    by_batch: dict[str, list] = {}  # batch size -> [steps, seconds] over the later steps
    for s in later:
        for b, (n, sec) in s.get("decode_by_batch", {}).items():
            by_batch[b] = [by_batch.get(b, [0, 0.0])[0] + n, by_batch.get(b, [0, 0.0])[1] + sec]
    out = {"first_step_s": steps[0]["step_s"] if steps else None,
           "to_first_step_end_s": steps[0].get("to_step_end_s") if steps else None,  # imports, setup, warm-up included
           "max_later_reward_s": max((s.get("reward_s") or 0.0 for s in later), default=None),
           "median_later_step_s": med, "max_later_step_s": max(times) if times else None,
           "spikes_after_step_1": [s["step"] for s in later if med and s["step_s"] > SPIKE * med],
           "new_shapes_after_step_1": sum(s["new_shapes"] for s in later),
           "distinct_shapes": before + sum(s["new_shapes"] for s in steps), "shapes_before_step_1": before,
           "median_gen_tokens_per_s": statistics.median(gen) if gen else None,
           "engine_tokens_per_s": engine_tps,
           "decode_ms_per_step_by_batch": {b: 1e3 * sec / n for b, (n, sec) in by_batch.items() if n}}
    for key in ("decode_steps", "decode_row_steps", "gen_ms_per_decode_step", "gen_s", "reward_s", "update_s"):
        values = [s[key] for s in later if s.get(key) is not None]
        if values:
            out[f"median_{key}"] = statistics.median(values)
    if med is not None:
        out["targets"] = {
            "no_new_shape_after_step_1": out["new_shapes_after_step_1"] == 0,
            "steady_step_le_1s": med <= 1.0,
            "gen_within_2x_of_engine": (None if engine_tps is None or out["median_gen_tokens_per_s"] is None
                                        else out["median_gen_tokens_per_s"] * 2 >= engine_tps)}
    return out


def engine_figure(machine_name: str) -> float | None:
    """The static engine's tokens/s in results/<machine>/generation.json (its first run), if any."""
    path = RESULTS / machine_name / "generation.json"
    if not path.exists():
        return None
    runs = json.loads(path.read_text()).get("runs") or []
    return next((r["static_tokens_per_s"] for r in runs if r.get("static_tokens_per_s")), None)


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    cut = argv.index("--") if "--" in argv else len(argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--machine", default="cpu", help="results/<machine>/rlaif_recipe_speed.json")
    ap.add_argument("--label", required=True, help="this run's name in the JSON (e.g. before, after)")
    ap.add_argument("--out", default=None, help="JSON to add the run to (default: results/<machine>/...)")
    ap.add_argument("--engine-tokens-per-s", type=float, default=None,
                    help="the decode benchmark's tokens/s to compare with (default: generation.json's)")
    ap.add_argument("--with-eval", action="store_true", help="keep the recipe's evaluation before / after")
    args = ap.parse_args(argv[:cut])
    recipe_args = argv[cut + 1:]
    recipe_args = ["--train.log_every", "1", *recipe_args]  # a record per step (a later flag wins)
    if not args.with_eval:
        recipe_args = ["--eval.before", "false", "--eval.after", "false", *recipe_args]
    spies = Spies()
    remove = spies.install()
    from recipes import rlaif_qwen

    t0 = time.perf_counter()
    try:
        results = rlaif_qwen.main(recipe_args + ["--overwrite"])
    finally:
        remove()
    wall = time.perf_counter() - t0
    out_dir = Path(results["config"]["out_dir"])
    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    records = [r for r in records if "step" in r and "step_s" in r]
    new = spies.new_per_step(len(records))
    if records and not any(key[0] == "update" for key in spies.first):
        raise RuntimeError("the loss spy saw no update step: this tree builds the recipe's loss other than "
                           "through mlxio.rl.grpo.make_loss, so its update shapes would go uncounted")
    steps = []
    for r, call in zip(records, spies.calls, strict=False):
        found = new[r["step"]]
        steps.append({"step": r["step"], "step_s": r["step_s"], "gen_tokens_per_s": r.get("gen_tokens_per_s"),
                      "gen_s": call["seconds"], "completion_tokens": call["tokens"],
                      "new_shapes": sum(found.values()), "new_shapes_by_kind": found,
                      "recipe_new_shapes": r.get("new_shapes"),
                      "to_step_end_s": call.get("end_s"),
                      **{k: r[k] for k in ("decode_steps", "decode_row_steps", "reward_s", "update_s", "truncated")
                         if k in r}})
        if r.get("decode_steps"):  # generation's wall time per decode step (prefill and stop checks included)
            steps[-1]["gen_ms_per_decode_step"] = 1e3 * call["seconds"] / r["decode_steps"]
        stats = call["decode_stats"] or {}
        if stats.get("steps_by_batch"):  # the decode loop's ms per step at each batch size it ran
            steps[-1]["decode_by_batch"] = {str(b): [n, stats["seconds_by_batch"][b]]
                                            for b, n in sorted(stats["steps_by_batch"].items(), reverse=True)}
    engine_tps = args.engine_tokens_per_s or engine_figure(args.machine)
    run = {"command": "python -m benchmarks.rlaif_recipe_speed " + shlex.join(argv), "wall_s": wall,
           "before_step_1": new[0], "steps": steps, "summary": summary(steps, engine_tps, sum(new[0].values()))}
    path = Path(args.out) if args.out else RESULTS / args.machine / "rlaif_recipe_speed.json"
    old = json.loads(path.read_text()) if path.exists() else {"benchmark": "rlaif_recipe_speed", "runs": {}}
    old["runs"][args.label] = {"machine": machine(), "versions": versions(), **run}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(old, indent=1) + "\n")
    print(json.dumps({args.label: run["summary"]}, indent=1))
    return run


def results_section(machine: str = "h200") -> list[str]:
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


def goals(machine: str) -> list[tuple[str, float | None, float]]:
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


if __name__ == "__main__":
    main()
