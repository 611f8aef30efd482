"""The static decode step of Llama-family models (mlx-lm's `llama`, `qwen2`) as one function of
a flat set of decode weights, with as few primitives per layer as the math allows.

On a GPU a batch-64 decode step of Qwen2.5-0.5B is host-bound: MLX's host time per primitive
(building, dispatching; views included), not FLOPs, sets the step time (H100: 12.7 ms a step,
8.7 ms of it queueing ~525 kernels and ~880 views for 24 layers). Per layer the mlx-lm forward on
a `StaticKVCache` queues ~22 kernels and ~37 views; this one 11 kernels and ~8 views:

- q/k/v is one matmul (+ bias) over weights concatenated once per call, gate/up one matmul;
  o_proj and down_proj add the residual in the GEMM (`mx.addmm`); weights are passed already
  transposed (no Transpose views in the step); activations stay [B, dim] (no Flatten).
- RoPE is one call over the q and k heads together (one position per row).
- Attention is `mx.fast.scaled_dot_product_attention` without a mask array - the masks live in
  the KV cache: every head is padded from D to Dp dims (64 -> 96; zero rows in the projection
  weights), q carries 1 in dim D, a written key 0, and an unwritten or left-padding slot's key
  `MASKED` there, so q.k' = q.k on real slots and ~ -1e9 on the others (softmax weight exactly
  0, as the boolean mask gave). On CUDA the fused decode kernels take no array mask (MLX
  0.32), so a masked attention is 5 primitives (scale, matmul, select, softmax, matmul); this
  is one. The padded dims of values are 0 and `o` has zero columns for them.

LoRA adapters (mlx-lm's `LoRALinear`, `mlxio.weights.llm_lora.LoraLinear`) are merged into the
decode weights when they are built (`W + scale * (A @ B).T` in float32, then the weight's
dtype, as `mlxcore.lora.merge`): the tokens are the LoRA policy's, up to that rounding (exact
in float32 up to summation order). The weights are an argument of the compiled step, so a
policy rebound to new adapters every RLAIF step reuses one trace. Quantised linears, other
architectures and RoPE variants return None from `decode_weights`: the caller keeps the
mlx-lm forward (`mlxio.rl.decode.make_step`).
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.activations import swiglu
from mlx_lm.models.rope_utils import Llama3RoPE

FUSED_TYPES = ("llama", "qwen2")
MASKED = -1e9  # a masked slot's key in the padded dim: its score is ~ -1e9 * scale (float16: -6e4)
FUSED_HEAD_DIMS = (64, 96, 128)  # head dims MLX's fused decode attention kernels take (CUDA)


@attrs.frozen
class Spec:
    """What a fused step's trace depends on besides array shapes (the cache key of its step)."""

    n_heads: int
    n_kv_heads: int
    head_dim: int
    padded_dim: int  # Dp: head_dim + 1 (mask dim) rounded up to a fused kernel's head dim
    scale: float
    eps: float
    rope: nn.Module = attrs.field(eq=False)  # shared by a model and every `bind` of it
    rope_id: int = 0


def padded_dim(head_dim: int) -> int:
    """The smallest head dim MLX's fused attention takes that holds head_dim + 1; else + 8."""
    return next((d for d in FUSED_HEAD_DIMS if d > head_dim), head_dim + 8)


def _dense(linear) -> tuple[mx.array, mx.array | None] | None:
    """(W [out, in], bias) of a float linear with any LoRA adapter merged; None: quantised."""
    base = getattr(linear, "linear", linear)
    if not isinstance(base, nn.Linear) or isinstance(base, nn.QuantizedLinear):
        return None
    w = base.weight
    if hasattr(linear, "lora_a"):
        update = linear.scale * (linear.lora_a.astype(mx.float32) @ linear.lora_b.astype(mx.float32))
        w = (w.astype(mx.float32) + update.T).astype(w.dtype)
    return w, base.get("bias")


