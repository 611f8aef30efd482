"""Policy-gradient pieces for RLAIF (GRPO style), as pure functions over arrays.

Shapes: N completions (G per prompt, so N = prompts * G), T token positions, V vocabulary.
The training loss scores a completion's tokens from the policy's hidden states with
`mlxcore.rl.logprobs` (only where `mask` is 1: the completion's own tokens, never the prompt or
padding; no [N, T, V] logits); `token_logprobs` is the plain computation from logits, the
reference it is tested against. How token terms are averaged is `GrpoConfig.loss_type`
(`loss_weights`); the default, "grpo", averages each sequence's token terms and then the
sequences (DeepSeekMath). Every normaliser is taken over the whole step (on every rank of a
data-parallel run), so gradient accumulation over micro-batches (and ranks) equals one big batch.

The KL reference is the policy's own base model with LoRA switched off: `reference_params`
zeroes every `lora_b`, which makes each adapter's contribution `x @ A @ 0` exactly zero, so the
same weights in memory give the reference log-probabilities (no second model copy that could
drift).
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import mlx.core as mx

from mlxcore.fields import bounded
from mlxcore.rl.logprobs import gathered_logprobs
from mlxcore.train.tree import Tree, flatten, unflatten


def _same_group(rewards: mx.array, group_ids: mx.array | None, group_size: int | None) -> mx.array:
    """[N, N] float matrix: 1 where completions i and j answer the same prompt."""
    n = rewards.shape[0]
    if group_ids is None:
        if group_size is None or group_size < 1 or n % group_size:
            raise ValueError(f"group_size {group_size} must divide the {n} rewards")
        group_ids = mx.arange(n) // group_size
    return (group_ids[:, None] == group_ids[None, :]).astype(mx.float32)


def _group_mean(rewards: mx.array, same: mx.array) -> mx.array:
    return (same @ rewards) / same.sum(axis=1)


def baseline_advantages(rewards: mx.array, group_size: int | None = None, *,
                        group_ids: mx.array | None = None) -> mx.array:
    """Mean-baseline advantages: r_i - mean of r over i's group.

    rewards [N]; groups are consecutive runs of `group_size`, or given by integer `group_ids`
    [N] (any labels). Returns [N] float32.
    """
    rewards = rewards.astype(mx.float32)
    same = _same_group(rewards, group_ids, group_size)
    return rewards - _group_mean(rewards, same)


def group_advantages(rewards: mx.array, group_size: int | None = None, *,
                     group_ids: mx.array | None = None, eps: float = 1e-4) -> mx.array:
    """GRPO advantages: (r_i - mean_g) / (std_g + eps) within i's group g.

    rewards [N]; groups as in `baseline_advantages`. std is the population standard deviation
    of the group (ddof=0), so a group whose completions all score the same gets advantage 0
    (it carries no signal), not a division by zero. Returns [N] float32.
    """
    rewards = rewards.astype(mx.float32)
    same = _same_group(rewards, group_ids, group_size)
    mean = _group_mean(rewards, same)
    # var_i = mean over j in g(i) of (r_j - mean_i)^2; mean_j == mean_i inside a group
    sq = (rewards[None, :] - mean[:, None]) ** 2
    std = mx.sqrt((same * sq).sum(axis=1) / same.sum(axis=1))
    return (rewards - mean) / (std + eps)


def token_logprobs(logits: mx.array, targets: mx.array) -> mx.array:
    """log softmax(logits)[target] per position: logits [N, T, V], targets [N, T] -> [N, T] float32.

    Callers shift for next-token prediction: `token_logprobs(logits[:, :-1], tokens[:, 1:])`.
    """
    logits = logits.astype(mx.float32)
    picked = mx.take_along_axis(logits, targets[..., None].astype(mx.int32), axis=-1)[..., 0]
    return picked - mx.logsumexp(logits, axis=-1)


def sequence_logprobs(logits_fn: Callable[[mx.array], mx.array], tokens: mx.array) -> mx.array:
    """log p(tokens[:, t] | tokens[:, :t]) for t = 1 .. T-1: tokens [N, T] -> [N, T - 1] float32.

    The one shift convention of the code base: column j scores token j + 1 from the prefix up to
    token j. logits_fn(ids [N, T - 1]) -> logits [N, T - 1, V] is a causal LM's forward.
    """
    return token_logprobs(logits_fn(tokens[:, :-1]), tokens[:, 1:])


def kl_k3(logp_policy: mx.array, logp_ref: mx.array) -> mx.array:
    """Per-token k3 estimator of KL(policy || ref) for tokens sampled from the policy.

    exp(ref - pol) - (ref - pol) - 1 (Schulman's k3): unbiased, and >= 0 everywhere since
    e^x >= 1 + x; exactly 0 where the two agree. [N, T] -> [N, T].
    """
    d = logp_ref - logp_policy
    return mx.exp(d) - d - 1.0


LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "bnpo")
RATIO_LEVELS = ("token", "sequence")


@attrs.frozen(kw_only=True)
class GrpoConfig:
    """The GRPO controls beside `beta` and `clip_eps` (docs/rlaif.md says when to use each;
    `loss_weights` and `policy_loss` give the formulas)."""

    # how token terms are averaged: "grpo" each sequence's mean, then over sequences; "dr_grpo"
    # sum / (sequences x max_new_tokens); "dapo" sum / the step's tokens; "bnpo" each
    # micro-batch's token mean, then their mean
    loss_type: str = bounded("grpo", choices=LOSS_TYPES, validator=attrs.validators.in_(LOSS_TYPES))
    # upper clipping bound of the ratio, 1 + clip_eps_high (DAPO's clip-higher); None: clip_eps
    clip_eps_high: float | None = bounded(None, gt=0, le=10)
    # "token" ratios (PPO) or "sequence": exp(mean log-ratio) per completion, clipped as one (GSPO)
    importance_ratio: str = bounded("token", choices=RATIO_LEVELS, validator=attrs.validators.in_(RATIO_LEVELS))
    # weight of the entropy term: a bonus -coef x H, or with entropy_target the penalty
    # coef x max(target - H, 0); H: exact mean next-token entropy at completion tokens (nats),
    # the penalty's taken per micro-batch and weighted by its share of the step
    entropy_coef: float = bounded(0.0, ge=0, le=10)
    entropy_target: float | None = bounded(None, gt=0, le=20)  # None: a plain bonus (see entropy_coef)
    # leave groups whose rewards are all equal (advantage 0 for all) out of the update (DAPO's
    # dynamic sampling without resampling); logged as equal_reward_groups / rows_in_update
    skip_equal_groups: bool = False
    mask_truncated: bool = False  # leave completions that hit max_new_tokens unfinished out of the loss


def equal_reward_rows(rewards: mx.array, group_ids: mx.array) -> mx.array:
    """[N] bool: True for each completion whose group's rewards are all equal (its GRPO
    advantage is 0: the group carries no policy-gradient signal). rewards [N], group_ids [N]."""
    same = (group_ids[:, None] == group_ids[None, :])
    r = rewards.astype(mx.float32)[None, :]
    hi = mx.where(same, r, -mx.inf).max(axis=1)
    lo = mx.where(same, r, mx.inf).min(axis=1)
    return hi == lo


def loss_weights(mask: mx.array, loss_type: str, micro: int, max_len: int,
                 step_lengths: mx.array | None = None) -> mx.array:
    """Per-token weights w [N, T] of a step's N sequences (mask [N, T], 1 on scored tokens) in
    k = N / micro micro-batches: the step's loss is the mean over micro-batches of
    sum(w * per_token) over each micro-batch (`mlxcore.train.step.accumulate`), which equals

      grpo:    1/S sum_i (1/|o_i|) sum_t m_it l_it    S: sequences with a token, |o_i| = sum_t m_it
      dr_grpo: 1/(N max_len) sum_it m_it l_it          (a constant normaliser: no length bias)
      dapo:    sum_it m_it l_it / sum_it m_it          (every token of the step counts the same)
      bnpo:    mean over micro-batches b of sum_(it in b) m l / sum_(it in b) m

    (all-zero mask: all-zero weights). Global normalisers make accumulation exact: k micro-batches
    give the same loss and gradient as one; bnpo is the exception by definition.

    Data-parallel: step_lengths [R, N] holds the scored tokens of each row of every rank (rank
    order; `mask` is this rank's N rows, each rank splitting its rows alike). The sums above
    then run over all R x N rows (S, N, the token count; bnpo's micro-batch b is every rank's
    b-th), and w carries a factor R, so the mean over ranks of the ranks' losses and gradients
    (`mlxio.run.distributed`) is the step's over all rows. None: one rank, mask.sum(1).
    """
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type {loss_type!r}: expected one of {', '.join(LOSS_TYPES)}")
    n = mask.shape[0]
    if micro < 1 or n % micro:
        raise ValueError(f"micro-batch {micro} must divide the {n} sequences")
    k = n // micro
    m = mask.astype(mx.float32)
    lengths = m.sum(axis=1, keepdims=True)
    every = lengths.T if step_lengths is None else step_lengths.astype(mx.float32)
    if every.ndim != 2 or every.shape[1] != n:
        raise ValueError(f"step_lengths {tuple(every.shape)}: expected [ranks, {n}]")
    ranks = every.shape[0]
    scale = ranks * k  # x k: the mean over micro-batches; x R: the mean over ranks
    if loss_type == "grpo":
        seqs = mx.maximum((every > 0).sum(), 1)
        return scale * m / (mx.maximum(lengths, 1.0) * seqs)
    if loss_type == "dr_grpo":
        return scale * m / (ranks * n * max_len)
    if loss_type == "dapo":
        return scale * m / mx.maximum(every.sum(), 1.0)
    per_micro = every.reshape(ranks, k, micro).sum(axis=(0, 2))  # [k]: tokens of micro-batch b on every rank
    return ranks * (m.reshape(k, micro, -1) / mx.maximum(per_micro, 1.0)[:, None, None]).reshape(m.shape)


def policy_loss(logp: mx.array, old_logp: mx.array, ref_logp: mx.array, advantages: mx.array,
                mask: mx.array, weights: mx.array, beta: float, clip_eps: float | None = None, *,
                clip_eps_high: float | None = None, importance_ratio: str = "token",
                entropy: mx.array | None = None, entropy_coef: float = 0.0, entropy_target: float | None = None,
                across_ranks: Callable[[mx.array], mx.array] | None = None) -> tuple[mx.array, dict[str, mx.array]]:
    """Clipped policy-gradient loss with a k3 KL penalty and an entropy term; (loss, metrics).

    logp [N, T]: log-probs of the sampled tokens under the policy being trained (carries the
    gradient); old_logp [N, T]: under the policy that sampled them (used only with clipping);
    ref_logp [N, T]: under the reference (LoRA off); advantages [N]; mask [N, T] (1 on scored
    completion tokens); weights [N, T]: `loss_weights` (how token terms are averaged). Per
    token, with e_lo = clip_eps and e_hi = clip_eps_high (None: e_lo):
      clip_eps None: -(logp * A)                                       (REINFORCE with baseline)
      else:          -min(rho A, clip(rho, 1 - e_lo, 1 + e_hi) A)
    rho = exp(logp - old_logp) per token, or with importance_ratio "sequence" (GSPO) the
    sequence's exp(sum_t m (logp - old_logp) / |o_i|), the same for all its tokens. Plus
    beta * k3(logp, ref_logp), summed with `weights`; entropy [N, T] (the exact per-token
    entropy, `mlxcore.rl.logprobs`) adds entropy_coef times a bonus -sum(weights * entropy) (a
    token term like the others), or with a target the penalty M * max(target - H, 0): H =
    sum(weights * entropy) / M is the micro-batch's mean entropy (its tokens weighted as the
    loss weights them) and M = sum(weights) its share of the step, so the penalty acts on each
    micro-batch's own mean and one without a scored token (M = 0) adds nothing. On the first
    inner epoch rho == 1 and the clipped and unclipped forms have the same gradient.
    Positions where `mask` is 0 contribute nothing, whatever logp, old_logp, ref_logp,
    entropy or the row's advantage hold there (an all-masked row or micro-batch gives a finite
    loss and gradient).
    across_ranks (data-parallel runs, `mlxio.run.distributed.rank_mean`): x -> the mean of x
    over the ranks in value, this rank's x in gradient; it takes the sums that the entropy
    target and clip_frac divide, so both read the step's micro-batch on every rank (as one
    rank holding them all would). None: one process.
    Metrics (scalars): pg_loss, kl (weighted k3), entropy (weighted -logp of the sampled tokens,
    a Monte-Carlo estimate), token_entropy (sum(weights * entropy), when given), clip_frac
    (share of scored tokens whose ratio lies outside [1 - e_lo, 1 + e_hi]; 0 without clipping).
    """
    if importance_ratio not in RATIO_LEVELS:
        raise ValueError(f"importance_ratio {importance_ratio!r}: expected one of {', '.join(RATIO_LEVELS)}")
    if importance_ratio == "sequence" and clip_eps is None:
        raise ValueError("importance_ratio 'sequence' (GSPO) needs clip_eps")
    scored = mx.stop_gradient(mask != 0)
    maskf = scored.astype(mx.float32)

    def scored_only(x):  # 0 where not scored: no inf / NaN there reaches the loss or its gradient
        return mx.where(scored, x, 0.0)

    logp = scored_only(logp)
    old_logp = mx.stop_gradient(scored_only(old_logp))
    ref_logp = mx.stop_gradient(scored_only(ref_logp))
    adv = mx.stop_gradient(scored_only(advantages.astype(mx.float32)[:, None]))  # [N, T]
    w = mx.stop_gradient(scored_only(weights.astype(mx.float32)))
    over_ranks = across_ranks or (lambda x: x)

    def total(x):
        return (w * x).sum()

    def ratio_of(num, den):  # num / den, 0 where den is 0 (num is then 0 too)
        return num / mx.where(den > 0, den, 1.0)

    if clip_eps is None:
        per_token = -(logp * adv)
        clip_frac = mx.array(0.0)
    else:
        log_ratio = (logp - old_logp) * maskf
        if importance_ratio == "sequence":
            log_ratio = log_ratio.sum(axis=1, keepdims=True) / mx.maximum(maskf.sum(axis=1, keepdims=True), 1.0)
        ratio = mx.exp(log_ratio)
        high = clip_eps if clip_eps_high is None else clip_eps_high
        per_token = -mx.minimum(ratio * adv, mx.clip(ratio, 1.0 - clip_eps, 1.0 + high) * adv)
        outside = ((ratio < 1.0 - clip_eps) | (ratio > 1.0 + high)).astype(mx.float32) * maskf
        clip_frac = mx.stop_gradient(ratio_of(over_ranks(outside.sum()), over_ranks(maskf.sum())))
    pg_loss = total(per_token)
    kl = total(kl_k3(logp, ref_logp))
    loss = pg_loss + beta * kl if beta else pg_loss
    metrics = {"pg_loss": pg_loss, "kl": mx.stop_gradient(kl), "entropy": mx.stop_gradient(total(-logp)),
               "clip_frac": clip_frac}
    if entropy is not None:
        h_sum = total(scored_only(entropy))
        if entropy_target is None:
            term = -h_sum
        else:  # M * max(target - H, 0), H = h_sum / M: the micro-batch's own mean (over every rank)
            mass, h_all = over_ranks(w.sum()), over_ranks(h_sum)
            term = mass * mx.maximum(entropy_target - ratio_of(h_all, mass), 0.0)
        loss = loss + entropy_coef * term
        metrics["token_entropy"] = mx.stop_gradient(h_sum)
    return loss, metrics


def policy_loss_fn(hidden: Callable[[Tree, mx.array], mx.array], head: Callable[[mx.array], mx.array],
                   beta: float, clip_eps: float | None, grpo: GrpoConfig = GrpoConfig(), chunk: int = 512,
                   across_ranks: Callable[[mx.array], mx.array] | None = None):
    """loss(params, micro_batch, key) -> (loss, metrics) for `mlxcore.train.step`: `policy_loss` of
    the log-probs of the completion tokens, from `hidden(params, tokens) -> [M, T, H]` (the
    policy's last hidden states of whole rows - a causal model's: the last position's is not
    used -, a pure function of its trainable tree `params`, e.g.
    `mlxio.weights.llm_lora.hidden_states`) and the frozen LM `head(h) -> logits`, scored
    only at `positions`, `chunk` rows at a time (`mlxcore.rl.logprobs.gathered_logprobs`: no
    [M, T, V] logits). The exact entropy is computed only when `grpo.entropy_coef` > 0.
    across_ranks: as in `policy_loss` (data-parallel runs).

    micro_batch: tokens [M, T], mask [M, T-1] (scored completion targets), weights [M, T-1]
    (`loss_weights`), positions [P] (flat indices of the mask's ones in order, then padding
    >= M * (T-1): `mlxcore.rl.packing.target_positions`),
    advantages [M], old_logp / ref_logp [M, T-1].
    """
    with_entropy = grpo.entropy_coef > 0

    def loss_fn(params: Tree, mb: dict, key: mx.array):
        tokens = mb["tokens"]
        # the whole row, not tokens[:, :-1]: a causal model's states before the last token are
        # the same, and a packed width that is a multiple of 128 (`mlxcore.train.buckets`) stays one,
        # which MLX's CUDA attention needs for its fused backward (cuDNN); at T - 1 it recomputes
        # [rows, heads, T, T] scores in the backward pass instead. One token a row more.
        states = hidden(params, tokens)[:, :-1]
        logp, ent = gathered_logprobs(head, states, tokens[:, 1:], mb["mask"], mb["positions"], chunk=chunk,
                                      entropy=with_entropy)
        return policy_loss(logp, mb["old_logp"], mb["ref_logp"], mb["advantages"], mb["mask"], mb["weights"],
                           beta, clip_eps, clip_eps_high=grpo.clip_eps_high,
                           importance_ratio=grpo.importance_ratio, entropy=ent, entropy_coef=grpo.entropy_coef,
                           entropy_target=grpo.entropy_target, across_ranks=across_ranks)

    return loss_fn


def reference_params(params: Tree) -> Tree:
    """The same tree with every `lora_b` leaf zeroed: LoRA switched off, base weights shared.

    A LoRA layer adds `scale * x @ lora_a @ lora_b`; with lora_b = 0 that term is exactly 0,
    so the forward pass equals the base model's bit for bit. Only the [r, out] zero matrices
    are new memory.
    """
    flat = flatten(params)
    return unflatten({k: (mx.zeros_like(v) if k.endswith(".lora_b") or k == "lora_b" else v)
                      for k, v in flat.items()})
