"""The static decode step of Llama-family models (mlx-lm's `llama`, `qwen2`) as one function of
a flat set of decode weights, with as few primitives per layer as the math allows.

On a GPU a batch-64 decode step of Qwen2.5-0.5B is host-bound: MLX's host time per primitive
(building, dispatching; views included), not FLOPs, sets the step time (most of it queueing
~525 kernels and ~880 views for 24 layers: dev/decode_graph.py). Per layer the mlx-lm forward on
a `StaticKVCache` queues ~22 kernels and ~37 views; this one 11 kernels and ~8 views:

- q/k/v is one matmul (+ bias) over weights concatenated once per call, gate/up one matmul;
  o_proj and down_proj add the residual in the GEMM (`mx.addmm`); weights are passed already
  transposed (no Transpose views in the step); activations stay [B, dim] (no Flatten).
- Attention is `mx.fast.scaled_dot_product_attention` without a mask array - the masks live in
  the KV cache: heads are padded from D to Dp dims (64 -> 96; zero rows in the projection
  weights), q carries 1 in dim D, a written key 0, and an unwritten or left-padding slot's key
  `MASKED` there, so q.k' = q.k on real slots and ~ -1e9 on the others (softmax weight exactly
  0, as the boolean mask gave). On CUDA the fused decode kernels take no array mask (MLX
  0.32), so a masked attention was 5 primitives (scale, matmul, select, softmax, matmul).
- One RoPE call and one cache write per layer: the projection emits heads 2 * Dp wide, q heads
  as [q, 1, 0...] and each KV head as [k, 0... | v, 0...]; RoPE rotates only the first D dims
  of every head (`dims` = D: q and k, never v), and the KV cache is one [B, Hkv, S, 2 * Dp]
  array whose halves are the attention's keys and values (strided views, no copy).

LoRA adapters (mlx-lm's `LoRALinear`, `mlxio.weights.llm_lora.LoraLinear`) are merged into the
decode weights when they are built (`W + scale * (A @ B).T` in float32, then the weight's
dtype, as `mlxcore.train.lora.merge`): the tokens are the LoRA policy's, up to that rounding (exact
in float32 up to summation order). A quantised base (QLoRA) is dequantised into them - the
values its quantised matmuls compute with, in the scales' dtype: 4x the bytes of 4-bit
weights per step, which a host-bound step does not feel (Qwen2.5-0.5B in bf16: ~1 GB, read in
a small fraction of a step), and a copy of the model in memory while decoding.
The weights are an argument of the compiled step, so a policy rebound to new adapters every
RLAIF step reuses one trace. Other architectures and RoPE variants return None from
`spec_of`: the caller keeps the mlx-lm forward (`mlxcore.models.decode_step.make_step`).
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
    # attention over whole 2 * Dp cache rows (q's second half is 0, the output's second half is
    # the values' part): contiguous operands where MLX lowers attention to matmuls (the CPU, or
    # a Dp no fused kernel takes: D = 128), which would copy strided key / value halves
    wide_attention: bool = False


def padded_dim(head_dim: int) -> int:
    """The smallest head dim MLX's fused attention takes that holds head_dim + 1; else + 8."""
    return next((d for d in FUSED_HEAD_DIMS if d > head_dim), head_dim + 8)


def _float_weight(module) -> mx.array:
    """The weight of a linear / embedding as its forward sees it: a quantised one dequantised
    (the values its quantised matmul / gather computes with)."""
    if isinstance(module, (nn.QuantizedLinear, nn.QuantizedEmbedding)):
        return mx.dequantize(module.weight, module.scales, module.get("biases"), module.group_size,
                             module.bits, mode=getattr(module, "mode", "affine"))
    return module.weight


def _dense(linear) -> tuple[mx.array, mx.array | None] | None:
    """(W [out, in], bias) of a linear, float or quantised (dequantised), with any LoRA adapter
    merged; None for another kind of layer."""
    base = getattr(linear, "linear", linear)
    if not isinstance(base, (nn.Linear, nn.QuantizedLinear)):
        return None
    w = _float_weight(base)
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


