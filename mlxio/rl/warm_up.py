"""Every planned shape of an RLAIF step run once before step 1 (`--shapes.warm_up`), so a GPU
compiles them there and no later step waits for a compilation.

`shapes` (the plan, `mlxio.rl.shapes.plan`) lists the prefill, the decode batch sizes and the
update widths. The decode side prefills `plan.prompts` dummy prompts at the planned width and
decodes a few steps through every size of the decode ladder (rows are made to end so the
batch compacts as in a rollout, `mlxio.rl.decode.decode`), with the step a rollout of these
settings reuses (same sampler key, compiled or not). The update side builds a dummy batch at
each planned width (`grpo.build_batch`: the frozen log-probs at that shape too) and runs the
training step on it; its new parameters and optimizer state are dropped (the step is pure), and
MLX's global PRNG is left as a rollout reseeds it anyway. With a one-graph update only full
steps (k = accum micro-batches) are run.
"""

from __future__ import annotations

import logging
import time

import mlx.core as mx
import numpy as np

from mlxcore.models import decode_step
from mlxio.rl import decode, grpo, rollout
from mlxio.rl.shapes import ShapePlan, update_key

log = logging.getLogger(__name__)


def decode_shapes(model, plan: ShapePlan, temperature: float, top_p: float, compiled: bool) -> tuple:
    """Prefill `plan.prompts` prompts at `plan.prompt_width` and decode through every size of
    `plan.decode_batches` (a step or two each). Returns the shape keys run (`Rollouts.shapes`)."""
    n, ladder = plan.decode_batches[0], plan.decode_batches
    width = plan.prompt_width
    prefilled = rollout.prefill_batch(model, [[0] * width] * plan.prompts, mx.default_device().type == mx.gpu, width)
    group = n // plan.prompts
    caches = decode_step.static_cache_rows(prefilled, [i // group for i in range(n)], plan.cache_slots)
    del prefilled
    # rows below ladder[j] (and not below ladder[j + 1]) end after j + 1 tokens: read one step
    # behind, the batch then compacts to the next size after each step
    ends = np.zeros(n, int)
    for j, size in enumerate(ladder):
        ends[:size] = j + 1
    got = np.zeros(n, int)

    def done(i: int, new: list[int]) -> int | None:
        got[i] += len(new)
        return len(new) if got[i] >= ends[i] else None

    _, _, _, stats = decode.decode(model, decode_step.row_sampler(temperature, top_p, n), [0] * n, caches,
                                   len(ladder) + 1, done, sync_every=1, sampler_key=(temperature, top_p, n),
                                   compiled=compiled, batches=ladder)
    return (("prefill", plan.prompts, width), *(("decode", b, plan.cache_slots) for b in stats["batches"]))


def update_shapes(model, params, step_fn, opt_state, plan: ShapePlan, settings: dict, one_process: bool) -> tuple:
    """Run the training step on a dummy batch at each planned width (results dropped); settings:
    `grpo.build_batch`'s keyword arguments. Returns the shape keys run (`mlxio.rl.shapes.update_key`)."""
    rows = plan.micro * plan.accum
    keys = []
    for width in plan.update_widths:
        completion = min(settings["max_new_tokens"], width - 1, plan.positions_for(width) // plan.micro)
        prompt = width - completion  # (the scored positions fill the planned count)
        packed = {"tokens": np.zeros((rows, width), np.int32), "completion_mask": np.zeros((rows, width), np.float32),
                  "lengths": np.full(rows, width, np.int32), "prompt_lengths": np.full(rows, prompt, np.int32)}
        packed["completion_mask"][:, prompt:] = 1.0
        batch = grpo.build_batch(model, params, packed, np.zeros(rows, np.float32), np.ones(rows, bool), **settings,
                                 drop_empty=one_process, positions_width=plan.positions_for(width))
        mx.eval(step_fn(params, opt_state, batch, mx.array(0)))
        keys.append(update_key(batch, plan.one_graph))
    return tuple(keys)


def warm_up(policy, params, step_fn, opt_state, plan: ShapePlan, *, settings: dict, temperature: float,
            top_p: float, compiled: bool, one_process: bool, static_engine: bool) -> set:
    """Both sides (the decode side only for the static engine, sampling at `temperature` /
    `top_p`, its step `compiled` or not); returns the shape keys run."""
    t0 = time.perf_counter()
    keys = set()
    if static_engine:
        from mlxio.weights import llm_lora

        keys |= set(decode_shapes(llm_lora.bound_policy(policy, params).model, plan, temperature, top_p, compiled))
    keys |= set(update_shapes(policy.model, params, step_fn, opt_state, plan, settings, one_process))
    log.info("shape warm-up: %d shapes run in %.1f s", len(keys), time.perf_counter() - t0)
    return keys
