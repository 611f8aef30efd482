"""T5 encoder (v1.0 / GTR / XTR with ReLU FFN; v1.1 / Flan with gated GELU) as a pure function.

The params tree is keyed exactly like transformers' `T5EncoderModel` state dict
(`shared.weight`, `encoder.block.0.layer.0.SelfAttention.q.weight`, ...,
`encoder.final_layer_norm.weight`), so loading and export are the identity and LoRA adapters
placed beside a weight (`...SelfAttention.q.lora_a`) apply through `mlxcore.train.quant.linear`
(`lora.linear`, or a quantised base when the layer holds `scales`). `gradient_checkpointing`
wraps each block in `mx.checkpoint`: its activations are recomputed in the backward pass.

T5 specifics: RMS layer norm without bias, no 1/sqrt(d) attention scaling, and a bucketed
relative-position bias computed once by block 0's `relative_attention_bias` and added to every
block's attention scores.
"""

from __future__ import annotations

import math
from typing import ClassVar

import attrs
import mlx.core as mx

from mlxcore.kernels import dispatch
from mlxcore.models import norm
from mlxcore.models.hf_config import HFConfig, choice
from mlxcore.train import quant

# Additive mask for padded keys: finite (not -inf) so an all-padding row gives a uniform softmax
# instead of NaN, and large enough that exp() of it is exactly 0 in float32 and bfloat16.
NEG_INF = -1e9

FFN_KINDS = ("relu", "gated-gelu")


@attrs.frozen(kw_only=True)
class T5Config(HFConfig):
    """Shape of a T5 encoder (names as in transformers' `T5Config`)."""

    MODEL: ClassVar[str] = "T5"

    d_model: int
    d_kv: int
    d_ff: int
    num_layers: int
    num_heads: int
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    feed_forward_proj: str = choice("relu", FFN_KINDS)
    layer_norm_epsilon: float = 1e-6


def param_shapes(cfg: T5Config) -> dict[str, tuple[int, ...]]:
    """{dotted HF key: shape} of every weight of the encoder (what a checkpoint must hold)."""
    inner = cfg.num_heads * cfg.d_kv
    shapes = {"shared.weight": (cfg.vocab_size, cfg.d_model)}
    for i in range(cfg.num_layers):
        att = f"encoder.block.{i}.layer.0"
        for name in ("q", "k", "v"):
            shapes[f"{att}.SelfAttention.{name}.weight"] = (inner, cfg.d_model)
        shapes[f"{att}.SelfAttention.o.weight"] = (cfg.d_model, inner)
        if i == 0:
            shapes[f"{att}.SelfAttention.relative_attention_bias.weight"] = (
                cfg.relative_attention_num_buckets, cfg.num_heads)
        shapes[f"{att}.layer_norm.weight"] = (cfg.d_model,)
        ff = f"encoder.block.{i}.layer.1"
        wi = ("wi_0", "wi_1") if cfg.feed_forward_proj == "gated-gelu" else ("wi",)
        for name in wi:
            shapes[f"{ff}.DenseReluDense.{name}.weight"] = (cfg.d_ff, cfg.d_model)
        shapes[f"{ff}.DenseReluDense.wo.weight"] = (cfg.d_model, cfg.d_ff)
        shapes[f"{ff}.layer_norm.weight"] = (cfg.d_model,)
    shapes["encoder.final_layer_norm.weight"] = (cfg.d_model,)
    return shapes


def relative_position_bucket(relative_position: mx.array, num_buckets: int,
                             max_distance: int) -> mx.array:
    """Bidirectional T5 bucket of `memory - query` positions (int32, any shape) -> int32 same shape.

    Half the buckets per direction are exact offsets, the rest log-spaced up to `max_distance`;
    float32 arithmetic in the same order as transformers so boundaries land identically.
    """
    num_buckets //= 2
    buckets = (relative_position > 0).astype(mx.int32) * num_buckets
    distance = mx.abs(relative_position)
    max_exact = num_buckets // 2
    # max(distance, 1) keeps log() finite where the exact branch is taken anyway.
    scaled = (mx.log(mx.maximum(distance, 1).astype(mx.float32) / max_exact)
              / math.log(max_distance / max_exact) * (num_buckets - max_exact))
    large = mx.minimum(max_exact + scaled.astype(mx.int32), num_buckets - 1)
    return buckets + mx.where(distance < max_exact, distance, large)


def position_bias(table: mx.array, length: int, cfg: T5Config) -> mx.array:
    """Relative-attention bias [1, H, T, T] from block 0's table [num_buckets, H], gathered
    head-major (row-contiguous, as `bias_cuda.add_heads` reads it)."""
    positions = mx.arange(length, dtype=mx.int32)
    relative = positions[None, :] - positions[:, None]  # memory - query, [T, T]
    buckets = relative_position_bucket(relative, cfg.relative_attention_num_buckets,
                                       cfg.relative_attention_max_distance)
    return mx.take(table.T, buckets, axis=1)[None]


