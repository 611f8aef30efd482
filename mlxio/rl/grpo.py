"""The RLAIF policy update's building blocks, shared by the recipe (`recipes.rlaif_qwen`) and the
worker (`mlxio.rl.worker`): the policy with fresh LoRA, the loss handed to mlxcore.step, frozen
(no-gradient) log-probabilities and the step's batch. `cfg` is the recipe's Config
(`recipes.rlaif_config`); only its fields are read.
"""

from __future__ import annotations

import attrs
import mlx.core as mx
import numpy as np

from mlxcore import policy as pg
from mlxio.digest import hashed_int
from mlxio.errors import ConfigError
from mlxio.run import checkpoint, distributed
from mlxio.run.config import to_dict
from mlxio.weights import llm, llm_lora

# model "tiny:llama" / "tiny:qwen2" (+ "-q4": 4-bit base): a tiny random model (smoke tests)
TINY_PREFIX = "tiny:"


def load_model(cfg) -> llm.Policy:
    """The policy (base model + tokenizer), dequantised when asked, with fresh LoRA adapters
    (the model's own LoRA leaves: `llm_lora.lora_tree(policy.model)` is the initial tree)."""
    if cfg.model and cfg.model.startswith(TINY_PREFIX):
        kind = cfg.model[len(TINY_PREFIX):]
        quantize = kind.endswith("-q4")
        policy = llm.tiny_policy(kind.removesuffix("-q4"), seed=cfg.train.seed, quantize=quantize)
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
    check_policy(cfg, policy)
    llm_lora.apply_lora(policy.model, cfg.lora, cfg.lora_layers, mx.random.key(cfg.train.seed))
    return policy


def use_compile(cfg) -> bool:
    """Whether the update step and the rollout's decode step are `mx.compile`d: `cfg.compile`,
    None (auto) everywhere but on a CUDA device (`mlxio.kernel_cache.use_compile`: there a fresh
    machine's NVRTC compilation of the fused kernels took minutes). Long runs, where the fused
    decode step pays back its compilation, set it true (the gpu and full presets)."""
    from mlxio import kernel_cache

    return kernel_cache.use_compile(cfg.compile)


def config_hash(config: dict) -> str:
    """The hash of a config (as a dict: `to_dict(cfg)`) over the fields that change the
    training: not the output dir nor the logging."""
    return checkpoint.config_hash({**config, "out_dir": None, "report_to": None,
                                   "train": {**config["train"], "log_every": None}})


def run_identity(cfg, policy: llm.Policy) -> dict:
    """What a checkpoint must match to be resumed (`checkpoint.load_latest(expect=...)`): the
    config's hash (`config_hash`) and the base model. The recipe and the worker share it, so
    either resumes the other's."""
    return {"config_hash": config_hash(to_dict(cfg)), "base_model": str(policy.source)}


def training_note(cfg) -> str:
    """What the model cards say the run trained on."""
    return (f"{cfg.train.steps} steps x {cfg.prompts_per_step} prompts x {cfg.group_size} completions from "
            f"{cfg.data.problems or getattr(cfg.data, 'source', 'humaneval')} (training split)")


def check_policy(cfg, policy: llm.Policy) -> None:
    """Settings that depend on the model (ConfigError naming the field): every LoRA target
    matches a linear layer of a block, lora_layers within the block count, generation lengths
    within the model's max_position_embeddings."""
    from mlxio.run import config

    blocks = policy.model.layers
    where = str(policy.source or cfg.model)
    if cfg.lora.dropout:
        raise ConfigError(f"lora.dropout: {cfg.lora.dropout} is not supported on causal-LM policies", where=where,
                          fix="set --lora.dropout 0")
    config.check_targets(cfg.lora.targets, llm_lora.linear_paths(blocks[0]), where=where)
    if cfg.lora_layers is not None:
        config.check_at_most("lora_layers", cfg.lora_layers, len(blocks), "the model's number of blocks", where)
    limit = policy.config.get("max_position_embeddings")
    if isinstance(limit, int) and limit > 0:
        for name, value in (("max_new_tokens", getattr(cfg, "max_new_tokens", None)),
                            ("eval.max_new_tokens", getattr(getattr(cfg, "eval", None), "max_new_tokens", None))):
            if isinstance(value, int):
                config.check_at_most(name, value, limit, "the model's max_position_embeddings", where)


def step_seed(seed: int, step: int) -> int:
    """Sampling seed of a step (independent of how many steps ran in this process)."""
    return hashed_int(f"{seed}:{step}", 4)


def prompt_indices(step: int, per_step: int, n: int, seed: int) -> list[int]:
    """Training problems for `step`: consecutive slices of a per-epoch seeded permutation,
    so the data position is a pure function of the step (nothing else to checkpoint)."""
    out = []
    for pos in range(step * per_step, (step + 1) * per_step):
        epoch, i = divmod(pos, n)
        out.append(int(np.random.default_rng([seed, epoch]).permutation(n)[i]))
    return out


def advantages_of(total: np.ndarray, missing: np.ndarray, prompt_index: np.ndarray,
                  kind: str) -> np.ndarray:
    """[N] advantages per prompt group; a completion with no reward is its own group (0)."""
    ids = np.where(missing, prompt_index.max() + 1 + np.arange(len(total)), prompt_index)
    rewards = mx.array(np.where(missing, 0.0, total).astype(np.float32))
    fn = pg.group_advantages if kind == "grpo" else pg.baseline_advantages
    return np.array(fn(rewards, group_ids=mx.array(ids)))


