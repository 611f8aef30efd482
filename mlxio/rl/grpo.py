"""The RLAIF policy update's building blocks, shared by the recipe (`recipes.rlaif_qwen`) and its
worker (`recipes.rlaif_worker`): the policy with fresh LoRA, the loss handed to mlxcore.train.step,
frozen (no-gradient) log-probabilities and the step's batch, and the update's memory options
(`MemoryConfig`, the recipe's `memory.*`). Each function takes the settings it reads.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs
import mlx.core as mx
import numpy as np

from mlxcore.digest import hashed_int
from mlxcore.fields import bounded
from mlxcore.rl import packing
from mlxcore.rl import policy as pg
from mlxcore.rl.logprobs import gathered_logprobs
from mlxcore.train.lora import LoraConfig
from mlxcore.train.precision import COMPUTE_DTYPES
from mlxio.errors import ConfigError
from mlxio.run import checkpoint, checks, distributed
from mlxio.weights import llm, llm_lora

# model "tiny:llama" / "tiny:qwen2" (+ "-q4": 4-bit base): a tiny random model (smoke tests)
TINY_PREFIX = "tiny:"


@attrs.frozen(kw_only=True)
class MemoryConfig:
    """The update's memory options (the RLAIF recipe's `memory.*`)."""

    # one compiled graph per micro-batch, evaluated in turn: peak memory of one micro-batch's
    # activations instead of `accum` of them (see mlxcore.train.step; measured: dev/LOG.md)
    eval_micro_batches: bool = True
    # log-probs are scored this many completion tokens at a time from the last hidden states
    # (mlxcore.rl.logprobs): [chunk, vocab] logits at once, never [rows, T, vocab]
    logprob_chunk: int = bounded(512, ge=1, le=1 << 20)
    # mx.checkpoint per transformer block: its activations are recomputed in the backward pass
    # (peak memory of one block's instead of all blocks', about a third more compute)
    gradient_checkpointing: bool = False
    # parts of every block recomputed in the backward pass instead of kept (same values and
    # gradients; mlxio.weights.llm_lora.recomputing): "mlp" the SwiGLU product (2 of its 4
    # [rows, T, ffn] arrays), "lora" the adapters' float32 copies of a bf16 base's activations;
    # () keeps everything (what each saves: dev/results/cpu/rlaif_step_memory.json)
    recompute: tuple[str, ...] = llm_lora.RECOMPUTABLE
    # the frozen base's dtype: "auto" keeps it as loaded (float32 once dequantised: the CPU's
    # fast path), "bfloat16" halves its memory and bandwidth (LoRA and optimizer stay float32)
    compute_dtype: str = bounded("auto", choices=("auto",) + tuple(COMPUTE_DTYPES),
                                 validator=attrs.validators.in_(("auto",) + tuple(COMPUTE_DTYPES)))
    # memory-driven train.accum: short probe steps in child processes at full-length batches
    # (prompt + max_new_tokens) measure peak memory, and the largest micro-batch that fits
    # budget_mb (0: budget_fraction of the device's memory) is used (mlxio.run.batch_sizer)
    auto_batch: bool = False
    budget_mb: float = bounded(0.0, ge=0, le=1e8)  # auto_batch's memory budget in MB; 0: budget_fraction of the device's
    budget_fraction: float = bounded(0.7, gt=0, le=1)  # auto_batch's share of device memory (RAM on a CPU)
    max_micro_batch: int = bounded(64, ge=1, le=65536)  # auto_batch's largest micro-batch (completions)


def load_model(model: str | None, lora: LoraConfig, lora_layers: int | None, seed: int, *,
               dequantize: bool = True, compute_dtype: str = "auto",
               lengths: Mapping[str, int] | None = None) -> llm.Policy:
    """The policy (base model + tokenizer; `model`: None for the embedded GGUF, a folder, GGUF
    or hub id, or TINY_PREFIX + a tiny kind), dequantised when asked, its frozen base in
    `compute_dtype` ("auto": as loaded), checked (`check_policy`; `lengths`: generation lengths
    by option name), with fresh LoRA adapters from `seed` (the model's own LoRA leaves:
    `llm_lora.lora_tree(policy.model)` is the initial tree)."""
    if model and model.startswith(TINY_PREFIX):
        kind = model[len(TINY_PREFIX):]
        quantize = kind.endswith("-q4")
        policy = llm.tiny_policy(kind.removesuffix("-q4"), seed=seed, quantize=quantize)
    else:
        policy = llm.load_policy(model)
    if dequantize and policy.quantized:
        from mlx_lm.utils import dequantize_model

        config = {k: v for k, v in policy.config.items()
                  if k not in ("quantization", "quantization_config")}
        dequantized = dequantize_model(policy.model)
        dequantized.set_dtype(mx.float32)
        config["torch_dtype"] = "float32"
        policy = attrs.evolve(policy, model=dequantized, config=config, quantized=False)
    # the frozen base only: LoRA (added next) stays float32
    if compute_dtype != "auto":
        policy.model.set_dtype(COMPUTE_DTYPES[compute_dtype])
    check_policy(policy, str(policy.source or model), lora, lora_layers, lengths or {})
    llm_lora.apply_lora(policy.model, lora, lora_layers, mx.random.key(seed))
    return policy


def config_hash(config: dict) -> str:
    """The hash of a config (as a dict: `to_dict(cfg)`) over the fields that change the
    training: not the output dir, the logging, the array shapes (`shapes`: padding, float
    rounding apart, changes no number; runs from before the section resume) nor whether rewards
    overlap the rollout (`sandbox.overlap`: the same rewards)."""
    rest = {k: v for k, v in config.items() if k != "shapes"}
    sandbox = {k: v for k, v in config.get("sandbox", {}).items() if k != "overlap"}
    return checkpoint.config_hash({**rest, "out_dir": None, "report_to": None, **({"sandbox": sandbox} if sandbox else {}),
                                   "train": {**config["train"], "log_every": None}})


def run_identity(config: dict, policy: llm.Policy) -> dict:
    """What a checkpoint must match to be resumed (`checkpoint.load_latest(expect=...)`): the
    hash of the run's config (`config`: the recipe's `to_dict(cfg)`; `config_hash`) and the base
    model. The recipe and the worker share it, so either resumes the other's."""
    return {"config_hash": config_hash(config), "base_model": str(policy.source)}


