"""The retriever a run trains: an encoder (`mlxio.weights.encoders.load_encoder`) with LoRA
adapters on its attention projections (`mlxcore.train.lora`), a trainable projection when one is
asked for and the checkpoint has none, and the memory options (blocks under `mx.checkpoint`,
the frozen base in bf16 while the float32 one is kept for evaluation and export)."""

from __future__ import annotations

import logging

import attrs
import mlx.core as mx

from mlxcore.retrieval import objective
from mlxcore.retrieval.encoder import EncoderSpec, init_projection
from mlxcore.train import lora, precision
from mlxcore.train.tree import Tree, combine, count_params, flatten, partition
from mlxio.run import checks
from mlxio.weights.encoders import LoadedEncoder, load_encoder

log = logging.getLogger(__name__)


@attrs.frozen(kw_only=True)
class TrainableRetriever:
    encoder: LoadedEncoder
    spec: EncoderSpec  # the encoder's, with gradient checkpointing as configured (what the loss runs)
    params: Tree  # the initial tree: base (in the compute dtype) + fresh LoRA (+ projection)
    untrained: Tree  # the same in float32: the untrained baseline, and the base of evaluation / export
    targets: tuple[str, ...]  # the linear layers with adapters
    train_projection: bool

    def trainable(self, path: str, _leaf=None) -> bool:
        """What the optimizer updates: the adapters (and the added projection)."""
        return lora.is_lora_path(path) or (self.train_projection and path.startswith("projection."))

    @property
    def trainable_params(self) -> int:
        return count_params(partition(self.params, self.trainable)[0])


def load_trainable(model_path: str, lora_cfg: lora.LoraConfig, *, projection_dim: int, seed: int,
                   gradient_checkpointing: bool, compute_dtype: str,
                   max_lengths: dict[str, int]) -> TrainableRetriever:
    """The encoder at `model_path` with LoRA (rank, scale, dropout, targets: the encoder kind's
    q/v by default) initialised from `seed`, checked against the model: every target matches a
    linear layer and every length in `max_lengths` ({setting name: tokens}) fits its position
    embeddings (ConfigError naming the setting)."""
    encoder = load_encoder(model_path, lora_scale=lora_cfg.scale, lora_dropout=lora_cfg.dropout)
    targets = lora_cfg.targets or objective.DEFAULT_TARGETS[encoder.spec.kind]
    checks.check_targets(targets, [path[: -len(".weight")] for path, leaf in flatten(encoder.params).items()
                                   if path.endswith(".weight") and leaf.ndim == 2], where=model_path)
    max_positions = getattr(encoder.spec.model, "max_position_embeddings", None)
    if max_positions is not None:
        for name, length in max_lengths.items():
            checks.check_at_most(name, length, max_positions, "the model's max_position_embeddings",
                                 where=model_path)
    init_key, projection_key = mx.random.split(mx.random.key(seed))
    adapters = lora.init(init_key, lora.target_dims(encoder.params, targets), lora_cfg.rank)
    params = combine(encoder.params, adapters)
    train_projection = projection_dim > 0 and "projection" not in params
    if train_projection:
        params = combine(params, {"projection": init_projection(projection_key, encoder.spec.d_model,
                                                                projection_dim)})
    model = TrainableRetriever(encoder=encoder, spec=objective.with_checkpointing(encoder.spec, gradient_checkpointing),
                               params=params, untrained=params, targets=targets, train_projection=train_projection)
    log.info("%s encoder %s: %d params, %d trainable (LoRA r=%d on %s%s)", encoder.spec.kind, model_path,
             count_params(params), model.trainable_params, lora_cfg.rank, ",".join(targets),
             " + projection" if train_projection else "")
    # arrays are immutable: keeping the float32 tree beside the cast one costs only the cast leaves
    return attrs.evolve(model, params=precision.cast_frozen(params, model.trainable, compute_dtype))
