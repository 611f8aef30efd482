"""Memory-driven micro-batch size for the RLAIF update (`--memory.auto_batch`).

The step's completions are split into `train.accum` micro-batches, each evaluated in turn
(`memory.eval_micro_batches`), so the update's peak memory is the frozen model plus one
micro-batch's activations: a line in the micro-batch size. `plan` measures it in this process
at micro-batches of 1 and 2 full-length rows (prompt + max_new_tokens: the worst case), fits
`mlxio.run.batch_sizer.fit_line`, and takes the largest micro-batch dividing the step's
completions whose predicted peak fits 0.9 x the budget. Only sizes that any choice must fit
anyway are probed here (MLX aborts the process on a failed allocation, so a larger one is
never tried to see); `recheck` shrinks the choice after a step whose measured peak came
within 5% of the budget.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import mlx.core as mx
import numpy as np

from mlxcore.train import buckets
from mlxio.errors import ConfigError
from mlxio.rl.grpo import MemoryConfig
from mlxio.run import batch_sizer

log = logging.getLogger("mlxio")
PROBE_SIZES = (1, 2)
BatchOf = Callable[[dict, np.ndarray, np.ndarray], dict]  # (packed, advantages, valid rows) -> step batch


def full_length_rows(rows: int, prompt_len: int, new_tokens: int, vocab: int, seed: int = 0) -> dict:
    """A packed batch (`mlxcore.rl.packing.pack_tokens`' keys) of `rows` prompt + completion rows at full
    length: every completion `new_tokens` long, random ids."""
    rng = np.random.default_rng(seed)
    length = prompt_len + new_tokens
    width = buckets.bucket_width(length)
    tokens = np.zeros((rows, width), np.int32)
    tokens[:, :length] = rng.integers(1, vocab, (rows, length))
    mask = np.zeros((rows, width), np.float32)
    mask[:, prompt_len:length] = 1.0
    return {"tokens": tokens, "completion_mask": mask}


def peak_bytes(batch_of: BatchOf, params, step_fn, opt_state, micro: int, prompt_len: int, new_tokens: int,
               vocab: int) -> int:
    """Peak MLX memory of one update step (batch building included) at micro-batch `micro`."""
    packed = full_length_rows(micro, prompt_len, new_tokens, vocab)
    adv = np.random.default_rng(1).standard_normal(micro).astype(np.float32)
    mx.eval(params, opt_state)
    mx.clear_cache()
    mx.reset_peak_memory()
    start = time.perf_counter()
    batch = batch_of(packed, adv, np.ones(micro, bool))
    out = step_fn(params, opt_state, batch, mx.array(0))
    mx.eval(out)
    peak = mx.get_peak_memory()
    log.info("auto batch: micro-batch %d peaked at %.0f MB (%.1f s)", micro, peak / 2**20, time.perf_counter() - start)
    del out, batch
    mx.clear_cache()
    return peak


def plan(memory: MemoryConfig, batch_of: BatchOf, params, step_fn, opt_state, effective: int, prompt_len: int,
         new_tokens: int, vocab: int) -> batch_sizer.Plan:
    """The micro-batch (and accum = effective / micro) for `effective` completions per step of
    `prompt_len` + `new_tokens` tokens, within `memory`'s budget. `batch_of(packed, adv, valid)`:
    the update's batch of one micro-batch (`mlxio.rl.grpo.build_batch` with accum 1).
    ConfigError when even one full-length completion does not fit the budget."""
    if not memory.eval_micro_batches:
        raise ConfigError("memory.auto_batch: one graph for the whole step holds every micro-batch, "
                          "whatever their size", fix="set --memory.eval_micro_batches true")
    budget = batch_sizer.memory_budget(memory.budget_mb, memory.budget_fraction)
    sizes = [s for s in PROBE_SIZES if s <= effective]
    probes = tuple(batch_sizer.Probe(s, True, peak_bytes(batch_of, params, step_fn, opt_state, s, prompt_len,
                                                          new_tokens, vocab)) for s in sizes)
    fixed, per_sample = batch_sizer.fit_line([p.micro_batch for p in probes], [p.peak_bytes for p in probes])
    micro = batch_sizer.choose_micro_batch(effective, fixed, per_sample, budget, memory.max_micro_batch)
    if micro is None:
        raise ConfigError(f"memory.auto_batch: no micro-batch fits the budget of {budget / 2**20:.0f} MB "
                          f"(x0.9): {fixed / 2**20:.0f} MB fixed + {per_sample / 2**20:.0f} MB per completion of "
                          f"{prompt_len} + {new_tokens} tokens",
                          fix="raise --memory.budget_mb, lower --max_new_tokens, or set "
                              "--memory.gradient_checkpointing true")
    return batch_sizer.Plan(micro_batch=micro, accum=effective // micro, budget_bytes=budget, fixed_bytes=fixed,
                            per_sample_bytes=per_sample, probes=probes)


def recheck(found: batch_sizer.Plan, accum: int, effective: int, observed_peak: int) -> int:
    """train.accum for the next step: more micro-batches when the last step's peak came within
    5% of the budget (`batch_sizer.recheck`), else `accum` unchanged."""
    micro = effective // accum
    smaller = batch_sizer.recheck(found, micro, effective, observed_peak)
    if smaller == micro:
        return accum
    log.warning("auto batch: the update peaked at %.0f MB of a %.0f MB budget: micro-batch %d -> %d",
                observed_peak / 2**20, found.budget_bytes / 2**20, micro, smaller)
    return effective // smaller
