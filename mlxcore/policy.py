"""Policy-gradient pieces for RLAIF (GRPO style), as pure functions over arrays.

Shapes: N completions (G per prompt, so N = prompts * G), T token positions, V vocabulary.
A completion's tokens are scored by `token_logprobs`; only positions where `mask` is 1 (the
completion's own tokens, never the prompt or padding) enter the loss. Each sequence's token
terms are averaged over its completion tokens and the sequence means are averaged over the
batch (DeepSeekMath's GRPO normalisation): the loss of a batch is then the mean of independent
per-sequence terms, so gradient accumulation over equal micro-batches equals one big batch.

The KL reference is the policy's own base model with LoRA switched off: `reference_params`
zeroes every `lora_b`, which makes each adapter's contribution `x @ A @ 0` exactly zero, so the
same weights in memory give the reference log-probabilities (no second model copy that could
drift).
"""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx

from mlxcore.tree import Tree, flatten, unflatten


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


def masked_sequence_mean(x: mx.array, mask: mx.array) -> mx.array:
    """Mean over each sequence's masked positions, then over sequences: [N, T] -> scalar.

    A sequence with no masked token contributes 0 (its count is clamped to 1).
    """
    mask = mask.astype(mx.float32)
    per_seq = (x * mask).sum(axis=1) / mx.maximum(mask.sum(axis=1), 1.0)
    return per_seq.mean()


def policy_loss(logp: mx.array, old_logp: mx.array, ref_logp: mx.array, advantages: mx.array,
                mask: mx.array, beta: float, clip_eps: float | None = None
                ) -> tuple[mx.array, dict[str, mx.array]]:
    """Policy-gradient loss with a k3 KL penalty; returns (scalar loss, metrics).

    logp [N, T]: log-probs of the sampled tokens under the policy being trained (carries the
    gradient); old_logp [N, T]: under the policy that sampled them (used only with clipping);
    ref_logp [N, T]: under the reference (LoRA off); advantages [N]; mask [N, T] (1 on
    completion tokens). Per token the objective is
      clip_eps None: -(logp * A)                                     (REINFORCE with baseline)
      clip_eps e:    -min(rho * A, clip(rho, 1 - e, 1 + e) * A),  rho = exp(logp - old_logp)
    plus beta * k3(logp, ref_logp), averaged by `masked_sequence_mean`. On the first inner
    epoch rho == 1 and both forms have the same gradient; later PPO epochs reuse the batch.
    Metrics (scalars): pg_loss, kl (mean k3), entropy (-mean logp of the sampled tokens, a
    Monte-Carlo estimate of the policy's entropy), clip_frac (share of completion tokens whose
    ratio lies outside [1 - e, 1 + e]; 0 without clipping).
    """
    old_logp = mx.stop_gradient(old_logp)
    ref_logp = mx.stop_gradient(ref_logp)
    adv = mx.stop_gradient(advantages.astype(mx.float32))[:, None]
    maskf = mask.astype(mx.float32)
    if clip_eps is None:
        per_token = -(logp * adv)
        clip_frac = mx.array(0.0)
    else:
        ratio = mx.exp(logp - old_logp)
        clipped = mx.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
        per_token = -mx.minimum(ratio * adv, clipped * adv)
        outside = (mx.abs(ratio - 1.0) > clip_eps).astype(mx.float32)
        clip_frac = (outside * maskf).sum() / mx.maximum(maskf.sum(), 1.0)
    pg_loss = masked_sequence_mean(per_token, maskf)
    kl = masked_sequence_mean(kl_k3(logp, ref_logp), maskf)
    loss = pg_loss + beta * kl if beta else pg_loss
    metrics = {
        "pg_loss": pg_loss,
        "kl": mx.stop_gradient(kl),
        "entropy": mx.stop_gradient(masked_sequence_mean(-logp, maskf)),
        "clip_frac": clip_frac,
    }
    return loss, metrics


def policy_loss_fn(forward: Callable[[Tree, mx.array], mx.array], beta: float, clip_eps: float | None):
    """loss(params, micro_batch, key) -> (loss, metrics) for `mlxcore.step`: `policy_loss` of
    the log-probs under `forward(params, ids) -> logits`, a pure function of the policy's
    trainable tree `params` (e.g. `mlxio.weights.llm_lora.forward`: the LoRA tree bound to a
    frozen base).

    micro_batch: tokens [M, T], mask [M, T-1] (completion targets of valid completions),
    advantages [M], old_logp / ref_logp [M, T-1].
    """

    def loss_fn(params: Tree, mb: dict, key: mx.array):
        logp = sequence_logprobs(lambda ids: forward(params, ids), mb["tokens"])
        return policy_loss(logp, mb["old_logp"], mb["ref_logp"], mb["advantages"], mb["mask"], beta, clip_eps)

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
