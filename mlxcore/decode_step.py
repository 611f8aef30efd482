"""Static-shape batched decoding: one `mx.compile`d step (model forward + sampling) whose
every call sees the same shapes, for rollouts on a GPU where mlx-lm's BatchGenerator is
launch- and host-bound (64 x Qwen2.5-0.5B on an H100: ~10.7 ms a step against ~0.3 ms to read
the weights once).

What the BatchGenerator does per token and this does not:
- its KV cache grows (`BatchKVCache`: keys[..., :idx] is a new shape every step, a concatenate
  every 256) and shrinks when a row ends (`filter`): new shapes, so no reuse of fused kernels
  or CUDA graphs. Here `StaticKVCache` is preallocated at [B, H, S, D] (S = prompt + new tokens,
  rounded up to `mlxcore.buckets.LENGTH_STEP`), written at a position held in an array, and attention reads all
  S slots under a mask (left padding and the unwritten tail masked out; the extra masked slots
  are a small read next to the weights: 64 x 512 slots of Qwen2.5-0.5B's KV is ~0.2 GB against
  ~1 GB of weights).
- one forward of ~22 kernels and ~37 views per layer (mlx-lm's). For float Llama / Qwen2
  models the step here is `decode_fused`'s: ~10 kernels and a few views per layer (fused
  projections, the mask carried in the cache so attention is MLX's fused kernel, LoRA merged),
  its weights an argument, so a policy rebound to new adapters reuses the trace. Other models
  run the mlx-lm forward on `StaticKVCache` (`make_step`; on CUDA its masked attention is
  matmul + softmax, as for the BatchGenerator's left-padded batch).
- an uncompiled forward, split logprobs (`list(logprobs)`: B slices), a host sync for the
  tokens and one for the logprobs every step, per-row Python. Here the step is compiled
  (elementwise ops fused) and tokens / logprobs stay on the device; the host reads them every
  `sync_every` steps, one block behind the device (the next block is queued first), and checks
  EOS and stop conditions there. Rows that have ended keep decoding until the whole batch has
  (their extra tokens are dropped), so the shapes never change.

Greedy decoding gives the same tokens as the BatchGenerator path up to float rounding (the
prompts are prefilled as one left-padded batch, `rollout.prefill_batch`; masked slots add exact
zeros to attention; the fused step's merged LoRA weights and GEMM-added residuals round
differently: in half precision near-ties can flip, see `benchmarks.generation`); sampled
decoding draws from the same distributions (the same mlx-lm sampler, one draw per row per
step), not the same draws.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import BatchKVCache, _BaseCache

from mlxcore import decode_fused

SYNC_EVERY = 16  # decode steps between host reads of the tokens (EOS / stop checks)


class StaticKVCache(_BaseCache):
    """A left-padded batch's KV cache for one layer at a fixed size, for compiled decoding.

    keys, values: [B, H, S, D]; row b's tokens fill slots left_padding[b] .. idx - 1.
    left_padding: [B] int32. idx: [1] int32, the slot the next token is written to (an array,
    so a compiled step is traced once for every position). offset (RoPE positions, as mlx-lm's
    BatchKVCache): [B] = idx - left_padding."""

    def __init__(self, keys: mx.array, values: mx.array, left_padding: mx.array, idx: mx.array):
        self.keys, self.values, self.left_padding, self.idx = keys, values, left_padding, idx

    @classmethod
    def from_batch(cls, cache: BatchKVCache, size: int) -> StaticKVCache:
        """`cache` (mlx-lm's merged, left-padded batch cache) copied into `size` slots."""
        used = cache.size()
        keys, values = cache.keys[..., :used, :], cache.values[..., :used, :]
        tail = [(0, 0), (0, 0), (0, size - used), (0, 0)]
        return cls(mx.pad(keys, tail), mx.pad(values, tail), cache.left_padding.astype(mx.int32),
                   mx.array([used], mx.int32))

    @property
    def offset(self) -> mx.array:
        return self.idx - self.left_padding

    @property
    def state(self):
        return self.keys, self.values, self.left_padding, self.idx

    @state.setter
    def state(self, v):
        self.keys, self.values, self.left_padding, self.idx = v

    def update_and_fetch(self, keys, values):
        self.keys = mx.slice_update(self.keys, keys.astype(self.keys.dtype), self.idx, axes=(2,))
        self.values = mx.slice_update(self.values, values.astype(self.values.dtype), self.idx, axes=(2,))
        self.idx = self.idx + keys.shape[2]
        return self.keys, self.values

    def make_mask(self, N: int, **kwargs) -> mx.array:
        """[B, 1, N, S] bool: query i (slot idx + i) sees its row's slots left_padding .. idx + i."""
        slots = mx.arange(self.keys.shape[2])
        queries = self.idx + mx.arange(N)
        causal = slots[None] <= queries[:, None]  # [N, S]
        real = slots[None] >= self.left_padding[:, None]  # [B, S]
        return causal[None, None] & real[:, None, None]

    def size(self) -> int:
        return self.keys.shape[2]

    def empty(self) -> bool:
        return False

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.values.nbytes


def static_cache(prompt_caches: list[list], size: int) -> list[StaticKVCache]:
    """Per-layer static caches of `size` slots for a batch whose row b continues from
    `prompt_caches[b]` (a per-layer list of mlx-lm KVCaches, possibly empty). The layers share
    one left_padding and one idx array (`decode_state`)."""
    layers = []
    for per_row in zip(*prompt_caches, strict=True):
        merged = BatchKVCache.merge(list(per_row))
        if merged.keys is None:  # every prompt is one token: nothing cached yet
            raise ValueError("static_cache needs a non-empty prompt cache in some row")
        layers.append(StaticKVCache.from_batch(merged, size))
    for c in layers[1:]:
        c.left_padding, c.idx = layers[0].left_padding, layers[0].idx
    return layers


def static_cache_rows(caches: list[BatchKVCache], rows: list[int], size: int) -> list[StaticKVCache]:
    """Per-layer static caches of `size` slots whose row i is row `rows[i]` of `caches` (mlx-lm's
    left-padded batch caches after a batched prefill, `mlxio.rl.rollout.prefill_batch`); the
    left-padding slots are zeroed (whatever the prefill left there is never attended, but a NaN
    would survive the fused step's additive mask). The layers share one left_padding / idx."""
    index = mx.array(rows, mx.int32)
    used = caches[0].size()
    left_padding = caches[0].left_padding.astype(mx.int32)[index]
    real = (mx.arange(used)[None] >= left_padding[:, None])[:, None, :, None]  # [N, 1, used, 1]
    tail = [(0, 0), (0, 0), (0, size - used), (0, 0)]
    idx = mx.array([used], mx.int32)
    return [StaticKVCache(*(mx.pad(mx.where(real, a[index, :, :used], 0), tail) for a in (c.keys, c.values)),
                          left_padding, idx) for c in caches]


def decode_state(caches: list[StaticKVCache]) -> tuple:
    """The compiled step's state: ([(keys, values)] per layer, left_padding, idx). One
    left_padding / idx for all layers: the step computes the RoPE positions and the next idx
    once, not once per layer."""
    return [(c.keys, c.values) for c in caches], caches[0].left_padding, caches[0].idx


def token_array(tokens: list[int]) -> mx.array:
    """The decode step's first input [B]: int32, the dtype of the prompt ids and of the tokens the
    step returns (one trace for every step; on CUDA one gather module for every embedding
    lookup, where uint32 sampled ids would need a second)."""
    return mx.array(tokens, mx.int32)


def make_step(model, sampler: Callable[[mx.array], mx.array], compiled: bool = True) -> Callable:
    """The compiled decode step `(tokens [B] int32, state) -> (next [B] int32, logprob [B]
    float32, state)`: feeds `tokens` at each row's next slot, samples from the log-softmax of
    the last logits (temperature-1 log-probabilities, as mlx-lm's BatchGenerator) with `sampler`
    and returns the sampled tokens' log-probabilities. state: `decode_state`.
    The model's parameters and MLX's PRNG state are captured inputs, so a policy whose weights
    change between calls (LoRA) is read afresh, and each call draws new random numbers.
    `compiled` False: the same step, run eagerly (see `decode`)."""

    def step(tokens, state):
        kv, left_padding, idx = state
        caches = [StaticKVCache(k, v, left_padding, idx) for k, v in kv]
        logits = model(tokens[:, None], cache=caches)[:, -1, :]
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        nxt = sampler(logprobs).astype(mx.int32)  # (the sampler's uint32: see token_array)
        picked = mx.take_along_axis(logprobs, nxt[:, None], axis=-1)[:, 0]
        return nxt, picked.astype(mx.float32), ([(c.keys, c.values) for c in caches], left_padding, idx + 1)

    if not compiled:
        return step
    state = [model.state, mx.random.state]
    return mx.compile(step, inputs=state, outputs=[mx.random.state])


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
