"""Speed and memory options shared by the retriever recipe, its batch-size probe and the
benchmarks: gradient checkpointing, bf16 compute, the contrastive loss with a float32 score
head, and a synthetic worst-case batch.

bf16 mixed precision here means: the frozen base weights are stored and computed in bfloat16
(half the memory, half the bandwidth), the LoRA parameters and the optimizer state stay float32
(`lora.delta` casts A and B to the activations' dtype on the way in, so their gradients come
back float32), and the token embeddings are cast to float32 before MaxSim and the loss, whose
temperature 0.07 magnifies rounding.
"""

from __future__ import annotations

import logging

import attrs
import mlx.core as mx
import numpy as np

from mlxcore import quant, retrieval
from mlxcore.encoder import EncoderSpec, token_embeddings
from mlxcore.tree import Tree, combine, flatten, partition, unflatten
from mlxio.data.token_cache import padded_length
from mlxio.errors import ConfigError
from mlxio.run import batch_sizer

log = logging.getLogger(__name__)

COMPUTE_DTYPES = {"float32": mx.float32, "bfloat16": mx.bfloat16, "float16": mx.float16}


def with_checkpointing(spec: EncoderSpec, on: bool) -> EncoderSpec:
    """The spec whose encoder wraps each block in `mx.checkpoint` (or not)."""
    return attrs.evolve(spec, model=attrs.evolve(spec.model, gradient_checkpointing=on))


def cast_frozen(params: Tree, trainable, dtype_name: str) -> Tree:
    """Floating leaves that `trainable(path)` rejects cast to the compute dtype; the trainable
    leaves (LoRA, projection) keep their float32 master copy."""
    if dtype_name not in COMPUTE_DTYPES:
        raise ValueError(f"compute dtype {dtype_name!r}: expected one of {sorted(COMPUTE_DTYPES)}")
    dtype = COMPUTE_DTYPES[dtype_name]
    return unflatten({p: (v.astype(dtype) if not trainable(p) and mx.issubdtype(v.dtype, mx.floating) else v)
                      for p, v in flatten(params).items()})


def contrastive_loss_fn(spec: EncoderSpec, temperature: float = 0.07, margin: float = 0.2,
                        margin_weight: float = 0.1, xtr_k_train: int = 0):
    """loss(params, micro_batch, key) -> (loss, aux): InfoNCE + margin over in-batch negatives,
    with embeddings cast to float32 before scoring (a no-op for float32 compute)."""

    def loss_fn(params, batch, key):
        q_key, d_key = mx.random.split(key)
        q = token_embeddings(params, batch["query_ids"], batch["query_mask"], spec, q_key).astype(mx.float32)
        d = token_embeddings(params, batch["doc_ids"], batch["doc_mask"], spec, d_key).astype(mx.float32)
        if xtr_k_train > 0:
            scores = retrieval.xtr_scores(q, batch["query_mask"], d, batch["doc_mask"], xtr_k_train)
        else:
            scores = retrieval.maxsim(q, batch["query_mask"], d, batch["doc_mask"])
        return retrieval.contrastive_loss(scores, temperature, margin, margin_weight)

    return loss_fn


def synthetic_batch(vocab_size: int, micro_batch: int, accum: int, query_len: int, doc_len: int,
                    seed: int = 0) -> dict[str, mx.array]:
    """A full-length batch {query_ids, query_mask, doc_ids, doc_mask}, leaves [accum, micro, T]:
    every position real, the worst case for memory at these lengths."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, length in (("query", query_len), ("doc", doc_len)):
        out[f"{name}_ids"] = mx.array(rng.integers(1, vocab_size, (accum, micro_batch, length)).astype(np.int32))
        out[f"{name}_mask"] = mx.ones((accum, micro_batch, length), mx.int32)  # as token_cache gives
    return out


def restore_frozen(params: Tree, float_params: Tree, trainable) -> Tree:
    """The trained leaves of `params` over the float32 frozen leaves of `float_params` (undoes
    `cast_frozen` for evaluation and export)."""
    return combine(partition(float_params, lambda p, _: not trainable(p))[0], partition(params, trainable)[0])


def with_fake_quant(loss_fn, rules: tuple[quant.QuantRule, ...], lora_scale: float):
    """QAT: `loss_fn` evaluated on the fake-quantised tree (adapters folded into their weights,
    straight-through gradients), i.e. on the model that post-training quantisation will give."""

    def wrapped(params, batch, key):
        return loss_fn(quant.fake_quantize_tree(params, rules, lora_scale), batch, key)

    return wrapped


def probe_spec(model_path: str, lora_cfg, targets: tuple[str, ...], query_len: int, doc_len: int,
               gradient_checkpointing: bool, compute_dtype: str, xtr_k_train: int, qat: tuple[str, ...] = ()) -> dict:
    """The `mlxio.run.batch_probe` spec of a recipe run (full-length batches: the worst case)."""
    return {"model": model_path, "lora_rank": lora_cfg.rank, "lora_alpha": lora_cfg.alpha, "targets": list(targets),
            "query_len": query_len, "doc_len": doc_len, "gradient_checkpointing": gradient_checkpointing,
            "compute_dtype": compute_dtype, "xtr_k_train": xtr_k_train, "qat": list(qat)}


def parse_rules(texts: tuple[str, ...], field: str) -> tuple[quant.QuantRule, ...]:
    """Quant rules from config strings; ConfigError naming the field and the rule."""
    try:
        return tuple(quant.parse_rule(text) for text in texts)
    except ValueError as err:
        raise ConfigError(f"{field}: {err}") from None


def plan_batch(cfg, model_path: str, targets: tuple[str, ...], effective: int, world) -> batch_sizer.Plan:
    """The retriever recipe's memory-driven split of `effective` samples (see mlxio.run.batch_sizer)."""
    if world.size > 1:
        raise ConfigError("memory.auto_batch: single-process runs only (size each rank's share by hand)")
    budget = batch_sizer.memory_budget(cfg.memory.budget_mb, cfg.memory.budget_fraction)
    spec = probe_spec(model_path, cfg.lora, targets, padded_length(cfg.data.max_query_len, cfg.data.bucket),
                      padded_length(cfg.data.max_doc_len, cfg.data.bucket), cfg.memory.gradient_checkpointing,
                      cfg.memory.compute_dtype, cfg.loss.xtr_k_train, cfg.quant.qat)
    plan = batch_sizer.plan_micro_batch(spec, effective, budget, max_micro=cfg.memory.max_micro_batch, min_micro=2)
    log.info("auto batch: micro-batch %d x accum %d (budget %.0f MB; predicted peak %.0f MB; %d probes)",
             plan.micro_batch, plan.accum, budget / 2**20, plan.predicted_peak() / 2**20, len(plan.probes))
    return plan
