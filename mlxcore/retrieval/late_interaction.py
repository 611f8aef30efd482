"""Late-interaction scoring (ColBERT MaxSim, XTR in-batch token retrieval) and contrastive losses.

Embeddings are per-token, L2-normalised: queries q [Bq, Tq, D] with mask [Bq, Tq], documents
d [Bd, Td, D] with mask [Bd, Td] (masks are bool or 0/1). A score matrix is [Bq, Bd]; row i's
positive is column `positives_index[i]` (default i), every other column a negative, so hard
negatives are simply extra documents (Bd > Bq).
"""

from __future__ import annotations

import mlx.core as mx

from mlxcore.kernels import dispatch
from mlxcore.kernels.dispatch import max_last  # noqa: F401  (the MLX-ops path, tested here)

# Floor for padded document tokens: finite (no inf * 0 = NaN in gradients) and far below any
# cosine, so padding never wins a max while a document has one real token.
NEG = -1e9


def l2_normalize(x: mx.array, axis: int = -1, eps: float = 1e-12) -> mx.array:
    """x / max(||x||, eps) along `axis` (torch.nn.functional.normalize's definition)."""
    norm = mx.sqrt(mx.sum(x * x, axis=axis, keepdims=True))
    return x / mx.maximum(norm, eps)


def _gemm_similarities(q: mx.array, d: mx.array) -> mx.array:
    """All query-token x document-token dot products in the GEMM's own layout:
    [Bq, Tq, D], [Bd, Td, D] -> [Bq, Tq, Bd, Td].

    One [Bq*Tq, D] x [D, Bd*Td] GEMM rather than Bq*Bd small batched matmuls: faster on CPU for
    an evaluation block (64 x 16 query tokens against 64 x 128 document tokens).
    """
    bq, tq, dim = q.shape
    bd, td, _ = d.shape
    return (q.reshape(bq * tq, dim) @ d.reshape(bd * td, dim).T).reshape(bq, tq, bd, td)


def token_similarities(q: mx.array, d: mx.array) -> mx.array:
    """All query-token x document-token dot products: [Bq, Tq, D], [Bd, Td, D] -> [Bq, Bd, Tq, Td]."""
    return _gemm_similarities(q, d).transpose(0, 2, 1, 3)


def _mean_over_query(best: mx.array, q_mask: mx.array, count: mx.array | None = None) -> mx.array:
    """Sum of best [..., Tq] over real query tokens / count (default: number of real tokens)."""
    q_mask = q_mask.astype(mx.bool_)
    total = mx.where(q_mask, best, 0.0).sum(-1)
    if count is None:
        count = q_mask.sum(-1)
    return total / mx.maximum(count, 1).astype(best.dtype)


def maxsim(q: mx.array, q_mask: mx.array, d: mx.array, d_mask: mx.array) -> mx.array:
    """ColBERT/XTR MaxSim [Bq, Bd] (float32): per real query token the max similarity over real
    document tokens, averaged over real query tokens (XTR's normalisation; ColBERT sums).

    The [Bq, Tq, Bd, Td] similarities stay in the GEMM's own layout (the max runs over its last
    axis, only the [Bq, Tq, Bd] maxima are transposed) and in the embeddings' dtype, as under
    PyTorch autocast; the maxima are cast to float32 before the mean and the loss. In bfloat16
    each similarity is rounded to 8 bits, and the mean over the query tokens averages those
    roundings out; the [Bq, Tq, Bd, Td] tensor and its gradient (the step's largest: 0.5 GB at
    batch 128 x 32 x 256 in float32) are half the bytes. In float32 nothing changes. Each
    maximum's gradient goes to its first document token (PyTorch's rule): on CUDA through
    `maxsim_cuda.masked_max` (masking, max and argmax in one pass), elsewhere `max_last`.
    """
    sims = _gemm_similarities(q, d)
    best = dispatch.masked_max(sims, d_mask, NEG)  # one read of sims forward, one write backward
    best = best.transpose(0, 2, 1).astype(mx.float32)  # [Bq, Bd, Tq]
    return _mean_over_query(best, q_mask[:, None, :])


