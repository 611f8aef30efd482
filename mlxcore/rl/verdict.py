"""A verdict judge's pieces as pure functions: the one-token Yes/No loss, P(yes) from the answer
logits, balanced batches, and ROC AUC with a bootstrap over problems.

Shapes: B rows (one verdict prompt each), V vocabulary. A row's logits are the next-token logits
after its prompt (the chat template's assistant turn opened), so its first answer token is
what the judge says. A served verdict judge (`mlxio.rl.teacher`, "verdict" scoring) reads the
same quantity: 10 * (P(yes) + P(neither) / 2).
"""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx
import numpy as np

from mlxcore.rl.passk import bootstrap_indices
from mlxcore.train.tree import Tree


def verdict_loss_fn(last_logits: Callable[[Tree, mx.array, mx.array], mx.array]):
    """loss_fn(params, batch, key) -> (loss, metrics) for `mlxcore.train.step`: the mean cross-entropy
    of each row's answer token over the whole vocabulary (so the mass goes to the answer, not
    only from one answer to the other).

    last_logits(params, inputs [B, T, ...], last [B]) -> [B, V]: the next-token logits after
    position `last` of each row (inputs: token ids, or the hidden states a frozen trunk gave
    them). batch: inputs, last [B] int, target [B] int (the answer's token id), other [B] int
    (the opposite answer's). Metrics: accuracy (the target answer is more likely than the
    other), answer_mass (mean P(target) + P(other))."""

    def loss_fn(params: Tree, batch: dict, _key: mx.array) -> tuple[mx.array, dict[str, mx.array]]:
        logp = _log_softmax(last_logits(params, batch["inputs"], batch["last"]).astype(mx.float32))
        target = mx.take_along_axis(logp, batch["target"][:, None], axis=-1)[:, 0]
        other = mx.take_along_axis(logp, batch["other"][:, None], axis=-1)[:, 0]
        return -target.mean(), {"accuracy": (target > other).astype(mx.float32).mean(),
                                "answer_mass": (mx.exp(target) + mx.exp(other)).mean()}

    return loss_fn


def _log_softmax(logits: mx.array) -> mx.array:
    """log softmax over the last axis: [..., V] -> [..., V]."""
    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)


def answer_probs(logits: mx.array, yes_ids: mx.array, no_ids: mx.array) -> tuple[mx.array, mx.array]:
    """(P(yes) [B], P(no) [B]) from next-token logits [B, V]: the softmax mass on every token
    that reads as each answer (`yes_ids`, `no_ids`: int [K] each; "Yes", " yes", "YES", ...)."""
    probs = mx.softmax(logits.astype(mx.float32), axis=-1)
    return probs[:, yes_ids].sum(axis=-1), probs[:, no_ids].sum(axis=-1)


def verdict_scores(p_yes: np.ndarray, p_no: np.ndarray) -> np.ndarray:
    """P(yes) + P(neither) / 2 in [0, 1] (the served judge's score / 10, without its cut-off for
    a judge that answers neither)."""
    p_yes, p_no = np.asarray(p_yes, np.float64), np.asarray(p_no, np.float64)
    return np.clip(p_yes + 0.5 * np.clip(1.0 - p_yes - p_no, 0.0, 1.0), 0.0, 1.0)


def balanced_indices(step: int, per_class: int, positives: int, negatives: int, seed: int) -> np.ndarray:
    """[2 * per_class] row indices for training step `step`: `per_class` positives (indices
    0 .. positives - 1) then `per_class` negatives (positives .. positives + negatives - 1),
    each class walked through its own per-epoch seeded permutation, so the minority class is
    repeated rather than outweighed and the data position is a pure function of the step."""
    if per_class < 1 or positives < 1 or negatives < 1:
        raise ValueError(f"need per_class, positives and negatives >= 1, got {per_class}, {positives}, {negatives}")

    def walk(n: int, offset: int, label: int) -> list[int]:
        out = []
        for pos in range(step * per_class, (step + 1) * per_class):
            epoch, i = divmod(pos, n)
            out.append(offset + int(np.random.default_rng([seed, label, epoch]).permutation(n)[i]))
        return out

    return np.array(walk(positives, 0, 1) + walk(negatives, positives, 0), np.int64)


def _pair_matrix(scores: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """[n_pos, n_neg]: 1 where the positive outscores the negative, 1/2 on ties, else 0."""
    pos, neg = scores[labels][:, None], scores[~labels][None, :]
    return (pos > neg) + 0.5 * (pos == neg)


def roc_auc(scores: np.ndarray, labels: np.ndarray) -> float | None:
    """P(score of a random positive > that of a random negative), ties 1/2; None without both
    classes. scores [N] float, labels [N] bool."""
    scores, labels = np.asarray(scores, np.float64), np.asarray(labels, bool)
    if labels.all() or not labels.any():
        return None
    return float(_pair_matrix(scores, labels).mean())


def auc_bootstrap(scores: dict[str, np.ndarray], labels: np.ndarray, groups: np.ndarray, *,
                  resamples: int = 10_000, seed: int = 0) -> dict[str, np.ndarray]:
    """Bootstrap AUCs of several scorers over the same rows, resampling whole groups (problems:
    the completions of one problem are not independent). scores: name -> [N]; labels [N] bool;
    groups [N] (any labels). Returns name -> [resamples] AUCs (NaN where a resample holds one
    class only); every scorer sees the same resamples, so differences are paired."""
    labels = np.asarray(labels, bool)
    ids = np.unique(np.asarray(groups), return_inverse=True)[1]
    counts = np.zeros((resamples, ids.max() + 1))
    draws = bootstrap_indices(ids.max() + 1, resamples, seed)
    np.add.at(counts, (np.arange(resamples)[:, None], draws), 1.0)
    w_pos, w_neg = counts[:, ids[labels]], counts[:, ids[~labels]]  # [R, n_pos], [R, n_neg]
    total = w_pos.sum(1) * w_neg.sum(1)
    out = {}
    for name, s in scores.items():
        pairs = _pair_matrix(np.asarray(s, np.float64), labels)
        num = np.einsum("ri,ij,rj->r", w_pos, pairs, w_neg)
        out[name] = np.where(total > 0, num / np.where(total > 0, total, 1.0), np.nan)
    return out


def interval(samples: np.ndarray, level: float = 0.95) -> tuple[float, float] | None:
    """The percentile interval of bootstrap `samples` (NaNs left out); None if all are NaN."""
    samples = np.asarray(samples, np.float64)
    samples = samples[~np.isnan(samples)]
    if not len(samples):
        return None
    tail = (1.0 - level) / 2 * 100
    lo, hi = np.percentile(samples, [tail, 100 - tail])
    return float(lo), float(hi)
