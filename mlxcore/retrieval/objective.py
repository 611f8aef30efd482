"""The retriever's training objective: encode queries and documents, score every query against
every document of the micro-batch (MaxSim, or XTR's in-batch token retrieval), InfoNCE + margin.

One loss for the recipe (`recipes.xtr_lora`), its batch-size probe (`mlxio.run.batch_probe`)
and the benchmarks, so that all of them measure the function that trains.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import mlx.core as mx

from mlxcore.fields import bounded
from mlxcore.retrieval import late_interaction
from mlxcore.retrieval.encoder import EncoderSpec, joint_token_embeddings
from mlxcore.train import quant

# LoRA targets per encoder kind when the config names none: the attention query and value
DEFAULT_TARGETS = {"bert": ("query", "value"), "t5": ("q", "v")}

# gather(d [n, T, D], d_mask [n, T], n_queries) -> (every rank's d, every rank's mask, positives [n_queries])
DocGather = Callable[[mx.array, mx.array, int], tuple[mx.array, mx.array, mx.array]]


@attrs.frozen(kw_only=True)
class LossConfig:
    # cosines in [-1, 1] over the temperature: below 1e-4 the gradients scale past float32 (1e-30: every
    # gradient norm overflows) and the softmax is a hard max; above 100 every score looks the same
    temperature: float = bounded(0.07, ge=1e-4, le=100)
    margin: float = bounded(0.2, ge=0, le=100)
    margin_weight: float = bounded(0.1, ge=0, le=1000)
    xtr_k_train: int = bounded(0, ge=0, le=65536)  # > 0: XTR in-batch token retrieval scoring with this top-k


def with_checkpointing(spec: EncoderSpec, on: bool) -> EncoderSpec:
    """The spec whose encoder wraps each block in `mx.checkpoint` (or not)."""
    return attrs.evolve(spec, model=attrs.evolve(spec.model, gradient_checkpointing=on))


def contrastive_loss_fn(spec: EncoderSpec, cfg: LossConfig = LossConfig(), gather_docs: DocGather | None = None):
    """loss(params, micro_batch, key) -> (loss, {"info_nce", "margin"}) for `mlxcore.train.step`.

    micro_batch: query_ids / query_mask [n, Tq], doc_ids / doc_mask [n, Td]; query i's positive
    is document i; optional neg_ids / neg_mask [n, K, Tn] are K hard negatives per query, which
    every query of the micro-batch scores beside the documents (`late_interaction.hard_negative_loss`;
    without them the loss is the in-batch one exactly). Similarities are computed in the
    embeddings' dtype and their per-token maxima cast to float32 before the mean and the loss
    (`late_interaction.maxsim`; XTR scoring casts the embeddings first), since the temperature
    magnifies rounding; in float32 nothing is cast.

    gather_docs (data-parallel, `mlxio.run.distributed.document_gather`): each rank holds a
    share of the global micro-batch; its queries are scored against every rank's documents
    (gathered, gradients flowing back to their ranks), so the negatives are the whole global
    micro-batch and the mean of the ranks' losses equals the one-rank loss of the global
    micro-batch.
    """

    embed, loss_on = contrastive_parts(spec, cfg, gather_docs)

    def loss_fn(params, batch, key):
        return loss_on(embed(params, batch, key), batch)

    return loss_fn


def contrastive_parts(spec: EncoderSpec, cfg: LossConfig = LossConfig(), gather_docs: DocGather | None = None):
    """`contrastive_loss_fn` as its two halves, (embed, loss_on), for `mlxcore.train.grad_cache`:
    embed(params, batch, key) -> (q [n, Tq, D], d [n, Td, D]) or (q, d, neg [n * K, Tn, D]): the
    encoder's part, row i of each output depending on row i of the batch alone;
    loss_on(embeddings, batch) -> (loss, {"info_nce", "margin"}): the scoring and the loss, from
    the embeddings and the batch's masks (neg_mask [n, K, Tn] when there are negatives)."""

    def embed(params, batch, key):
        q_key, d_key = mx.random.split(key)
        batches = [(batch["query_ids"], batch["query_mask"]), (batch["doc_ids"], batch["doc_mask"])]
        keys = [q_key, d_key]
        if "neg_ids" in batch:  # hard negatives [n, K, Tn]: scored by every query beside the documents
            n, k, tn = batch["neg_ids"].shape
            batches.append((batch["neg_ids"].reshape(n * k, tn), batch["neg_mask"].reshape(n * k, tn)))
            keys.append(mx.random.split(d_key)[1])
        # one encoder pass for all of them where the shapes allow (on CUDA)
        return tuple(joint_token_embeddings(params, batches, spec, keys))

    def loss_on(embeddings, batch):
        q, d, *neg = embeddings
        d_mask, positives = batch["doc_mask"], None
        if gather_docs is not None:
            d, d_mask, positives = gather_docs(d, d_mask, q.shape[0])
        if neg:
            neg, neg_mask = neg[0], batch["neg_mask"].reshape(neg[0].shape[:2])
        else:
            neg, neg_mask = mx.zeros((0, 1, q.shape[-1]), d.dtype), mx.zeros((0, 1), mx.bool_)
        return late_interaction.hard_negative_loss(q, batch["query_mask"], d, d_mask, neg, neg_mask, cfg.temperature,
                                            cfg.margin, cfg.margin_weight, cfg.xtr_k_train, positives)

    return embed, loss_on


def training_loss(spec: EncoderSpec, cfg: LossConfig, qat_rules: tuple[quant.QuantRule, ...] = (),
                  lora_scale: float = 1.0, gather_docs: DocGather | None = None):
    """The loss a retriever trains on: `contrastive_loss_fn`, evaluated on the fake-quantised
    model when there are QAT rules (so it learns the model post-training quantisation makes)."""
    loss_fn = contrastive_loss_fn(spec, cfg, gather_docs)
    return with_fake_quant(loss_fn, qat_rules, lora_scale) if qat_rules else loss_fn


def training_parts(spec: EncoderSpec, cfg: LossConfig, qat_rules: tuple[quant.QuantRule, ...] = (),
                   lora_scale: float = 1.0):
    """`training_loss` as (embed, loss_on) for `mlxcore.train.grad_cache` (one process: no document gather)."""
    embed, loss_on = contrastive_parts(spec, cfg)
    return (with_fake_quant(embed, qat_rules, lora_scale) if qat_rules else embed), loss_on


def with_fake_quant(loss_fn, rules: tuple[quant.QuantRule, ...], lora_scale: float):
    """QAT: `loss_fn` evaluated on the fake-quantised tree (adapters folded into their weights,
    straight-through gradients), i.e. on the model that post-training quantisation will give."""

    def wrapped(params, batch, key):
        return loss_fn(quant.fake_quantize_tree(params, rules, lora_scale), batch, key)

    return wrapped
