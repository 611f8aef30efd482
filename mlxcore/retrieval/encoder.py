"""Multi-vector encoder: T5 or BERT, an optional linear projection, per-token L2 normalisation.

Params are the model's HF-keyed tree plus, for XTR / ColBERT checkpoints (or a projection
trained from scratch), `params["projection"]["weight"]` [dim, d_model] without bias - the
`linear` / `2_Dense` layer of those checkpoints. It goes through `quant.linear` like every
other linear, so it can carry an adapter or be trained in full.
"""

from __future__ import annotations

import math
from itertools import accumulate

import attrs
import mlx.core as mx

from mlxcore.kernels import dispatch
from mlxcore.models import bert, t5
from mlxcore.models.t5 import FUSED_VJP_LENGTH, layer_keys
from mlxcore.retrieval.late_interaction import l2_normalize
from mlxcore.train import quant

KINDS = ("t5", "bert")


def _check_model(spec: EncoderSpec, _attr, model) -> None:
    wanted = {"t5": t5.T5Config, "bert": bert.BertConfig}[spec.kind]
    if not isinstance(model, wanted):
        raise TypeError(f"EncoderSpec(kind={spec.kind!r}) needs a {wanted.__name__}, "
                        f"got {type(model).__name__}")


@attrs.frozen(kw_only=True)
class EncoderSpec:
    """What `token_embeddings` needs besides arrays: encoder kind, its config, LoRA scale/dropout."""

    kind: str = attrs.field(validator=attrs.validators.in_(KINDS))
    model: t5.T5Config | bert.BertConfig = attrs.field(validator=_check_model)
    lora_scale: float = 1.0
    lora_dropout: float = 0.0

    @property
    def d_model(self) -> int:
        """Width of the encoder's hidden states (the projection's input)."""
        return self.model.d_model


def hidden_states(params: dict, input_ids: mx.array, mask: mx.array, spec: EncoderSpec,
                  key: mx.array | None = None) -> mx.array:
    """The encoder's last hidden states [B, T, d_model] (no projection, no normalisation)."""
    module = t5 if spec.kind == "t5" else bert
    return module.encode(params, input_ids, mask, spec.model, spec.lora_scale,
                         spec.lora_dropout, key)


def token_embeddings(params: dict, input_ids: mx.array, mask: mx.array, spec: EncoderSpec,
                     key: mx.array | None = None) -> mx.array:
    """Unit-norm token embeddings [B, T, dim] of ids [B, T] under mask [B, T].

    dim is the projection's output size when `params["projection"]` exists, else d_model.
    `key` is needed only when spec.lora_dropout > 0. Padded positions hold finite unit vectors
    that `retrieval.maxsim` ignores through the mask.
    """
    encoder_key, projection_key = layer_keys(key, 2)
    return _project_normalize(params, hidden_states(params, input_ids, mask, spec, encoder_key), spec,
                              projection_key)


def _project_normalize(params: dict, h: mx.array, spec: EncoderSpec, key: mx.array | None = None) -> mx.array:
    """Hidden states [..., d_model] -> unit-norm embeddings [..., dim] (through the projection
    when the params hold one); per token."""
    if "projection" in params:
        h = quant.linear(params["projection"], h, spec.lora_scale, spec.lora_dropout, key)
    return l2_normalize(h)


def joint_length(shapes: list[tuple[int, int]]) -> int | None:
    """The row length at which batches of shapes [(B, T), ...] can share one encoder pass, or
    None: on CUDA, for two or more batches whose lengths all divide it and whose B T tokens fill
    whole rows: FUSED_VJP_LENGTH where the longest T is shorter and that fits (so attention's
    backward runs fused, as `t5.pack_factor` arranges for one batch), else the longest T."""
    if len(shapes) < 2 or not dispatch.on_cuda():
        return None
    longest = max(t for _, t in shapes)
    for length in (max(longest, FUSED_VJP_LENGTH), longest):
        if all(length % t == 0 and (b * t) % length == 0 for b, t in shapes):
            return length
    return None


def joint_token_embeddings(params: dict, batches: list[tuple[mx.array, mx.array]],
                           spec: EncoderSpec, keys: list[mx.array | None] | None = None) -> list[mx.array]:
    """`token_embeddings` of several batches [(ids [B, T], mask [B, T]), ...] (queries,
    documents, negatives), one [B, T, dim] per batch.

    Where `joint_length` allows (and LoRA dropout is off), the batches run through the encoder
    as one: each laid end to end in rows of that length under a block-diagonal attention bias
    (no token sees another sequence), the rows concatenated, one pass, split again. The result
    equals separate passes on every real token; the short batch's GEMMs and elementwise passes
    ride in the long one's (the MiniLM b128 step's 32-token queries beside 256-token documents:
    about a quarter fewer kernels on a GPU; its attention runs the queries' block-diagonal rows
    at the documents' length, which spends part of the saving; dev/LOG.md).
    Elsewhere each batch runs alone, with its own key from `keys`.
    """
    keys = keys or [None] * len(batches)
    length = None if spec.lora_dropout else joint_length([ids.shape for ids, _ in batches])
    if length is None:
        return [token_embeddings(params, ids, mask, spec, k) for (ids, mask), k in zip(batches, keys, strict=True)]
    module = t5 if spec.kind == "t5" else bert
    rows, biases = [], []
    for ids, mask in batches:
        h, bias = t5.pack_to(*module.embed(params, ids, mask, spec.model), length)
        rows.append(h)
        biases.append(bias)
    # every batch's bias is [rows, 1, length, length] (T5's blocks add the positions' heads once)
    h = module.blocks(params, mx.concatenate(rows), mx.concatenate(biases), spec.model, spec.lora_scale)
    h = _project_normalize(params, module.finish(params, h, spec.model), spec)
    # one Split (whose vjp is one concatenate), not slices (each a zero-filled scatter back)
    parts = mx.split(h, list(accumulate(r.shape[0] for r in rows[:-1])))
    return [p.reshape(*ids.shape, p.shape[-1]) for p, (ids, _) in zip(parts, batches, strict=True)]


def init_projection(key: mx.array, d_model: int, dim: int, dtype=mx.float32) -> dict:
    """A fresh bias-free projection `{"weight": [dim, d_model]}` ~ U(+-1/sqrt(d_model)),
    torch.nn.Linear's default, for encoders shipped without one (trained from scratch)."""
    bound = 1.0 / math.sqrt(d_model)
    return {"weight": mx.random.uniform(-bound, bound, (dim, d_model), dtype, key=key)}