def rank_share(cfg, world: distributed.World) -> tuple[slice, int]:
    """This rank's share of a step's P x G completions: (slice of the step's prompts, samples
    per prompt). Whole prompts when the ranks divide P, else every prompt with G / ranks
    samples (a group then spans ranks; its statistics are computed over all of them)."""
    p, g, n = cfg.prompts_per_step, cfg.group_size, world.size
    if p % n == 0:
        share = slice(world.rank * p // n, (world.rank + 1) * p // n), g
    elif g % n == 0:
        share = slice(0, p), g // n
    else:
        raise ConfigError(f"{n} ranks must divide prompts_per_step={p} or group_size={g}")
    local = (share[0].stop - share[0].start) * share[1]
    if local % cfg.train.accum:
        raise ConfigError(f"train.accum={cfg.train.accum} must divide each rank's {local} "
                          f"completions (prompts_per_step * group_size / {n} ranks)")
    return share


def shared_advantages(total: np.ndarray, missing: np.ndarray, prompt_ids: np.ndarray,
                      kind: str, world: distributed.World) -> np.ndarray:
    """This rank's [n] advantages, with group statistics over every rank's completions:
    rewards [n], missing [n] and step-wide prompt ids [n] are gathered (rank order), the
    advantages computed as on one process, and this rank's slice returned."""
    every = [distributed.gather_np(a, world) for a in (total, missing, prompt_ids)]
    n = len(total)
    return advantages_of(*every, kind)[world.rank * n:(world.rank + 1) * n]


def make_loss(model, cfg):
    """loss_fn(lora, micro_batch, key) -> (loss, metrics) for mlxcore.step: the policy loss as a
    pure function of the LoRA tree (`mlxcore.policy.policy_loss_fn` over `llm_lora.forward`)."""
    return pg.policy_loss_fn(llm_lora.forward(model), cfg.beta, cfg.clip_eps)


def frozen_logprobs(model, lora_params, tokens: mx.array, micro: int) -> mx.array:
    """Log-probs under `lora_params` without gradient, `micro` rows at a time: tokens [N, T] ->
    [N, T - 1] (`mlxcore.policy.sequence_logprobs`)."""
    logits = llm_lora.forward(model)
    parts = []
    for start in range(0, tokens.shape[0], micro):
        part = pg.sequence_logprobs(lambda ids: logits(lora_params, ids), tokens[start: start + micro])
        mx.eval(part)
        parts.append(part)
    return mx.concatenate(parts)


def build_batch(model, params, packed: dict, adv: np.ndarray, valid: np.ndarray,
                cfg, ref_logp: mx.array | None = None, old_logp: mx.array | None = None) -> dict:
    """Arrays for the step, leaves [accum, N / accum, ...].

    ref_logp / old_logp [N, T - 1]: given by the caller (e.g. an external trainer), else
    computed here: the LoRA-off reference when `cfg.beta` > 0, the current policy when
    `cfg.clip_eps` is set (zeros when unused).
    """
    n = len(adv)
    if n % cfg.train.accum:
        raise ConfigError(f"train.accum={cfg.train.accum} must divide the {n} completions "
                          "per step (prompts_per_step * group_size)")
    micro = n // cfg.train.accum
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
    return {k: v.reshape(cfg.train.accum, micro, *v.shape[1:]) for k, v in batch.items()}


def step_record(rew, ro, packed: dict, metrics: dict, state: dict, inner_epochs: int, update_s: float,
                world: distributed.World) -> dict:
    """A step's step-wide figures for metrics.jsonl: rewards gathered from every rank (mean, std,
    per component, execution pass rate), counts and throughputs summed over ranks, the update's
    metrics. rew: `rewards.combine_rewards`'s result; ro: the rollouts; packed: `packing.pack`."""
    ntok = int(packed["lengths"].sum()) * inner_epochs  # real (unpadded) tokens trained
    total = distributed.gather_np(rew.total, world)
    exec_scores = rew.per_reward.get("execution")
    exec_scores = None if exec_scores is None else distributed.gather_np(exec_scores, world)
    tokens, hits, misses, gen_tps, train_tps, missing = distributed.gather_np(np.array([[
        sum(map(len, ro.completion_tokens)), rew.cache_hits, rew.cache_misses,
        ro.gen_tokens_per_s, ntok / update_s, rew.missing.sum()]], np.float64), world).sum(0)
    components = {f"reward/{name}": float(np.nanmean(distributed.gather_np(v, world)))
                  for name, v in rew.per_reward.items() if not np.isnan(v).all()}
    return {
        "reward_mean": float(np.nanmean(total)), **components,
        "reward_std": float(np.nanstd(total)),
        "pass_rate": float(np.nanmean(exec_scores)) if exec_scores is not None else None,
        "missing_rewards": int(missing),
        **{k: float(v) for k, v in metrics.items()},
        "completion_tokens": int(tokens), "completion_len_mean": float(tokens / max(len(total), 1)),
        "gen_tokens_per_s": float(gen_tps), "train_tokens_per_s": float(train_tps),
        "cache_hit_rate": float(hits / (hits + misses)) if hits + misses else None,
        "consecutive_skips": int(state["consecutive_skips"]),
    }
