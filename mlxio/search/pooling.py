"""Token pooling: fewer vectors per document before compression, as PyLate's `pool_factor`.

A document's token vectors (the first, [CLS]-like token kept as it is) are clustered by Ward
hierarchical clustering on cosine distance into n // factor clusters, and each cluster is
replaced by its mean, scaled back to unit length (the codec and MaxSim expect unit vectors; a
mean of unit vectors is shorter). The index then stores about 1 / factor of the tokens, and
MaxSim picks, for each query token, the best cluster centre instead of the best token.
"""

from __future__ import annotations

import numpy as np


def pool_tokens(vectors: np.ndarray, factor: int, protected: int = 1) -> np.ndarray:
    """Pooled vectors [m, D] of one document's token vectors [n, D] (unit rows), in the input's
    dtype: the first `protected` rows as they are, then max((n - protected) // factor, 1)
    cluster means of the others, unit length, ordered by each cluster's first token. `factor`
    1 (or too few tokens to reduce) returns `vectors` unchanged."""
    if not isinstance(factor, int) or factor < 1:
        raise ValueError(f"pool factor must be an integer >= 1, got {factor!r}")
    rest = np.asarray(vectors[protected:], np.float64)
    clusters = max(len(rest) // factor, 1)
    if factor == 1 or clusters >= len(rest):
        return vectors
    from scipy.cluster import hierarchy

    cosine = np.clip(1.0 - rest @ rest.T, 0.0, 2.0)
    condensed = cosine[np.triu_indices(len(rest), k=1)]
    labels = hierarchy.fcluster(hierarchy.linkage(condensed, method="ward"), t=clusters, criterion="maxclust")
    _, first, labels = np.unique(labels, return_index=True, return_inverse=True)
    order = np.argsort(np.argsort(first))  # cluster -> its rank by first token
    sums = np.zeros((len(first), rest.shape[1]), np.float64)
    np.add.at(sums, order[labels.ravel()], rest)
    means = sums / np.maximum(np.linalg.norm(sums, axis=1, keepdims=True), 1e-12)
    return np.concatenate([np.asarray(vectors[:protected], np.float64), means]).astype(vectors.dtype)


def pooled(embed, factor: int):
    """An embed function (`mlxio.search.build.EmbedFn`) whose every document is pooled by
    `factor` (`pool_tokens`); `embed` itself for factor 1."""
    if factor == 1:
        return embed

    def embed_pooled(texts, progress=None):
        return [pool_tokens(v, factor) for v in embed(texts, progress)]

    return embed_pooled
