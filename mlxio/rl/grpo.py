"""The RLAIF policy update's building blocks, shared by the recipe (`recipes.rlaif_qwen`) and the
worker (`mlxio.rl.worker`): the policy with fresh LoRA, the loss handed to mlxcore.step, frozen
(no-gradient) log-probabilities and the step's batch. `cfg` is the recipe's Config
(`recipes.rlaif_config`); only its fields are read.
"""

from __future__ import annotations

import hashlib

import attrs
import mlx.core as mx
import numpy as np

from mlxcore import policy as pg
from mlxio.errors import ConfigError
from mlxio.run import checkpoint
from mlxio.run.config import to_dict
from mlxio.weights import llm

# model "tiny:llama" / "tiny:qwen2" (+ "-q4": 4-bit base): a tiny random model (smoke tests)
TINY_PREFIX = "tiny:"


def load_model(cfg) -> llm.Policy:
    """The policy (base model + tokenizer), dequantised when asked, with fresh LoRA adapters."""
    if cfg.model and cfg.model.startswith(TINY_PREFIX):
        kind = cfg.model[len(TINY_PREFIX):]
        quantize = kind.endswith("-q4")
        policy = llm.tiny_policy(kind.removesuffix("-q4"), seed=cfg.seed, quantize=quantize)
    else:
        policy = llm.load_policy(cfg.model)
    if cfg.dequantize and policy.quantized:
        from mlx_lm.utils import dequantize_model

        config = {k: v for k, v in policy.config.items()
                  if k not in ("quantization", "quantization_config")}
        model = dequantize_model(policy.model)
        model.set_dtype(mx.float32)
        config["torch_dtype"] = "float32"
        policy = attrs.evolve(policy, model=model, config=config, quantized=False)
    llm.apply_lora(policy.model, cfg.lora, cfg.lora_layers, mx.random.key(cfg.seed))
    return policy


def run_identity(cfg, policy: llm.Policy) -> dict:
    """What a checkpoint must match to be resumed (`checkpoint.load_latest(expect=...)`): the
    config's hash without the fields that do not change the training (output dir, logging)
    and the base model. The recipe and the worker share it, so either resumes the other's."""
    return {"config_hash": checkpoint.config_hash(
        {**to_dict(cfg), "out": None, "log_every": None, "report_to": None}),
            "base_model": str(policy.source)}


def step_seed(seed: int, step: int) -> int:
    """Sampling seed of a step (independent of how many steps ran in this process)."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{step}".encode()).digest()[:4], "big")


def sequence_logprobs(model, params, tokens: mx.array) -> mx.array:
    """log p(tokens[:, t] | tokens[:, :t]) under `params`: tokens [B, T] -> [B, T - 1].

    The model is an mlx-lm nn.Module; `update` points it at `params` (inside a compiled step
    these are the traced inputs), so the function is pure in (params, tokens).
    """
    model.update(params)
    return pg.token_logprobs(model(tokens[:, :-1]), tokens[:, 1:])


def make_loss(model, cfg):
    """loss_fn(params, micro_batch, key) -> (loss, metrics) for mlxcore.step.

    micro_batch: tokens [M, T], mask [M, T-1] (completion targets of valid completions),
    advantages [M], old_logp / ref_logp [M, T-1].
    """
    def loss_fn(params, mb, key):
        logp = sequence_logprobs(model, params, mb["tokens"])
        return pg.policy_loss(logp, mb["old_logp"], mb["ref_logp"], mb["advantages"],
                              mb["mask"], cfg.beta, cfg.clip_eps)
    return loss_fn


def frozen_logprobs(model, params, tokens: mx.array, micro: int) -> mx.array:
    """`sequence_logprobs` without gradient, `micro` rows at a time: [N, T] -> [N, T - 1]."""
    parts = []
    for start in range(0, tokens.shape[0], micro):
        part = sequence_logprobs(model, params, tokens[start: start + micro])
        mx.eval(part)
        parts.append(part)
    return mx.concatenate(parts)


def build_batch(model, params, packed: dict, adv: np.ndarray, valid: np.ndarray,
                cfg, ref_logp: mx.array | None = None, old_logp: mx.array | None = None) -> dict:
    """Arrays for the step, leaves [accumulation, N / accumulation, ...].

    ref_logp / old_logp [N, T - 1]: given by the caller (e.g. an external trainer), else
    computed here: the LoRA-off reference when `cfg.beta` > 0, the current policy when
    `cfg.clip_eps` is set (zeros when unused).
    """
    n = len(adv)
    if n % cfg.accumulation:
        raise ConfigError(f"accumulation={cfg.accumulation} must divide the {n} completions "
                          "per step (prompts_per_step * group_size)")
    micro = n // cfg.accumulation
    tokens = mx.array(packed["tokens"])
    mask = mx.array(packed["completion_mask"][:, 1:] * valid[:, None].astype(np.float32))
    zeros = mx.zeros(mask.shape, mx.float32)
    if ref_logp is None:
        ref_logp = (frozen_logprobs(model, pg.reference_params(params), tokens, micro)
                    if cfg.beta else zeros)
    if old_logp is None:
        old_logp = (frozen_logprobs(model, params, tokens, micro)
                    if cfg.clip_eps is not None else zeros)
    batch = {"tokens": tokens, "mask": mask, "advantages": mx.array(adv), "old_logp": old_logp,
             "ref_logp": ref_logp}
    return {k: v.reshape(cfg.accumulation, micro, *v.shape[1:]) for k, v in batch.items()}
