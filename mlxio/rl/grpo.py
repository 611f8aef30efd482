"""The RLAIF policy update's building blocks, shared by the recipe (`recipes.rlaif_qwen`) and the
worker (`mlxio.rl.worker`): the policy with fresh LoRA, the loss handed to mlxcore.step, frozen
(no-gradient) log-probabilities and the step's batch. `cfg` is the recipe's Config
(`recipes.rlaif_config`); only its fields are read.
"""

from __future__ import annotations

import attrs
import mlx.core as mx
import numpy as np

from mlxcore import packing
from mlxcore import policy as pg
from mlxcore.digest import hashed_int
from mlxcore.logprobs import gathered_logprobs
from mlxcore.precision import COMPUTE_DTYPES
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
    # the frozen base only: LoRA (added next) stays float32; a config without a memory section
    # (the verdict judge's) keeps the base as loaded
    compute_dtype = getattr(getattr(cfg, "memory", None), "compute_dtype", "auto")
    if compute_dtype != "auto":
        policy.model.set_dtype(COMPUTE_DTYPES[compute_dtype])
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


def make_loss(model, cfg, world: distributed.World = distributed.SINGLE):
    """loss_fn(lora, micro_batch, key) -> (loss, metrics) for mlxcore.step: the policy loss as a
    pure function of the LoRA tree (`mlxcore.policy.policy_loss_fn` over the model's hidden
    states and frozen LM head: log-probs at the batch's positions, no [rows, T, vocab] logits).
    On several ranks (`world`) the entropy target and clip fraction read every rank's
    micro-batch (`distributed.rank_mean`); wrap it in `distributed.data_parallel_loss`."""
    return pg.policy_loss_fn(llm_lora.hidden_states(model, cfg.memory.gradient_checkpointing, cfg.memory.recompute),
                             llm_lora.lm_head(model), cfg.beta, cfg.clip_eps, cfg.grpo, cfg.memory.logprob_chunk,
                             distributed.rank_mean(world))


def frozen_logprobs(model, lora_params, tokens: mx.array, mask: np.ndarray, positions: np.ndarray,
                    chunk: int) -> mx.array:
    """Log-probs under `lora_params` without gradient, one micro-batch at a time: tokens [N, T],
    mask [N, T - 1], positions [N / micro, P] (`packing.target_positions(mask)`) -> [N, T - 1]
    float32, 0 where mask is 0 (`mlxcore.logprobs.gathered_logprobs`). The model reads whole
    rows, as the loss's does (`mlxcore.policy.policy_loss_fn`), so both compute the same states."""
    hidden, head = llm_lora.hidden_states(model), llm_lora.lm_head(model)
    micro = tokens.shape[0] // positions.shape[0]
    parts = []
    for b in range(positions.shape[0]):
        ids, rows = tokens[b * micro:(b + 1) * micro], slice(b * micro, (b + 1) * micro)
        part, _ = gathered_logprobs(head, hidden(lora_params, ids)[:, :-1], ids[:, 1:], mx.array(mask[rows]),
                                    mx.array(positions[b]), chunk=chunk, differentiable=False)
        mx.eval(part)
        parts.append(part)
    return mx.concatenate(parts)


def update_rows(total: np.ndarray, missing: np.ndarray, prompt_ids: np.ndarray, finished: np.ndarray,
                grpo: pg.GrpoConfig, world: distributed.World) -> tuple[np.ndarray, dict]:
    """Which of this rank's n completions enter the update ([n] bool), and step-wide counts
    for the log. Out: those without a reward; with `grpo.skip_equal_groups` every member of a
    group whose rewards are all equal (advantage 0 for all: no signal; DAPO's dynamic sampling
    without the resampling); with `grpo.mask_truncated` those that hit max_new_tokens
    unfinished. Groups are judged over every rank's completions (`shared_advantages`' gather)."""
    every = [distributed.gather_np(a, world) for a in (total, missing, prompt_ids, finished)]
    rewards, absent, ids, done = every[0], every[1].astype(bool), every[2], every[3].astype(bool)
    keep = ~absent
    equal = np.asarray(pg.equal_reward_rows(
        mx.array(np.where(keep, rewards, 0.0).astype(np.float32)),
        mx.array(np.where(keep, ids, ids.max() + 1 + np.arange(len(ids))))))  # absent: own group
    groups = [g for g in np.unique(ids) if keep[ids == g].any()]
    stats = {"equal_reward_groups": int(sum(equal[(ids == g) & keep].all() for g in groups)),
             "truncated": int((~done).sum())}
    if grpo.skip_equal_groups:
        keep &= ~equal
    if grpo.mask_truncated:
        keep &= done
    stats["rows_in_update"] = int(keep.sum())
    n = len(total)
    return keep[world.rank * n:(world.rank + 1) * n], stats