def _kv_heads(k: mx.array, v: mx.array, heads: int, dim: int, padded: int) -> mx.array:
    """k, v [heads * dim, ...] as [heads * 2 * padded, ...]: per head k, zeros, v, zeros."""
    k, v = (_pad_heads(a, heads, dim, padded, 0).reshape(heads, padded, *a.shape[1:]) for a in (k, v))
    return mx.concatenate([k, v], axis=1).reshape(heads * 2 * padded, *k.shape[2:])


def spec_of(model) -> Spec | None:
    """The fused step's constants for `model`, or None where it does not apply."""
    if getattr(model, "model_type", None) not in FUSED_TYPES or not hasattr(model, "model"):
        return None
    attn = model.model.layers[0].self_attn
    if type(attn.rope) not in (nn.RoPE, Llama3RoPE):  # (others may scale the unrotated dims)
        return None
    head_dim = getattr(attn.q_proj, "linear", attn.q_proj).weight.shape[0] // attn.n_heads
    dp = padded_dim(head_dim)
    return Spec(attn.n_heads, attn.n_kv_heads, head_dim, dp, float(attn.scale),
                float(model.model.layers[0].input_layernorm.eps), attn.rope, id(attn.rope),
                wide_attention=mx.default_device().type != mx.gpu or dp not in FUSED_HEAD_DIMS)


def decode_weights(model, spec: Spec) -> dict | None:
    """The fused step's weights for `model` (quantised weights dequantised, LoRA merged; see the
    module doc), or None where a layer is of another kind. Lazy: evaluate them once before the
    first step."""
    nq, nkv, d, dp = spec.n_heads, spec.n_kv_heads, spec.head_dim, spec.padded_dim
    embed = model.model.embed_tokens
    if type(embed) not in (nn.Embedding, nn.QuantizedEmbedding):
        return None
    embed = _float_weight(embed)
    head = _dense(model.lm_head) if hasattr(model, "lm_head") else (embed, None)
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
        qkv = mx.concatenate([_pad_heads(wq, nq, d, 2 * dp, 0), _kv_heads(wk, wv, nkv, d, dp)])
        bq, bk, bv = (b if b is not None else mx.zeros((w.shape[0],), w.dtype) for b, w in
                      ((bq, wq), (bk, wk), (bv, wv)))
        # q's 1 in the mask dim (a comparison, not `.at[:, d].add(1)`: on CUDA that is a module of its own)
        q_one = mx.broadcast_to((mx.arange(2 * dp) == d).astype(wq.dtype), (nq, 2 * dp)).reshape(-1)
        bias = mx.concatenate([_pad_heads(bq, nq, d, 2 * dp, 0) + q_one, _kv_heads(bk, bv, nkv, d, dp)])
        layer = {"in_norm": block.input_layernorm.weight, "post_norm": block.post_attention_layernorm.weight,
                 "qkv": qkv.T, "qkv_bias": bias,
                 "o": _pad_heads(wo, nq, d, dp, 1).T, "gate_up": mx.concatenate([wg, wu]).T, "down": wd.T}
        for name, b in (("o_bias", bo), ("down_bias", bd)):
            if b is not None:
                layer[name] = b
        if bg is not None or bu is not None:
            layer["gate_up_bias"] = mx.concatenate([bg if bg is not None else mx.zeros_like(wg[:, 0]),
                                                    bu if bu is not None else mx.zeros_like(wu[:, 0])])
        layers.append(layer)
    return {"embed": embed, "norm": model.model.norm.weight, "head": head[0].T, "layers": layers}