def _pad_heads(w: mx.array, heads: int, dim: int, padded: int, axis: int) -> mx.array:
    """w with `axis` (heads * dim long) padded per head to heads * padded with zeros."""
    shape = list(w.shape)
    w = w.reshape(shape[:axis] + [heads, dim] + shape[axis + 1:])
    widths = [(0, 0)] * w.ndim
    widths[axis + 1] = (0, padded - dim)
    return mx.pad(w, widths).reshape(shape[:axis] + [heads * padded] + shape[axis + 1:])


def spec_of(model) -> Spec | None:
    """The fused step's constants for `model`, or None where it does not apply."""
    if getattr(model, "model_type", None) not in FUSED_TYPES or not hasattr(model, "model"):
        return None
    attn = model.model.layers[0].self_attn
    if type(attn.rope) not in (nn.RoPE, Llama3RoPE):  # (others may scale the unrotated dims)
        return None
    head_dim = getattr(attn.q_proj, "linear", attn.q_proj).weight.shape[0] // attn.n_heads
    return Spec(attn.n_heads, attn.n_kv_heads, head_dim, padded_dim(head_dim), float(attn.scale),
                float(model.model.layers[0].input_layernorm.eps), attn.rope, id(attn.rope))


def decode_weights(model, spec: Spec) -> dict | None:
    """The fused step's weights for `model` (LoRA merged; see the module doc), or None where a
    linear is quantised. Lazy: evaluate them once before the first step."""
    nq, nkv, d, dp = spec.n_heads, spec.n_kv_heads, spec.head_dim, spec.padded_dim
    embed = model.model.embed_tokens
    if type(embed) is not nn.Embedding:  # (a QuantizedEmbedding)
        return None
    head = _dense(model.lm_head) if hasattr(model, "lm_head") else (embed.weight, None)
    if head is None or head[1] is not None:
        return None
    layers = []
    for block in model.model.layers:
        attn, mlp = block.self_attn, block.mlp
        dense = [_dense(m) for m in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj,
                                     mlp.gate_proj, mlp.up_proj, mlp.down_proj)]
        if any(x is None for x in dense) or block.input_layernorm.eps != spec.eps:
            return None
        (wq, bq), (wk, bk), (wv, bv), (wo, bo), (wg, bg), (wu, bu), (wd, bd) = dense
        qkv = mx.concatenate([_pad_heads(w, n, d, dp, 0) for w, n in ((wq, nq), (wk, nkv), (wv, nkv))])
        zero = mx.zeros((wq.shape[0],), wq.dtype)
        bias = [_pad_heads(b if b is not None else zero[: n * d], n, d, dp, 0) for b, n in
                ((bq, nq), (bk, nkv), (bv, nkv))]
        q_one = mx.zeros((nq, dp), wq.dtype).at[:, d].add(1).reshape(-1)  # q's 1 in the mask dim
        layer = {"in_norm": block.input_layernorm.weight, "post_norm": block.post_attention_layernorm.weight,
                 "qkv": qkv.T, "qkv_bias": mx.concatenate([bias[0] + q_one, *bias[1:]]),
                 "o": _pad_heads(wo, nq, d, dp, 1).T, "gate_up": mx.concatenate([wg, wu]).T, "down": wd.T}
        for name, b in (("o_bias", bo), ("down_bias", bd)):
            if b is not None:
                layer[name] = b
        if bg is not None or bu is not None:
            layer["gate_up_bias"] = mx.concatenate([bg if bg is not None else mx.zeros_like(wg[:, 0]),
                                                    bu if bu is not None else mx.zeros_like(wu[:, 0])])
        layers.append(layer)
    return {"embed": embed.weight, "norm": model.model.norm.weight, "head": head[0].T, "layers": layers}


