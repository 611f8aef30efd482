"""Multi-vector encoder: T5 or BERT, an optional linear projection, per-token L2 normalisation.

Params are the model's HF-keyed tree plus, for XTR / ColBERT checkpoints (or a projection
trained from scratch), `params["projection"]["weight"]` [dim, d_model] without bias - the
`linear` / `2_Dense` layer of those checkpoints. It goes through `quant.linear` like every
other linear, so it can carry an adapter or be trained in full.
"""

from __future__ import annotations

import math

import attrs
import mlx.core as mx

from mlxcore import bert, quant, t5
from mlxcore.retrieval import l2_normalize
from mlxcore.t5 import layer_keys

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
    h = hidden_states(params, input_ids, mask, spec, encoder_key)
    if "projection" in params:
        h = quant.linear(params["projection"], h, spec.lora_scale, spec.lora_dropout,
                         projection_key)
    return l2_normalize(h)


def init_projection(key: mx.array, d_model: int, dim: int, dtype=mx.float32) -> dict:
    """A fresh bias-free projection `{"weight": [dim, d_model]}` ~ U(+-1/sqrt(d_model)),
    torch.nn.Linear's default, for encoders shipped without one (trained from scratch)."""
    bound = 1.0 / math.sqrt(d_model)
    return {"weight": mx.random.uniform(-bound, bound, (dim, d_model), dtype, key=key)}