def build_batch(model, params, packed: dict, adv: np.ndarray, valid: np.ndarray,
                cfg, ref_logp: mx.array | None = None, old_logp: mx.array | None = None,
                drop_empty: bool = False, world: distributed.World = distributed.SINGLE) -> dict | None:
    """Arrays for the step, leaves [k, N / accum, ...] (k = accum, or fewer with `drop_empty`).

    valid [N]: rows that enter the loss (`update_rows`). ref_logp / old_logp [N, T - 1]: given
    by the caller (e.g. an external trainer), else computed here at the scored positions: the
    LoRA-off reference when `cfg.beta` > 0, the current policy when `cfg.clip_eps` is set
    (zeros when unused). drop_empty (one process only: every rank must run the same number of
    micro-batches): rows with nothing to score go last and micro-batches of them alone are not
    run; None when no row is left (no update this step). Leaves: tokens, mask, weights
    (`mlxcore.policy.loss_weights` over the whole step: on several ranks (`world`, each with
    its share of the step's completions) over every rank's rows, from their gathered token
    counts), positions [k, P]
    (`packing.target_positions`), advantages, old_logp, ref_logp.
    """
    n = len(adv)
    if n % cfg.train.accum:
        raise ConfigError(f"train.accum={cfg.train.accum} must divide the {n} completions "
                          "per step (prompts_per_step * group_size)")
    if drop_empty and world.size > 1:
        raise ValueError("drop_empty: one process only (every rank must run the same micro-batches)")
    micro = n // cfg.train.accum
    mask = packed["completion_mask"][:, 1:] * np.asarray(valid)[:, None].astype(np.float32)
    arrays = {"tokens": np.asarray(packed["tokens"]), "mask": mask, "advantages": np.asarray(adv, np.float32)}
    given = {k: v for k, v in (("ref_logp", ref_logp), ("old_logp", old_logp)) if v is not None}
    k = cfg.train.accum
    if drop_empty:
        order = np.argsort(mask.sum(axis=1) == 0, kind="stable")  # rows with scored tokens first
        arrays = {name: a[order] for name, a in arrays.items()}
        given = {name: a[mx.array(order)] for name, a in given.items()}
        k = -(-int((mask.sum(axis=1) > 0).sum()) // micro)
        if k == 0:
            return None
    lengths = distributed.gather_np(arrays["mask"].sum(axis=1, dtype=np.float32)[None], world)  # [ranks, n]
    weights = np.array(pg.loss_weights(mx.array(arrays["mask"]), cfg.grpo.loss_type, micro, cfg.max_new_tokens,
                                       mx.array(lengths)))
    if cfg.grpo.loss_type != "bnpo":  # their normalisers span the step: rescale to the k run
        weights *= k / cfg.train.accum
    arrays = {name: a[:k * micro] for name, a in {**arrays, "weights": weights}.items()}
    given = {name: a[:k * micro] for name, a in given.items()}
    positions = packing.target_positions(arrays["mask"], micro, cfg.memory.logprob_chunk)
    tokens = mx.array(arrays["tokens"])
    zeros = mx.zeros(arrays["mask"].shape, mx.float32)
    chunk = cfg.memory.logprob_chunk
    if "ref_logp" not in given:
        given["ref_logp"] = (frozen_logprobs(model, pg.reference_params(params), tokens, arrays["mask"], positions, chunk)
                             if cfg.beta else zeros)
    if "old_logp" not in given:
        given["old_logp"] = (frozen_logprobs(model, params, tokens, arrays["mask"], positions, chunk)
                             if cfg.clip_eps is not None else zeros)
    batch = {**{name: mx.array(a) for name, a in arrays.items()}, "tokens": tokens, **given}
    batch = {name: v.reshape(k, micro, *v.shape[1:]) for name, v in batch.items()}
    batch["positions"] = mx.array(positions)
    return batch


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
