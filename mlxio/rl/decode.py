"""The static decode engine's host loop around `mlxcore.models.decode_step`'s compiled step.

`decode` picks the step for a model (`step_and_state`: `mlxcore.models.decode_fused`'s step for float
Llama / Qwen2 models on a GPU, else the mlx-lm forward on the static cache) and keeps it for
reuse across calls (`compiled_step`, `fused_step`); it queues `sync_every` steps at a time and
reads their tokens to the host one block behind the device (the next block is queued first),
checking EOS and stop conditions there. Rows that have ended keep decoding (their extra tokens
are dropped) until the live ones fit a smaller size of `batches` (`mlxcore.train.buckets.batch_ladder`:
N, then halving), when the live rows are gathered into a batch of that size
(`mlxcore.models.decode_step.take_rows`): a handful of shapes per run, each compiled once, and ended
rows stop costing compute (`row_steps`). With `mlxcore.models.decode_step.row_sampler` a row samples
the same tokens whatever rows share its batch. It times the host's share of each step (`stats`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import mlx.core as mx
import numpy as np

from mlxcore.models import decode_fused
from mlxcore.models.decode_step import (
    StaticKVCache,
    all_rows,
    decode_state,
    make_step,
    per_row,
    take_rows,
    token_array,
)

SYNC_EVERY = 16  # decode steps between host reads of the tokens (EOS / stop checks)


def compiled_step(model, sampler, sampler_key=None, compiled: bool = True) -> Callable:
    """`make_step(model, sampler)`, kept on the model (outside its parameter tree) under
    `sampler_key` (e.g. (temperature, top_p)) when one is given, so later calls with the same
    model skip tracing and compiling again; None: a new one."""
    if sampler_key is None:
        return make_step(model, sampler, compiled)
    steps = model.__dict__.setdefault("_static_decode_steps", {})
    if (sampler_key, compiled) not in steps:
        steps[sampler_key, compiled] = make_step(model, sampler, compiled)
    return steps[sampler_key, compiled]


_FUSED_STEPS: dict = {}  # (decode_fused.Spec, sampler_key, compiled) -> fused step
# Devices whose static step is the fused one by default: a GPU, where the step is host-bound and
# the attention is MLX's fused kernel. On the CPU MLX lowers attention to matmuls, and the fused
# step's mask-in-the-cache attention over 2 x 96-dim rows (`Spec.wide_attention`) is more
# work than the mlx-lm forward's masked 64-dim one (slower steps on a tiny Qwen2 shape).
FUSED_DEVICES = {mx.gpu}


def fused_step(spec: decode_fused.Spec, sampler, sampler_key=None, compiled: bool = True) -> Callable:
    """`decode_fused.make_fused_step(spec, sampler)`, kept per (spec, sampler_key) when a key is
    given: the weights are an argument, so every policy with the same architecture and RoPE
    module (a model and all its LoRA `bind`s) shares one trace."""
    if sampler_key is None:
        return decode_fused.make_fused_step(spec, per_row(sampler), compiled)
    key = (spec, sampler_key, compiled)
    if key not in _FUSED_STEPS:
        _FUSED_STEPS[key] = decode_fused.make_fused_step(spec, per_row(sampler), compiled)
    return _FUSED_STEPS[key]


def step_and_state(model, sampler, caches: list[StaticKVCache], sampler_key=None, fused: bool | None = None,
                   compiled: bool = True):
    """(step(tokens, state) -> (next, logprob, state), state) for decoding from `caches`: the
    fused step over the model's decode weights (`decode_fused`) where it applies and `fused`
    (None: on `FUSED_DEVICES`), else the compiled mlx-lm forward (`make_step`)."""
    if fused is None:
        fused = mx.default_device().type in FUSED_DEVICES
    spec = decode_fused.spec_of(model) if fused else None
    weights = decode_fused.decode_weights(model, spec) if spec is not None else None
    if weights is None:
        return compiled_step(model, sampler, sampler_key, compiled), decode_state(caches)
    first = caches[0]
    kv = [decode_fused.decode_cache(c.keys, c.values, first.left_padding, first.idx, spec) for c in caches]
    state = (kv, first.idx - first.left_padding, first.idx, all_rows(first.keys.shape[0]))
    mx.eval(weights, state)  # (once: the steps' graphs then start from evaluated arrays)
    step = fused_step(spec, sampler, sampler_key, compiled)
    return (lambda tokens, s: step(weights, tokens, s)), state


def decode(model, sampler, first_tokens: list[int], caches: list[StaticKVCache], max_new_tokens: int,
           is_done: Callable[[int, list[int]], int | None], sync_every: int = SYNC_EVERY,
           sampler_key=None, fused: bool | None = None, compiled: bool = True,
           batches: Sequence[int] | None = None,
           on_end: Callable[[int, list[int], bool], None] | None = None) -> tuple:
    """Decode up to `max_new_tokens` tokens for each row of the batch that `caches` hold
    (consumed: the list is emptied, so the step's in-place cache updates can take the buffers).

    first_tokens: [B] the token each row feeds first (its prompt's last token).
    sampler: a `row_sampler` (a row's draws independent of the batch it is in), or mlx-lm's
        `sampler(logprobs)` (then compaction changes the draws, not their distribution).
    sampler_key: identifies `sampler`'s settings, to reuse a compiled step (`fused_step`,
        `compiled_step`); None compiles a new one.
    compiled: `mx.compile` the step (True), or run the same step eagerly: no fused kernels, so
        nothing to compile on a fresh CUDA machine (NVRTC takes seconds a module there, see
        `mlxio.gpu.kernel_cache`), at more host time per step.
    fused: decode with `decode_fused`'s step where the model allows; None: on a GPU
        (`step_and_state`).
    batches: batch sizes to compact to as rows end (`mlxcore.train.buckets.batch_ladder(B, ...)`): after each read of
        a block, once the rows still live fit a smaller size of `batches`, they (and ended rows
        up to that size) are gathered into a batch of it (`take_rows`); the device is then one
        block ahead, so a row costs at most two blocks of steps after it ended. None: the batch
        stays at B until every row has ended.
    is_done(row, new_tokens) -> the number of `new_tokens` (this block's tokens of a live row)
        the row keeps when it ended among them, else None; called once a block, in row order.
    on_end(row, tokens, ended): called once per row as soon as its tokens are final (is_done
        cut it, or it reached max_new_tokens), while the device decodes the other rows.
    Returns (tokens, logprobs, ended, stats): per row the kept token list and float32 list, [B]
    bool ended (is_done cut it; False: it reached max_new_tokens), and a dict: steps (decode
    steps run), row_steps (rows computed, summed over the steps), batches (the batch sizes
    run, in order), syncs (host reads of the device's tokens), call_s (host seconds in the
    compiled step's calls: building each step's graph), queue_s (in `mx.async_eval`:
    dispatching the step's kernels, and waiting where the device's queue is full), read_s
    (reading blocks and checking stops, waiting for the device included), and per batch size
    steps_by_batch and seconds_by_batch (wall seconds of the loop's turns that queued a block of
    that size: with the device one block behind, about that block's time on the slower of host
    and device - whether a smaller batch makes a step cheaper)."""
    step, states = step_and_state(model, sampler, caches, sampler_key, fused, compiled)
    n = len(first_tokens)
    tokens_out: list[list[int]] = [[] for _ in range(n)]
    logprobs_out: list[list[float]] = [[] for _ in range(n)]
    ended = np.zeros(n, bool)
    live = np.ones(n, bool)
    rows = np.arange(n)  # the batch's rows, as indices of the first batch (ascending)
    sizes = sorted({n, *(b for b in batches or () if 1 <= b < n)})
    x = token_array(first_tokens)
    caches.clear()  # (the caller's references too: the buffers are donated to the step's updates)

    def absorb(block_tokens, block_logprobs, block_rows) -> None:
        toks = np.array(mx.stack(block_tokens, axis=1)).tolist()  # the block's one host sync
        lps = np.array(mx.stack(block_logprobs, axis=1)).tolist()
        for j, i in enumerate(block_rows):
            if not live[i]:
                continue
            room = max_new_tokens - len(tokens_out[i])
            new = toks[j][:room]
            keep = is_done(int(i), new)
            if keep is not None:
                new, ended[i], live[i] = new[:keep], True, False
            tokens_out[i] += new
            logprobs_out[i] += lps[j][: len(new)]
            if len(tokens_out[i]) >= max_new_tokens:
                live[i] = False
            if on_end is not None and not live[i]:
                on_end(int(i), tokens_out[i], bool(ended[i]))

    pending = None
    stats = {"steps": 0, "row_steps": 0, "batches": [n], "syncs": 0, "call_s": 0.0, "queue_s": 0.0, "read_s": 0.0,
             "steps_by_batch": {}, "seconds_by_batch": {}}
    while stats["steps"] < max_new_tokens and live.any():
        t_block, size_run = time.perf_counter(), len(rows)
        block_t, block_lp = [], []
        for _ in range(min(sync_every, max_new_tokens - stats["steps"])):
            t0 = time.perf_counter()
            x, lp, states = step(x, states)
            t1 = time.perf_counter()
            mx.async_eval(x, lp)
            stats["call_s"] += t1 - t0
            stats["queue_s"] += time.perf_counter() - t1
            block_t.append(x)
            block_lp.append(lp)
        stats["steps"] += len(block_t)
        stats["row_steps"] += len(block_t) * len(rows)
        t1 = time.perf_counter()
        if pending is not None:  # read the previous block while the device runs this one
            absorb(*pending)
            stats["syncs"] += 1
        pending = (block_t, block_lp, rows)
        size = next(b for b in sizes if b >= live.sum())  # (live as far as read: all in `rows`)
        if live.any() and size < len(rows) and stats["steps"] < max_new_tokens:
            keep = np.flatnonzero(live[rows])
            pad = np.flatnonzero(~live[rows])[: size - len(keep)]  # ended rows ride along to fill it
            index = np.sort(np.concatenate([keep, pad]))
            gather = mx.array(index, mx.int32)
            states, x, rows = take_rows(states, gather), x[gather], rows[index]
            stats["batches"].append(size)
        stats["read_s"] += time.perf_counter() - t1
        for key, value in (("steps_by_batch", len(block_t)), ("seconds_by_batch", time.perf_counter() - t_block)):
            stats[key][size_run] = stats[key].get(size_run, 0) + value
    if pending is not None and live.any():
        t1 = time.perf_counter()
        absorb(*pending)
        stats["syncs"] += 1
        stats["read_s"] += time.perf_counter() - t1
    return tokens_out, logprobs_out, ended, stats
