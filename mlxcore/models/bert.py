"""BERT encoder (MiniLM, ColBERTv2's BERT, ...) as a pure function of a params tree.

The tree is keyed like transformers' `BertModel` state dict without the pooler
(`embeddings.word_embeddings.weight`, `encoder.layer.0.attention.self.query.weight`, ...), so
loading and export are the identity; LoRA adapters beside `query` / `value` weights apply
through `mlxcore.train.quant.linear` (`lora.linear`, or a quantised base when the layer holds `scales`).
Post-LN blocks, absolute position embeddings, exact (erf) GELU (see `gelu_erf`). `gradient_checkpointing` wraps
each layer in `mx.checkpoint`: its activations are recomputed in the backward pass, not kept.
"""

from __future__ import annotations

import math
from typing import ClassVar

import attrs
import mlx.core as mx

from mlxcore.models import norm
from mlxcore.models.hf_config import HFConfig, choice
from mlxcore.models.t5 import (
    attention,
    gelu_new,
    layer_keys,
    merge_heads,
    pack_sequences,
    padding_bias,
    split_heads,
)
from mlxcore.train import quant

ACTIVATIONS = ("gelu", "gelu_new", "relu")


@attrs.frozen(kw_only=True)
class BertConfig(HFConfig):
    """Shape of a BERT encoder (names as in transformers' `BertConfig`)."""

    MODEL: ClassVar[str] = "BERT"

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    hidden_act: str = choice("gelu", ACTIVATIONS)
    layer_norm_eps: float = 1e-12

    @property
    def d_model(self) -> int:
        return self.hidden_size

    @classmethod
    def check_hf(cls, config: dict) -> None:
        pos = config.get("position_embedding_type", "absolute")
        if pos != "absolute":
            raise ValueError(f"BERT config key 'position_embedding_type'={pos!r}: only 'absolute'")
        if config["hidden_size"] % config["num_attention_heads"]:
            raise ValueError("BERT config: 'hidden_size' is not a multiple of 'num_attention_heads'")


def param_shapes(cfg: BertConfig) -> dict[str, tuple[int, ...]]:
    """{dotted HF key: shape} of every weight of the encoder (what a checkpoint must hold)."""
    d, ff = cfg.hidden_size, cfg.intermediate_size
    shapes = {
        "embeddings.word_embeddings.weight": (cfg.vocab_size, d),
        "embeddings.position_embeddings.weight": (cfg.max_position_embeddings, d),
        "embeddings.token_type_embeddings.weight": (cfg.type_vocab_size, d),
        "embeddings.LayerNorm.weight": (d,),
        "embeddings.LayerNorm.bias": (d,),
    }
    for i in range(cfg.num_hidden_layers):
        p = f"encoder.layer.{i}"
        for name in ("query", "key", "value"):
            shapes[f"{p}.attention.self.{name}.weight"] = (d, d)
            shapes[f"{p}.attention.self.{name}.bias"] = (d,)
        linears = {"attention.output.dense": (d, d), "intermediate.dense": (ff, d),
                   "output.dense": (d, ff)}
        for name, shape in linears.items():
            shapes[f"{p}.{name}.weight"] = shape
            shapes[f"{p}.{name}.bias"] = (shape[0],)
        for name in ("attention.output.LayerNorm", "output.LayerNorm"):
            shapes[f"{p}.{name}.weight"] = (d,)
            shapes[f"{p}.{name}.bias"] = (d,)
    return shapes


def _layer_norm(p: dict, x: mx.array, eps: float) -> mx.array:
    return norm.layer_norm(x, p["weight"], p["bias"], eps)


# Abramowitz & Stegun 7.1.28: erf(a) = 1 - (1 + a1 a + ... + a6 a^6)^-16 for a >= 0, |error| <= 3e-7.
ERF_COEFFS = (0.0705230784, 0.0422820123, 0.0092705272, 0.0001520143, 0.0002765672, 0.0000430638)


def gelu_erf(x: mx.array) -> mx.array:
    """Exact GELU x * Phi(x) = 0.5 (x + |x| erf(|x| / sqrt 2)), erf by A&S 7.1.28.

    Why not `mx.erf`: MLX's Linux CPU build evaluates it (and exp, tanh) as scalar code, which
    made GELU a large share of MiniLM's forward time; this form is only multiplies, adds and one
    divide, which `mx.compile` fuses into one vectorised loop (several times faster; dev/LOG.md).
    Max |error| vs the erf form
    9.5e-7 in value and 1.4e-6 in gradient over [-12, 12]. |x| / sqrt 2 is capped at 4.5
    (erf = 1 - 2e-10 there), so p^16 never overflows and gradients stay finite.
    """
    a = mx.minimum(mx.abs(x) * (1.0 / math.sqrt(2.0)), 4.5)
    c = ERF_COEFFS
    p = 1.0 + a * (c[0] + a * (c[1] + a * (c[2] + a * (c[3] + a * (c[4] + a * c[5])))))
    p = p * p
    p = p * p
    p = p * p
    p = p * p  # p^16
    return 0.5 * (x + mx.abs(x) * (1.0 - 1.0 / p))


