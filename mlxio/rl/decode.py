"""The static decode engine's host loop around `mlxcore.decode_step`'s compiled step.

`decode` picks the step for a model (`step_and_state`: `mlxcore.decode_fused`'s step for float
Llama / Qwen2 models on a GPU, else the mlx-lm forward on the static cache) and keeps it for
reuse across calls (`compiled_step`, `fused_step`); it queues `sync_every` steps at a time and
reads their tokens to the host one block behind the device (the next block is queued first),
checking EOS and stop conditions there. Rows that have ended keep decoding until the whole
batch has (their extra tokens are dropped), so the shapes never change. It times the host's
share of each step (`stats`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import mlx.core as mx
import numpy as np

from mlxcore import decode_fused
from mlxcore.decode_step import StaticKVCache, decode_state, make_step, token_array

SYNC_EVERY = 16  # decode steps between host reads of the tokens (EOS / stop checks)


def compiled_step(model, sampler, sampler_key=None, compiled: bool = True) -> Callable:
    """`make_step(model, sampler)`, kept on the model (outside its parameter tree) under
    `sampler_key` (e.g. (temperature, top_p)) when one is given, so later calls with the same
    model skip tracing and compiling again (~50 ms for 24 layers); None: a new one."""
    if sampler_key is None:
        return make_step(model, sampler, compiled)
    steps = model.__dict__.setdefault("_static_decode_steps", {})
    if (sampler_key, compiled) not in steps:
        steps[sampler_key, compiled] = make_step(model, sampler, compiled)
    return steps[sampler_key, compiled]


_FUSED_STEPS: dict = {}  # (decode_fused.Spec, sampler_key, compiled) -> fused step
# Devices whose static step is the fused one by default: a GPU, where the step is host-bound and
# the attention is MLX's fused kernel. On the CPU MLX lowers attention to matmuls, and the fused
# step's mask-in-the-cache attention over 2 x 96-dim rows (`Spec.wide_attention`) is ~3x the
# work of the mlx-lm forward's masked 64-dim one (tiny Qwen2 shape: ~1.5x slower steps).
FUSED_DEVICES = {mx.gpu}


def fused_step(spec: decode_fused.Spec, sampler, sampler_key=None, compiled: bool = True) -> Callable:
    """`decode_fused.make_fused_step(spec, sampler)`, kept per (spec, sampler_key) when a key is
    given: the weights are an argument, so every policy with the same architecture and RoPE
    module (a model and all its LoRA `bind`s) shares one trace."""
    if sampler_key is None:
        return decode_fused.make_fused_step(spec, sampler, compiled)
    key = (spec, sampler_key, compiled)
    if key not in _FUSED_STEPS:
        _FUSED_STEPS[key] = decode_fused.make_fused_step(spec, sampler, compiled)
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
    state = (kv, first.idx - first.left_padding, first.idx)
    mx.eval(weights, state)  # (once: the steps' graphs then start from evaluated arrays)
    step = fused_step(spec, sampler, sampler_key, compiled)
    return (lambda tokens, s: step(weights, tokens, s)), state


def decode(model, sampler, first_tokens: list[int], caches: list[StaticKVCache], max_new_tokens: int,
           is_done: Callable[[int, list[int]], int | None], sync_every: int = SYNC_EVERY,
           sampler_key=None, fused: bool | None = None, compiled: bool = True) -> tuple:
    """Decode up to `max_new_tokens` tokens for each row of the batch that `caches` hold
    (consumed: the list is emptied, so the step's in-place cache updates can take the buffers).

    first_tokens: [B] the token each row feeds first (its prompt's last token).
    sampler_key: identifies `sampler`'s settings, to reuse a compiled step (`fused_step`,
        `compiled_step`); None compiles a new one.
    compiled: `mx.compile` the step (True), or run the same step eagerly: no fused kernels, so
        nothing to compile on a fresh CUDA machine (NVRTC takes 3-4 s a module there, see
        `mlxio.kernel_cache`), at more host time per step.
    fused: decode with `decode_fused`'s step where the model allows; None: on a GPU
        (`step_and_state`).
    is_done(row, new_tokens) -> the number of `new_tokens` (this block's tokens of a live row)
        the row keeps when it ended among them, else None; called once a block, in order.
    Returns (tokens, logprobs, ended, stats): per row the kept token list and float32 list, [B]
    bool ended (is_done cut it; False: it reached max_new_tokens), and a dict: steps (decode
    steps run), syncs (host reads of the device's tokens), call_s (host seconds in the compiled
    step's calls: building each step's graph), queue_s (in `mx.async_eval`: dispatching the
    step's kernels, and waiting where the device's queue is full), read_s (reading blocks and
    checking stops, waiting for the device included)."""
    step, states = step_and_state(model, sampler, caches, sampler_key, fused, compiled)
    n = len(first_tokens)
    tokens_out: list[list[int]] = [[] for _ in range(n)]
    logprobs_out: list[list[float]] = [[] for _ in range(n)]
    ended = np.zeros(n, bool)
    live = np.ones(n, bool)
    x = token_array(first_tokens)
    caches.clear()  # (the caller's references too: the buffers are donated to the step's updates)

    def absorb(block_tokens, block_logprobs) -> None:
        toks = np.array(mx.stack(block_tokens, axis=1)).tolist()  # the block's one host sync
        lps = np.array(mx.stack(block_logprobs, axis=1)).tolist()
        for i in np.flatnonzero(live):
            room = max_new_tokens - len(tokens_out[i])
            new = toks[i][:room]
            keep = is_done(int(i), new)
            if keep is not None:
                new, ended[i], live[i] = new[:keep], True, False
            tokens_out[i] += new
            logprobs_out[i] += lps[i][: len(new)]
            if len(tokens_out[i]) >= max_new_tokens:
                live[i] = False

    pending = None
    stats = {"steps": 0, "syncs": 0, "call_s": 0.0, "queue_s": 0.0, "read_s": 0.0}
    while stats["steps"] < max_new_tokens and live.any():
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
        t1 = time.perf_counter()
        if pending is not None:  # read the previous block while the device runs this one
            absorb(*pending)
            stats["syncs"] += 1
        pending = (block_t, block_lp)
        stats["read_s"] += time.perf_counter() - t1
    if pending is not None and live.any():
        t1 = time.perf_counter()
        absorb(*pending)
        stats["syncs"] += 1
        stats["read_s"] += time.perf_counter() - t1
    return tokens_out, logprobs_out, ended, stats