def decode_cache(keys: mx.array, values: mx.array, left_padding: mx.array, idx: mx.array,
                 spec: Spec) -> mx.array:
    """A layer's static cache [B, H, S, D] x 2 (slots left_padding[b] .. idx - 1 written) as the
    fused step's [B, H, S, 2 * Dp]: per slot [k, flag, 0... | v, 0...], flag 0 on written slots
    and MASKED on the others."""
    slots = mx.arange(keys.shape[2])
    real = (slots[None] >= left_padding[:, None]) & (slots[None] < idx)  # [B, S]
    masked = MASKED if keys.dtype != mx.float16 else -6e4
    flag = mx.where(real, 0.0, masked).astype(keys.dtype)[:, None, :, None]
    flag = mx.broadcast_to(flag, keys.shape[:3] + (1,))
    pad = spec.padded_dim - spec.head_dim
    keys = mx.pad(mx.concatenate([keys, flag], axis=-1), [(0, 0)] * 3 + [(0, pad - 1)])
    return mx.concatenate([keys, mx.pad(values, [(0, 0)] * 3 + [(0, pad)])], axis=-1)


def forward(spec: Spec, weights: dict, tokens: mx.array, kv: list, positions: mx.array,
            idx: mx.array) -> tuple[mx.array, list]:
    """Last-position logits [B, vocab] for `tokens` [B] fed at slot `idx` ([1]) with RoPE
    positions `positions` [B], and the updated per-layer KV caches [B, Hkv, S, 2 * Dp]."""
    nq, nkv, dp = spec.n_heads, spec.n_kv_heads, spec.padded_dim
    x = weights["embed"][tokens]  # [B, dim]
    b = x.shape[0]
    out = []
    for layer, cache in zip(weights["layers"], kv, strict=True):
        h = mx.fast.rms_norm(x, layer["in_norm"], spec.eps)
        qkv = mx.addmm(layer["qkv_bias"], h, layer["qkv"]).reshape(b, nq + nkv, 1, 2 * dp)
        qkv = spec.rope(qkv, offset=positions)  # (rotates dims < D: q and k; v and the flag pass)
        cache = mx.slice_update(cache, qkv[:, nq:], idx, axes=(2,))
        if spec.wide_attention:
            o = mx.fast.scaled_dot_product_attention(qkv[:, :nq], cache, cache, scale=spec.scale)[..., dp:]
        else:
            o = mx.fast.scaled_dot_product_attention(qkv[:, :nq, :, :dp], cache[..., :dp], cache[..., dp:],
                                                     scale=spec.scale)
        residual = x if "o_bias" not in layer else x + layer["o_bias"]
        x = mx.addmm(residual, o.reshape(b, nq * dp), layer["o"])
        h = mx.fast.rms_norm(x, layer["post_norm"], spec.eps)
        gu = h @ layer["gate_up"] if "gate_up_bias" not in layer else mx.addmm(layer["gate_up_bias"], h, layer["gate_up"])
        hidden = gu.shape[-1] // 2
        residual = x if "down_bias" not in layer else x + layer["down_bias"]
        x = mx.addmm(residual, swiglu(gu[:, :hidden], gu[:, hidden:]), layer["down"])
        out.append(cache)
    x = mx.fast.rms_norm(x, weights["norm"], spec.eps)
    return x @ weights["head"], out


def make_fused_step(spec: Spec, sampler: Callable[[mx.array, mx.array], mx.array], compiled: bool = True) -> Callable:
    """The compiled step `(weights, tokens [B] int32, state) -> (next [B] int32, logprob [B]
    float32, state)`, state = ([KV cache] per layer, positions [B] int32, idx [1] int32, rows
    [B] int32); sampling as `mlxcore.models.decode_step.make_step` (log-softmax of the logits,
    `sampler(logprobs, rows)`, the picked token's log-probability). MLX's PRNG state is a
    captured input and output. `compiled` False: the same function, run eagerly (no fused
    kernels to compile on a fresh GPU)."""

    def step(weights, tokens, state):
        kv, positions, idx, rows = state
        logits, kv = forward(spec, weights, tokens, kv, positions, idx)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        nxt = sampler(logprobs, rows).astype(mx.int32)  # (one index dtype: `decode.token_array`)
        picked = mx.take_along_axis(logprobs, nxt[:, None], axis=-1)[:, 0]
        return nxt, picked.astype(mx.float32), (kv, positions + 1, idx + 1, rows)

    return mx.compile(step, inputs=[mx.random.state], outputs=[mx.random.state]) if compiled else step