def check_policy(policy: llm.Policy, where: str, lora: LoraConfig, lora_layers: int | None,
                 lengths: Mapping[str, int]) -> None:
    """Settings that depend on the model (ConfigError naming the field, at `where`): every LoRA
    target matches a linear layer of a block, lora_layers within the block count, each
    generation length of `lengths` ({option name: tokens}) within the model's
    max_position_embeddings."""

    blocks = policy.model.layers
    if lora.dropout:
        raise ConfigError(f"lora.dropout: {lora.dropout} is not supported on causal-LM policies", where=where,
                          fix="set --lora.dropout 0")
    checks.check_targets(lora.targets, llm_lora.linear_paths(blocks[0]), where=where)
    if lora_layers is not None:
        checks.check_at_most("lora_layers", lora_layers, len(blocks), "the model's number of blocks", where)
    limit = policy.config.get("max_position_embeddings")
    if isinstance(limit, int) and limit > 0:
        for name, value in lengths.items():
            checks.check_at_most(name, value, limit, "the model's max_position_embeddings", where)


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


def rank_share(prompts_per_step: int, group_size: int, accum: int, world: distributed.World) -> tuple[slice, int]:
    """This rank's share of a step's P x G completions: (slice of the step's prompts, samples
    per prompt). Whole prompts when the ranks divide P, else every prompt with G / ranks
    samples (a group then spans ranks; its statistics are computed over all of them); `accum`
    micro-batches must divide each rank's share."""
    p, g, n = prompts_per_step, group_size, world.size
    if p % n == 0:
        share = slice(world.rank * p // n, (world.rank + 1) * p // n), g
    elif g % n == 0:
        share = slice(0, p), g // n
    else:
        raise ConfigError(f"{n} ranks must divide prompts_per_step={p} or group_size={g}")
    local = (share[0].stop - share[0].start) * share[1]
    if local % accum:
        raise ConfigError(f"train.accum={accum} must divide each rank's {local} "
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


def make_loss(model, beta: float, clip_eps: float | None, grpo: pg.GrpoConfig, memory: MemoryConfig,
              world: distributed.World = distributed.SINGLE):
    """loss_fn(lora, micro_batch, key) -> (loss, metrics) for mlxcore.train.step: the policy loss as a
    pure function of the LoRA tree (`mlxcore.rl.policy.policy_loss_fn` over the model's hidden
    states and frozen LM head: log-probs at the batch's positions, no [rows, T, vocab] logits;
    `memory`: its gradient checkpointing, recomputed parts and log-prob chunk).
    On several ranks (`world`) the entropy target and clip fraction read every rank's
    micro-batch (`distributed.rank_mean`); wrap it in `distributed.data_parallel_loss`."""
    return pg.policy_loss_fn(llm_lora.hidden_states(model, memory.gradient_checkpointing, memory.recompute),
                             llm_lora.lm_head(model), beta, clip_eps, grpo, memory.logprob_chunk,
                             distributed.rank_mean(world))


def frozen_logprobs(model, lora_params, tokens: mx.array, mask: np.ndarray, positions: np.ndarray,
                    chunk: int) -> mx.array:
    """Log-probs under `lora_params` without gradient, one micro-batch at a time: tokens [N, T],
    mask [N, T - 1], positions [N / micro, P] (`packing.target_positions(mask)`) -> [N, T - 1]
    float32, 0 where mask is 0 (`mlxcore.rl.logprobs.gathered_logprobs`). The model reads whole
    rows, as the loss's does (`mlxcore.rl.policy.policy_loss_fn`), so both compute the same states."""
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


def build_batch(model, params, packed: dict, adv: np.ndarray, valid: np.ndarray, *, accum: int,
                max_new_tokens: int, beta: float, clip_eps: float | None, grpo: pg.GrpoConfig,
                logprob_chunk: int, ref_logp: mx.array | None = None, old_logp: mx.array | None = None,
                drop_empty: bool = False, world: distributed.World = distributed.SINGLE,
                positions_width: int | None = None) -> dict | None:
    """Arrays for the step, leaves [k, N / accum, ...] (k = accum, or fewer with `drop_empty`).

    valid [N]: rows that enter the loss (`update_rows`). ref_logp / old_logp [N, T - 1]: given
    by the caller (e.g. an external trainer), else computed here at the scored positions
    (`logprob_chunk` tokens at a time): the LoRA-off reference when `beta` > 0, the current
    policy when `clip_eps` is set (zeros when unused). `grpo.loss_type` and `max_new_tokens`
    set the loss weights. drop_empty (one process only: every rank must run the same number of
    micro-batches): rows with nothing to score go last and micro-batches of them alone are not
    run; None when no row is left (no update this step). Leaves: tokens, mask, weights
    (`mlxcore.rl.policy.loss_weights` over the whole step: on several ranks (`world`, each with
    its share of the step's completions) over every rank's rows, from their gathered token
    counts), positions [k, P] (`packing.target_positions`; P = `positions_width` where the
    scored tokens fit it: fixed beforehand, `mlxio.rl.shapes`), advantages, old_logp, ref_logp.
    """
    n = len(adv)
    if n % accum:
        raise ConfigError(f"train.accum={accum} must divide the {n} completions "
                          "per step (prompts_per_step * group_size)")
    if drop_empty and world.size > 1:
        raise ValueError("drop_empty: one process only (every rank must run the same micro-batches)")
    micro = n // accum
    mask = packed["completion_mask"][:, 1:] * np.asarray(valid)[:, None].astype(np.float32)
    arrays = {"tokens": np.asarray(packed["tokens"]), "mask": mask, "advantages": np.asarray(adv, np.float32)}
    given = {k: v for k, v in (("ref_logp", ref_logp), ("old_logp", old_logp)) if v is not None}
    k = accum
    if drop_empty:
        order = np.argsort(mask.sum(axis=1) == 0, kind="stable")  # rows with scored tokens first
        arrays = {name: a[order] for name, a in arrays.items()}
        given = {name: a[mx.array(order)] for name, a in given.items()}
        k = -(-int((mask.sum(axis=1) > 0).sum()) // micro)
        if k == 0:
            return None
    lengths = distributed.gather_np(arrays["mask"].sum(axis=1, dtype=np.float32)[None], world)  # [ranks, n]
    weights = np.array(pg.loss_weights(mx.array(arrays["mask"]), grpo.loss_type, micro, max_new_tokens,
                                       mx.array(lengths)))
    if grpo.loss_type != "bnpo":  # their normalisers span the step: rescale to the k run
        weights *= k / accum
    arrays = {name: a[:k * micro] for name, a in {**arrays, "weights": weights}.items()}
    given = {name: a[:k * micro] for name, a in given.items()}
    positions = packing.target_positions(arrays["mask"], micro, logprob_chunk, positions_width)
    tokens = mx.array(arrays["tokens"])
    zeros = mx.zeros(arrays["mask"].shape, mx.float32)
    chunk = logprob_chunk
    if "ref_logp" not in given:
        given["ref_logp"] = (frozen_logprobs(model, pg.reference_params(params), tokens, arrays["mask"], positions, chunk)
                             if beta else zeros)
    if "old_logp" not in given:
        given["old_logp"] = (frozen_logprobs(model, params, tokens, arrays["mask"], positions, chunk)
                             if clip_eps is not None else zeros)
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