def padding_bias(mask: mx.array, dtype=mx.float32) -> mx.array:
    """Additive key mask [B, 1, 1, T]: 0 for real tokens, NEG_INF for padding (mask [B, T])."""
    return mx.where(mask.astype(mx.bool_), 0.0, NEG_INF).astype(dtype)[:, None, None, :]


def attention(q: mx.array, k: mx.array, v: mx.array, bias: mx.array, scale: float) -> mx.array:
    """Softmax attention with an additive bias: q, k, v [B, H, T, d], bias [B|1, H|1, T, T].

    Through `mx.fast.scaled_dot_product_attention` (T5 passes scale=1.0). On the CPU build this
    kernel falls back to the same matmul + precise softmax graph as writing it out - outputs
    are bit-identical and speed equal within noise (dev/LOG.md) - while Metal and CUDA get a
    fused kernel, so the fast path is the one kept.
    """
    return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=bias)


# MLX's CUDA attention backward runs fused (cuDNN) only when the query length is a multiple of
# 128 (`ScaledDotProductAttentionVJP::use_fallback`); shorter sequences get the unfused
# softmax-and-matmuls vjp (the MiniLM b128 step's 32-token queries: many small kernels).
FUSED_VJP_LENGTH = 128


def pack_factor(batch: int, length: int) -> int:
    """How many sequences to lay end to end (1: none) so that attention's backward runs fused:
    FUSED_VJP_LENGTH / length when that divides evenly and divides the batch, on CUDA only."""
    if not dispatch.on_cuda():
        return 1
    if length % FUSED_VJP_LENGTH == 0 or FUSED_VJP_LENGTH % length:
        return 1
    p = FUSED_VJP_LENGTH // length
    return p if batch % p == 0 else 1