def maxsim_paired(q: mx.array, q_mask: mx.array, d: mx.array, d_mask: mx.array) -> mx.array:
    """MaxSim of (query i, document i) pairs only: [B, Tq, D], [B, Td, D] -> [B]."""
    sims = q @ d.swapaxes(-1, -2)  # [B, Tq, Td]
    sims = mx.where(d_mask.astype(mx.bool_)[:, None, :], sims, NEG)
    return _mean_over_query(sims.max(-1), q_mask)


def xtr_scores(q: mx.array, q_mask: mx.array, d: mx.array, d_mask: mx.array,
               k_train: int) -> mx.array:
    """XTR training scores [Bq, Bd] (Lee et al. 2023, eq. 3): in-batch token retrieval.

    Each query token retrieves the top `k_train` document tokens over the whole batch; a
    document token that is not retrieved contributes 0 (A_ij = 0). Score of (q, d) =
    sum over query tokens of max_j A_ij * P_ij, divided by Z = the number of query tokens that
    retrieved at least one token of d (a pair with Z = 0 scores 0). The retrieval cut-off is
    not differentiated.
    """
    q, d = q.astype(mx.float32), d.astype(mx.float32)
    bq, tq = q.shape[:2]
    bd, td = d.shape[:2]
    valid = d_mask.astype(mx.bool_)[None, :, None, :]
    sims = token_similarities(q, d)
    floored = mx.where(valid, sims, NEG)
    pooled = floored.transpose(0, 2, 1, 3).reshape(bq, tq, bd * td)  # all batch tokens per q token
    k = min(k_train, bd * td)
    cutoff = mx.stop_gradient(mx.topk(pooled, k, axis=-1).min(-1))  # [Bq, Tq]
    retrieved = (floored >= cutoff[:, None, :, None]) & valid
    best = mx.where(valid, mx.where(retrieved, sims, 0.0), NEG).max(-1)  # [Bq, Bd, Tq]
    hit = retrieved.any(-1) & q_mask.astype(mx.bool_)[:, None, :]
    return _mean_over_query(mx.where(hit, best, 0.0), q_mask[:, None, :], hit.sum(-1))


def _positives(scores: mx.array, positives_index: mx.array | None) -> mx.array:
    bq, bd = scores.shape
    if positives_index is None:
        if bd < bq:
            raise ValueError(f"scores [{bq}, {bd}] has fewer documents than queries; "
                             "pass positives_index")
        return mx.arange(bq)
    return positives_index.astype(mx.int32)


def _positive_scores(scores: mx.array, positives: mx.array) -> mx.array:
    return mx.take_along_axis(scores, positives[:, None], axis=1)[:, 0]


def info_nce(scores: mx.array, positives_index: mx.array | None = None,
             temperature: float = 0.07) -> mx.array:
    """Mean over queries of cross-entropy of softmax(scores / temperature) at the positive.

    scores [Bq, Bd]; positives_index [Bq] (default arange(Bq)). Scalar.
    """
    positives = _positives(scores, positives_index)
    logits = scores / temperature
    return mx.mean(mx.logsumexp(logits, axis=-1) - _positive_scores(logits, positives))


def margin_loss(scores: mx.array, margin: float = 0.2, hardest: bool = True,
                positives_index: mx.array | None = None) -> mx.array:
    """mean(relu(margin - s_pos + s_neg)) over each query's hardest negative, or over all of
    its negatives (`hardest=False`). scores [Bq, Bd] with Bd >= 2. Scalar."""
    bq, bd = scores.shape
    if bd < 2:
        raise ValueError("margin_loss needs at least one negative document (Bd >= 2)")
    positives = _positives(scores, positives_index)
    pos = _positive_scores(scores, positives)[:, None]
    is_pos = mx.arange(bd)[None, :] == positives[:, None]
    if hardest:
        hardest_neg = mx.where(is_pos, NEG, scores).max(-1, keepdims=True)
        return mx.mean(mx.maximum(margin - pos + hardest_neg, 0.0))
    hinge = mx.where(is_pos, 0.0, mx.maximum(margin - pos + scores, 0.0))
    return mx.mean(hinge.sum(-1) / (bd - 1))