@mx.custom_function
def gelu_recomputed(x: mx.array) -> mx.array:
    """Exact GELU x * Phi(x) through `mx.erf`, whose backward recomputes Phi(x) + x phi(x) from
    x (in float32): forward and backward are one fused pass each under `mx.compile`.

    Autodiff of the written-out form keeps the intermediates its vjp needs, which splits the
    forward into three kernels (a visible share of the MiniLM b128 step on a GPU). The
    backward shares no subexpression with the forward (float32 there, `/ sqrt 2` not
    `* 1/sqrt 2`): `mx.compile` merges equal subexpressions, and a shared one would have to be
    written to memory between the two passes (a float32 copy of x each step).
    """
    return x * (0.5 + 0.5 * mx.erf(x * (1.0 / math.sqrt(2.0))))


@gelu_recomputed.vjp
def _gelu_recomputed_vjp(x, cotangent, output):
    # (a one-input custom function gets its primal and cotangent as arrays, not tuples)
    xf = x.astype(mx.float32)
    cdf = 0.5 * mx.erf(xf / math.sqrt(2.0)) + 0.5
    pdf = mx.exp(-0.5 * xf * xf) * (1.0 / math.sqrt(2.0 * math.pi))
    return (cotangent.astype(mx.float32) * (cdf + xf * pdf)).astype(x.dtype)


def _activation(x: mx.array, name: str) -> mx.array:
    if name == "gelu":
        # The polynomial pays off only where erf is scalar code (the CPU build); on a GPU,
        # erf is one fused instruction and the polynomial slowed MiniLM's forward
        # (dev/results/h100/profile_encode.json).
        if mx.default_device() == mx.cpu:
            return gelu_erf(x)
        return gelu_recomputed(x)
    if name == "gelu_new":
        return gelu_new(x)
    return mx.maximum(x, 0.0)


def _layer(layer: dict, h: mx.array, bias: mx.array, cfg: BertConfig, scale: float,
           dropout: float, key: mx.array | None) -> mx.array:
    keys = layer_keys(key, 6)
    sa = layer["attention"]["self"]
    heads = cfg.num_attention_heads
    q, k, v = (split_heads(y, heads) for y in quant.linears([sa[n] for n in ("query", "key", "value")],
                                                            h, scale, dropout, keys[:3]))
    ctx = merge_heads(attention(q, k, v, bias, 1.0 / math.sqrt(q.shape[-1])))
    out = layer["attention"]["output"]
    h = _layer_norm(out["LayerNorm"], h + quant.linear(out["dense"], ctx, scale, dropout, keys[3]),
                    cfg.layer_norm_eps)
    inner = _activation(quant.linear(layer["intermediate"]["dense"], h, scale, dropout, keys[4]),
                        cfg.hidden_act)
    out = layer["output"]
    return _layer_norm(out["LayerNorm"], h + quant.linear(out["dense"], inner, scale, dropout, keys[5]),
                       cfg.layer_norm_eps)


def embed(params: dict, input_ids: mx.array, mask: mx.array, cfg: BertConfig,
          token_type_ids: mx.array | None = None) -> tuple[mx.array, mx.array]:
    """The layers' inputs for ids [B, T] under mask [B, T]: embeddings after their layer norm
    [B, T, hidden] (positions 0..T-1, token types 0 unless given, as `BertModel` defaults) and
    the attention bias [B, 1, 1, T] (padded keys)."""
    if input_ids.shape[1] > cfg.max_position_embeddings:
        raise ValueError(f"sequence length {input_ids.shape[1]} > max_position_embeddings "
                         f"{cfg.max_position_embeddings}")
    emb, d = params["embeddings"], cfg.hidden_size
    h = quant.embed(emb["word_embeddings"], input_ids, d)
    h = h + quant.embed(emb["position_embeddings"], mx.arange(input_ids.shape[1]), d)
    types = mx.zeros_like(input_ids) if token_type_ids is None else token_type_ids
    h = h + quant.embed(emb["token_type_embeddings"], types, d)
    h = _layer_norm(emb["LayerNorm"], h, cfg.layer_norm_eps)
    return h, padding_bias(mask, h.dtype)


def blocks(params: dict, h: mx.array, bias: mx.array, cfg: BertConfig, lora_scale: float = 1.0,
           lora_dropout: float = 0.0, key: mx.array | None = None) -> mx.array:
    """Every layer over h [B, T, hidden] under bias [B|1, 1, T|1, T] -> [B, T, hidden]."""
    for layer, layer_key in zip(params["encoder"]["layer"], layer_keys(key, cfg.num_hidden_layers),
                                strict=True):
        # The dropout key is closed over, not an input: mx.checkpoint differentiates every
        # input, and random bits have no vjp.
        def run(layer, h, bias, layer_key=layer_key):
            return _layer(layer, h, bias, cfg, lora_scale, lora_dropout, layer_key)

        h = (mx.checkpoint(run) if cfg.gradient_checkpointing else run)(layer, h, bias)
    return h


def finish(_params: dict, h: mx.array, _cfg: BertConfig) -> mx.array:
    """BERT's last layer output is its hidden states (post-LN: no final norm)."""
    return h


def encode(params: dict, input_ids: mx.array, mask: mx.array, cfg: BertConfig,
           lora_scale: float = 1.0, lora_dropout: float = 0.0,
           key: mx.array | None = None, token_type_ids: mx.array | None = None) -> mx.array:
    """Last hidden states [B, T, hidden] of ids [B, T] (int32) under mask [B, T] (1 = real).

    Dropout of the LoRA adapters needs `key`. Padded positions get finite values that callers
    must mask.
    """
    b, t = input_ids.shape
    h, bias = pack_sequences(*embed(params, input_ids, mask, cfg, token_type_ids))
    h = blocks(params, h, bias, cfg, lora_scale, lora_dropout, key)
    return h.reshape(b, t, cfg.hidden_size)