def packed_bias(bias: mx.array, p: int) -> mx.array:
    """Attention bias for p sequences laid end to end: bias [B, H|1, T|1, T] -> block-diagonal
    [B/p, H|1, pT, pT], each sequence's own bias on the diagonal and NEG_INF off it, so no
    token sees another sequence. Packed outputs equal the unpacked ones on every row that has a
    real key (a fully padded sequence's rows, which callers mask, differ)."""
    b, h, _, t = bias.shape
    per_seq = mx.broadcast_to(bias, (b, h, t, t)).reshape(b // p, p, h, t, t).transpose(0, 2, 1, 3, 4)
    same = mx.eye(p, dtype=mx.bool_)[None, None, :, None, :, None]  # [.., p_query, ., p_key, .]
    out = mx.where(same, per_seq[:, :, :, :, None, :], mx.array(NEG_INF, bias.dtype))
    return out.reshape(b // p, h, p * t, p * t)


def pack_sequences(h: mx.array, bias: mx.array) -> tuple[mx.array, mx.array]:
    """h [B, T, D] and its attention bias [B, H|1, T|1, T] with `pack_factor(B, T)` sequences
    per row - ([B/p, pT, D], block-diagonal [B/p, H|1, pT, pT]) - or unchanged when p is 1.
    Every op of an encoder layer but attention is per token, so the layers run on the packed
    rows as they are; `h.reshape(B, T, D)` unpacks."""
    b, t, _ = h.shape
    p = pack_factor(b, t)
    return (h, bias) if p == 1 else pack_to(h, bias, p * t)


def pack_to(h: mx.array, bias: mx.array, length: int) -> tuple[mx.array, mx.array]:
    """h [B, T, D] and its bias [B, H|1, T|1, T] in rows of `length` tokens (a multiple of T
    with B T / length whole): ([B T / length, length, D], [B T / length, H|1, length, length]),
    block-diagonal when several sequences share a row (`packed_bias`)."""
    b, t, d = h.shape
    p = length // t
    packed = mx.broadcast_to(bias, (b, bias.shape[1], t, t)) if p == 1 else packed_bias(bias, p)
    return h.reshape(b * t // length, length, d), packed


def split_heads(x: mx.array, num_heads: int) -> mx.array:
    """[B, T, H*d] -> [B, H, T, d]."""
    b, t, _ = x.shape
    return x.reshape(b, t, num_heads, -1).transpose(0, 2, 1, 3)


def merge_heads(x: mx.array) -> mx.array:
    """[B, H, T, d] -> [B, T, H*d]."""
    b, h, t, d = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b, t, h * d)


def layer_keys(key: mx.array | None, n: int) -> list[mx.array | None]:
    """n PRNG keys (for LoRA dropout) split from `key`, or n Nones when there is no key."""
    return [None] * n if key is None else list(mx.random.split(key, n))


def gelu_new(x: mx.array) -> mx.array:
    """transformers' `gelu_new` (tanh approximation), used by T5 v1.1 / Flan."""
    return 0.5 * x * (1.0 + mx.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def relu(x: mx.array) -> mx.array:
    """max(x, 0) (`mlxcore.kernels.dispatch.relu`: on CUDA a kernel whose backward reads a bitmask)."""
    return dispatch.relu(x)


def _block(block: dict, h: mx.array, bias: mx.array, cfg: T5Config, scale: float,
           dropout: float, key: mx.array | None) -> mx.array:
    att, ff = block["layer"]
    keys = layer_keys(key, 7)
    sa = att["SelfAttention"]
    # rms_norm_residual: h's gradients through the residual and through the norm meet in the
    # norm's backward kernel; the residual add itself rides in the o / wo GEMM (`residual=`)
    h, x = norm.rms_norm_residual(h, att["layer_norm"]["weight"], cfg.layer_norm_epsilon)
    q, k, v = (split_heads(y, cfg.num_heads)
               for y in quant.linears([sa[n] for n in "qkv"], x, scale, dropout, keys[:3]))
    h = quant.linear(sa["o"], merge_heads(attention(q, k, v, bias, 1.0)), scale, dropout,
                     keys[3], residual=h)
    dense = ff["DenseReluDense"]
    h, x = norm.rms_norm_residual(h, ff["layer_norm"]["weight"], cfg.layer_norm_epsilon)
    if cfg.feed_forward_proj == "gated-gelu":
        inner = (gelu_new(quant.linear(dense["wi_0"], x, scale, dropout, keys[4]))
                 * quant.linear(dense["wi_1"], x, scale, dropout, keys[6]))
        return quant.linear(dense["wo"], inner, scale, dropout, keys[5], residual=h)
    # the ReLU in the wi GEMM's epilogue where the kernel runs, else wi, ReLU and wo as layers
    return dispatch.relu_ffn(dense["wi"], dense["wo"], x, h, dropout, unfused=lambda: quant.linear(
        dense["wo"], relu(quant.linear(dense["wi"], x, scale, dropout, keys[4])), scale, dropout, keys[5], residual=h))


def embed(params: dict, input_ids: mx.array, mask: mx.array, cfg: T5Config) -> tuple[mx.array, mx.array]:
    """The blocks' inputs for ids [B, T] under mask [B, T]: token embeddings [B, T, d_model] and
    the padded keys' bias [B, 1, 1, T] (`blocks` adds the relative positions)."""
    h = quant.embed(params["shared"], input_ids, cfg.d_model)
    return h, padding_bias(mask, h.dtype)


def blocks(params: dict, h: mx.array, bias: mx.array, cfg: T5Config, lora_scale: float = 1.0,
           lora_dropout: float = 0.0, key: mx.array | None = None) -> mx.array:
    """Every block over h [B, T, d_model] under a bias [B|1, 1|H, T|1, T] (padded keys, and the
    block-diagonal of packed rows) -> [B, T, d_model].

    The relative-position bias [1, H, T, T] is added here, once for all blocks: within a packed
    row's diagonal block, key minus query position is the sequence's own, so one table serves
    packed and unpacked rows alike (off the diagonal the bias is NEG_INF either way).
    """
    table = params["encoder"]["block"][0]["layer"][0]["SelfAttention"]["relative_attention_bias"]["weight"]
    pos = position_bias(table, h.shape[1], cfg).astype(h.dtype)
    bias = dispatch.add_heads(pos, bias)
    for block, block_key in zip(params["encoder"]["block"], layer_keys(key, cfg.num_layers), strict=True):
        # The dropout key is closed over, not an input: mx.checkpoint differentiates every
        # input, and random bits have no vjp.
        def run(block, h, bias, block_key=block_key):
            return _block(block, h, bias, cfg, lora_scale, lora_dropout, block_key)

        h = (mx.checkpoint(run) if cfg.gradient_checkpointing else run)(block, h, bias)
    return h


def finish(params: dict, h: mx.array, cfg: T5Config) -> mx.array:
    """The final RMS norm of the blocks' output [..., d_model] (per token)."""
    return norm.rms_norm(h, params["encoder"]["final_layer_norm"]["weight"], cfg.layer_norm_epsilon)


def encode(params: dict, input_ids: mx.array, mask: mx.array, cfg: T5Config,
           lora_scale: float = 1.0, lora_dropout: float = 0.0,
           key: mx.array | None = None) -> mx.array:
    """Last hidden states [B, T, d_model] of ids [B, T] (int32) under mask [B, T] (1 = real).

    lora_scale / lora_dropout apply to every adapter in the tree (none: plain T5); dropout needs
    `key`. Padded positions get finite values that callers must mask.
    """
    b, t = input_ids.shape
    h, bias = pack_sequences(*embed(params, input_ids, mask, cfg))
    h = blocks(params, h, bias, cfg, lora_scale, lora_dropout, key)
    return finish(params, h.reshape(b, t, cfg.d_model), cfg)
