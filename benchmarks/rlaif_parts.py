"""The RLAIF recipes' policy and loss under their Config, built from the library with the
settings `recipes.rlaif_config` (`load_policy`, `loss_fn`) and `recipes.rlaif_judge_config`
(`load_policy`) pass it: benchmarks and dev studies import a recipe's entry, Config and presets
only (docs/architecture.md), and tests/benchmarks/test_rlaif_parts.py checks that these stay
the recipes' own."""

from __future__ import annotations

from mlxio.rl import grpo
from mlxio.weights.llm import Policy


def policy(cfg) -> Policy:
    """The policy the RLAIF recipe trains under `cfg` (an RLAIF Config): `grpo.load_model` with
    its model, LoRA, seed, base dtype and the generation lengths checked against the model."""
    return grpo.load_model(cfg.model, cfg.lora, cfg.lora_layers, cfg.train.seed, dequantize=cfg.dequantize,
                           compute_dtype=cfg.memory.compute_dtype,
                           lengths={"max_new_tokens": cfg.max_new_tokens, "eval.max_new_tokens": cfg.eval.max_new_tokens})


def loss(model, cfg):
    """The RLAIF recipe's update loss under `cfg` on one process (`grpo.make_loss` with its
    beta, clip_eps, grpo and memory settings): loss(lora, micro_batch, key) -> (loss, metrics)."""
    return grpo.make_loss(model, cfg.beta, cfg.clip_eps, cfg.grpo, cfg.memory)


def judge_policy(cfg) -> Policy:
    """The verdict judge's base with fresh LoRA under `cfg` (a judge Config), as its recipe loads it."""
    return grpo.load_model(cfg.model, cfg.lora, cfg.lora_layers, cfg.train.seed, dequantize=cfg.dequantize)
