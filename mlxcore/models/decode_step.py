"""The static-shape decode step: one `mx.compile`d step (model forward + sampling) whose
every call sees the same shapes, for rollouts on a GPU where mlx-lm's BatchGenerator is
launch- and host-bound (at 64 x Qwen2.5-0.5B a step takes far longer than reading the weights
once: benchmarks/results/h100/generation.json).

What the BatchGenerator does per token and this does not:
- its KV cache grows (`BatchKVCache`: keys[..., :idx] is a new shape every step, a concatenate
  every 256) and shrinks when a row ends (`filter`): new shapes, so no reuse of fused kernels
  or CUDA graphs. Here `StaticKVCache` is preallocated at [B, H, S, D] (S = prompt + new tokens,
  rounded up to `mlxcore.train.buckets.LENGTH_STEP`), written at a position held in an array, and attention reads all
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
  (elementwise ops fused) and tokens / logprobs stay on the device; `mlxio.rl.decode` runs the
  steps and reads their tokens to the host a block at a time, and gathers the live rows into a
  smaller batch as rows end (`take_rows`).

The token a row samples does not depend on which other rows share its batch: `row_sampler` is
mlx-lm's sampler with the Gumbel noise drawn for all N rows every step (one draw of MLX's PRNG,
as `mx.random.categorical` makes) and each row reading its own, so with or without compaction
the draws are the same (bit for bit where the forward's kernels round a row alike at every
batch size: float32 on the CPU in the tests; elsewhere up to float rounding).

Greedy decoding gives the same tokens as the BatchGenerator path up to float rounding (the
prompts are prefilled as one left-padded batch, `rollout.prefill_batch`; masked slots add exact
zeros to attention; the fused step's merged LoRA weights and GEMM-added residuals round
differently: in half precision near-ties can flip, see `benchmarks.generation`); sampled
decoding draws from the same distributions (the same mlx-lm sampler, one draw per row per
step), not the same draws.
"""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx
from mlx.utils import tree_map
from mlx_lm.models.cache import BatchKVCache, _BaseCache
from mlx_lm.sample_utils import apply_top_p


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
    """The compiled step's state: ([(keys, values)] per layer, left_padding, idx, rows). One
    left_padding / idx for all layers: the step computes the RoPE positions and the next idx
    once, not once per layer. rows [B] int32: each batch row's index in the batch decoding
    began with (`take_rows` keeps them; the sampler reads its noise there)."""
    first = caches[0]
    return [(c.keys, c.values) for c in caches], first.left_padding, first.idx, all_rows(first.keys.shape[0])


def all_rows(n: int) -> mx.array:
    """The rows [n] int32 of a batch as it starts (`decode_state`'s last entry)."""
    return mx.arange(n, dtype=mx.int32)


def take_rows(state: tuple, index: mx.array) -> tuple:
    """A step state (`decode_state`, or the fused step's) of the batch rows `index` [b] int32:
    every per-row array gathered on its first axis, the shared position `idx` as it is."""
    kv, by_row, idx, rows = state
    return tree_map(lambda a: a[index], kv), by_row[index], idx, rows[index]


def row_sampler(temperature: float, top_p: float, n: int) -> Callable[[mx.array, mx.array], mx.array]:
    """mlx-lm's `make_sampler(temp=temperature, top_p=top_p)` as a draw per row of an n-row batch:
    `sample(logprobs [b, V], rows [b] int32) -> [b] uint32`, rows the batch rows' indices in
    0 .. n - 1. The Gumbel noise is drawn for all n rows ([n, V]: the draw
    `mx.random.categorical` makes of MLX's global PRNG) and row r reads its own row, so a row's
    token does not depend on which others are decoded beside it; over the full batch (rows =
    0 .. n - 1) it is make_sampler's draw. temperature 0: the argmax (greedy)."""
    if temperature == 0:
        def greedy(logprobs, rows):
            return mx.argmax(logprobs, axis=-1)

        greedy.per_row = True
        return greedy

    def sample(logprobs, rows):
        if 0 < top_p < 1.0:
            logprobs = apply_top_p(logprobs, top_p)
        noise = mx.random.gumbel((n, logprobs.shape[-1]))  # (mx.random.categorical's, for all n rows)
        return mx.argmax(noise[rows] + logprobs * (1.0 / temperature), axis=-1)

    sample.per_row = True
    return sample


def per_row(sampler: Callable) -> Callable[[mx.array, mx.array], mx.array]:
    """`sampler` as a (logprobs, rows) -> tokens function: a `row_sampler` as it is, another
    (mlx-lm's `sampler(logprobs)`) ignoring the rows: its draws then depend on the batch."""
    if getattr(sampler, "per_row", False):
        return sampler
    return lambda logprobs, rows: sampler(logprobs)


def token_array(tokens: list[int]) -> mx.array:
    """The decode step's first input [B]: int32, the dtype of the prompt ids and of the tokens the
    step returns (one trace for every step; on CUDA one gather module for every embedding
    lookup, where uint32 sampled ids would need a second)."""
    return mx.array(tokens, mx.int32)


def make_step(model, sampler: Callable, compiled: bool = True) -> Callable:
    """The compiled decode step `(tokens [B] int32, state) -> (next [B] int32, logprob [B]
    float32, state)`: feeds `tokens` at each row's next slot, samples from the log-softmax of
    the last logits (temperature-1 log-probabilities, as mlx-lm's BatchGenerator) with `sampler`
    (`per_row`) and returns the sampled tokens' log-probabilities. state: `decode_state`.
    The model's parameters and MLX's PRNG state are captured inputs, so a policy whose weights
    change between calls (LoRA) is read afresh, and each call draws new random numbers.
    `compiled` False: the same step, run eagerly (see `mlxio.rl.decode.decode`)."""
    sample = per_row(sampler)

    def step(tokens, state):
        kv, left_padding, idx, rows = state
        caches = [StaticKVCache(k, v, left_padding, idx) for k, v in kv]
        logits = model(tokens[:, None], cache=caches)[:, -1, :]
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        nxt = sample(logprobs, rows).astype(mx.int32)  # (the sampler's uint32: see token_array)
        picked = mx.take_along_axis(logprobs, nxt[:, None], axis=-1)[:, 0]
        return nxt, picked.astype(mx.float32), ([(c.keys, c.values) for c in caches], left_padding, idx + 1, rows)

    if not compiled:
        return step
    state = [model.state, mx.random.state]
    return mx.compile(step, inputs=state, outputs=[mx.random.state])