def contrastive_loss(scores: mx.array, temperature: float = 0.07, margin: float = 0.2,
                     margin_weight: float = 0.1, positives_index: mx.array | None = None,
                     hardest: bool = True) -> tuple[mx.array, dict[str, mx.array]]:
    """InfoNCE + margin_weight * margin loss over scores [Bq, Bd].

    Returns (scalar loss, {"info_nce": scalar, "margin": scalar}).
    """
    nce = info_nce(scores, positives_index, temperature)
    hinge = margin_loss(scores, margin, hardest, positives_index)
    return nce + margin_weight * hinge, {"info_nce": nce, "margin": hinge}


def with_hard_negatives(d: mx.array, d_mask: mx.array, neg: mx.array, neg_mask: mx.array
                        ) -> tuple[mx.array, mx.array]:
    """Documents followed by hard negatives, one document set for scoring.

    d [Bd, Td, D], d_mask [Bd, Td]; neg [Bn, Tn, D], neg_mask [Bn, Tn] (Bn = queries x
    negatives per query, flattened; Bn = 0 allowed) -> ([Bd + Bn, T, D], [Bd + Bn, T]) with
    T = max(Td, Tn), the narrower side padded with masked zeros. With Bn = 0 it returns
    (d, d_mask) unchanged, so every score and loss equals the in-batch-only one exactly.
    Column j < Bd is still document j: positives' indices do not move.
    """
    if neg.shape[0] == 0:
        return d, d_mask
    td, tn = d.shape[1], neg.shape[1]
    width = max(td, tn)

    def pad(x, m, t):
        if t == width:
            return x, m.astype(mx.bool_)
        return (mx.pad(x, [(0, 0), (0, width - t), (0, 0)]),
                mx.pad(m.astype(mx.bool_), [(0, 0), (0, width - t)], constant_values=False))

    d, d_mask = pad(d, d_mask, td)
    neg, neg_mask = pad(neg, neg_mask, tn)
    return mx.concatenate([d, neg], axis=0), mx.concatenate([d_mask.astype(mx.bool_), neg_mask], axis=0)


def hard_negative_loss(q: mx.array, q_mask: mx.array, d: mx.array, d_mask: mx.array,
                       neg: mx.array, neg_mask: mx.array, temperature: float = 0.07,
                       margin: float = 0.2, margin_weight: float = 0.1, xtr_k_train: int = 0,
                       positives_index: mx.array | None = None) -> tuple[mx.array, dict[str, mx.array]]:
    """Contrastive loss over in-batch negatives AND hard negatives.

    q [Bq, Tq, D], q_mask [Bq, Tq]: queries; d [Bd, Td, D], d_mask [Bd, Td]: the micro-batch's
    documents, query i's positive is column positives_index[i] (default i); neg [Bn, Tn, D],
    neg_mask [Bn, Tn]: hard negatives (typically Bq x K mined ones, flattened), which every
    query scores as extra negatives. Scores [Bq, Bd + Bn] by MaxSim (or XTR in-batch token
    retrieval when xtr_k_train > 0), then `contrastive_loss`. With Bn = 0 this is exactly
    the in-batch loss. Returns (scalar loss, {"info_nce", "margin"}).
    """
    docs, docs_mask = with_hard_negatives(d, d_mask, neg, neg_mask)
    if xtr_k_train > 0:
        scores = xtr_scores(q, q_mask, docs, docs_mask, xtr_k_train)
    else:
        scores = maxsim(q, q_mask, docs, docs_mask)
    return contrastive_loss(scores, temperature, margin, margin_weight, positives_index=positives_index)