def decode_cache(keys: mx.array, values: mx.array, left_padding: mx.array, idx: mx.array,
                 spec: Spec) -> tuple[mx.array, mx.array]:
    """A layer's static cache [B, H, S, D] (slots left_padding[b] .. idx - 1 written) padded to
    the fused step's [B, H, S, Dp]: keys carry 0 in dim D on written slots, MASKED elsewhere."""
    slots = mx.arange(keys.shape[2])
    real = (slots[None] >= left_padding[:, None]) & (slots[None] < idx)  # [B, S]
    masked = MASKED if keys.dtype != mx.float16 else -6e4
    flag = mx.where(real, 0.0, masked).astype(keys.dtype)[:, None, :, None]
    flag = mx.broadcast_to(flag, keys.shape[:3] + (1,))
    extra = spec.padded_dim - spec.head_dim - 1
    tail = [(0, 0), (0, 0), (0, 0), (0, extra)]
    return mx.pad(mx.concatenate([keys, flag], axis=-1), tail), mx.pad(values, [(0, 0)] * 3 + [(0, extra + 1)])


def forward(spec: Spec, weights: dict, tokens: mx.array, kv: list, positions: mx.array,
            idx: mx.array) -> tuple[mx.array, list]:
    """Last-position logits [B, vocab] for `tokens` [B] fed at slot `idx` ([1]) with RoPE
    positions `positions` [B], and the updated per-layer (keys, values) [B, Hkv, S, Dp]."""
    nq, nkv, dp = spec.n_heads, spec.n_kv_heads, spec.padded_dim
    x = weights["embed"][tokens]  # [B, dim]
    b = x.shape[0]
    out = []
    for layer, (keys, values) in zip(weights["layers"], kv, strict=True):
        h = mx.fast.rms_norm(x, layer["in_norm"], spec.eps)
        qkv = mx.addmm(layer["qkv_bias"], h, layer["qkv"]).reshape(b, nq + 2 * nkv, 1, dp)
        qk = spec.rope(qkv[:, : nq + nkv], offset=positions)  # (dims >= D pass through unrotated)
        keys = mx.slice_update(keys, qk[:, nq:], idx, axes=(2,))
        values = mx.slice_update(values, qkv[:, nq + nkv:], idx, axes=(2,))
        o = mx.fast.scaled_dot_product_attention(qk[:, :nq], keys, values, scale=spec.scale)
        residual = x if "o_bias" not in layer else x + layer["o_bias"]
        x = mx.addmm(residual, o.reshape(b, nq * dp), layer["o"])
        h = mx.fast.rms_norm(x, layer["post_norm"], spec.eps)
        gu = h @ layer["gate_up"] if "gate_up_bias" not in layer else mx.addmm(layer["gate_up_bias"], h, layer["gate_up"])
        hidden = gu.shape[-1] // 2
        residual = x if "down_bias" not in layer else x + layer["down_bias"]
        x = mx.addmm(residual, swiglu(gu[:, :hidden], gu[:, hidden:]), layer["down"])
        out.append((keys, values))
    x = mx.fast.rms_norm(x, weights["norm"], spec.eps)
    return x @ weights["head"], out


def make_fused_step(spec: Spec, sampler: Callable[[mx.array], mx.array]) -> Callable:
    """The compiled step `(weights, tokens [B] uint32, state) -> (next [B] uint32, logprob [B]
    float32, state)`, state = ([(keys, values)] per layer, positions [B] int32, idx [1] int32);
    sampling as `mlxio.rl.decode.make_step` (log-softmax of the logits, `sampler`, the picked
    token's log-probability). MLX's PRNG state is a captured input and output."""

    def step(weights, tokens, state):
        kv, positions, idx = state
        logits, kv = forward(spec, weights, tokens, kv, positions, idx)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        nxt = sampler(logprobs)
        picked = mx.take_along_axis(logprobs, nxt[:, None].astype(mx.int32), axis=-1)[:, 0]
        return nxt, picked.astype(mx.float32), (kv, positions + 1, idx + 1)

    return mx.compile(step, inputs=[mx.random.state], outputs=[mx.random.state])
