"""Residual compression of unit-norm token vectors (ColBERTv2 / PLAID style), in NumPy.

A vector v is stored as the id of its nearest centroid c (spherical k-means over a sample of
the corpus' tokens) plus its residual v - c quantised to `nbits` per dimension: each
dimension's values are cut into 2**nbits buckets at that dimension's sample quantiles, and a
bucket decodes to the mean of the sample values that fell in it. Decoding is
normalise(c + bucket_weights[bucket]). With D = 384 and nbits = 1 a token costs 48 bytes of
residual + 2 bytes of centroid id, against 768 bytes as float16.
"""

from __future__ import annotations

import attrs
import numpy as np

NBITS = (1, 2, 4)


def _normalise(x: np.ndarray) -> np.ndarray:
    norm = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.maximum(norm, 1e-12)


def n_centroids_for(n_tokens: int) -> int:
    """Power of two near 4 * sqrt(n_tokens), in [16, 8192] (PLAID uses 16 * sqrt; a smaller
    K keeps k-means and assignment affordable on a CPU, and longer lists only make candidate
    generation see more documents per probe)."""
    k = 2 ** int(round(np.log2(max(4.0 * np.sqrt(max(n_tokens, 1)), 1.0))))
    return int(min(max(k, 16), 8192, max(n_tokens, 1)))


def assign(x: np.ndarray, centroids: np.ndarray, chunk: int = 32768) -> np.ndarray:
    """Nearest (max inner product) centroid of each row: int64 [n]."""
    c = np.asarray(centroids, np.float32)
    out = np.empty(len(x), np.int64)
    for lo in range(0, len(x), chunk):
        block = np.asarray(x[lo:lo + chunk], np.float32)
        out[lo:lo + chunk] = np.argmax(block @ c.T, axis=1)
    return out


def kmeans(sample: np.ndarray, k: int, iters: int = 8, seed: int = 0) -> np.ndarray:
    """Spherical k-means (cosine): unit-norm float32 centroids [k, D] of `sample` [n, D].
    Initialised from k distinct random sample rows; an empty cluster keeps its centroid."""
    rng = np.random.default_rng(seed)
    x = _normalise(np.asarray(sample, np.float32))
    k = min(k, len(x))
    centroids = x[rng.choice(len(x), k, replace=False)].copy()
    for _ in range(iters):
        labels = assign(x, centroids)
        sums = np.zeros_like(centroids)
        _segment_sum(sums, labels, x)
        counts = np.bincount(labels, minlength=k)
        filled = counts > 0
        centroids[filled] = _normalise(sums[filled])
    return centroids


def _segment_sum(out: np.ndarray, labels: np.ndarray, x: np.ndarray) -> None:
    order = np.argsort(labels, kind="stable")
    sorted_labels = labels[order]
    starts = np.flatnonzero(np.r_[True, sorted_labels[1:] != sorted_labels[:-1]])
    out[sorted_labels[starts]] = np.add.reduceat(x[order], starts, axis=0)


@attrs.frozen
class Codec:
    """centroids float32 [K, D] (unit norm); cutoffs float32 [D, 2**nbits - 1]; weights float32
    [D, 2**nbits] (the decoded residual value of each bucket, per dimension)."""

    centroids: np.ndarray
    cutoffs: np.ndarray
    weights: np.ndarray
    nbits: int
    _lut: np.ndarray | None = attrs.field(init=False, default=None, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        """For nbits > 1: lut float32 [code_bytes, 256, 8 / nbits], the decoded residual values of
        the dimensions each packed byte holds, so decoding gathers whole bytes' values."""
        if self.nbits == 1 or 8 % self.nbits or self.dim * self.nbits % 8:
            return
        per, mask = 8 // self.nbits, (1 << self.nbits) - 1
        values = np.arange(256)
        shifts = 8 - self.nbits * (np.arange(per) + 1)
        buckets = (values[:, None] >> shifts[None, :]) & mask  # [256, per]
        weights = np.asarray(self.weights, np.float32).reshape(self.dim // per, per, -1)
        lut = weights[:, np.arange(per)[None, :], buckets]  # [bytes, 256, per]
        object.__setattr__(self, "_lut", np.ascontiguousarray(lut, np.float32))

    @property
    def dim(self) -> int:
        return int(self.centroids.shape[1])

    @property
    def code_bytes(self) -> int:
        """Bytes of packed residual per token."""
        return self.dim * self.nbits // 8

    def encode(self, x: np.ndarray, chunk: int = 32768, cids: np.ndarray | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
        """(centroid ids uint16/uint32 [n], packed residual codes uint8 [n, D * nbits / 8]);
        `cids` skips the nearest-centroid search (ids from an earlier `encode`)."""
        n = len(x)
        ids = np.empty(n, centroid_dtype(len(self.centroids)))
        packed = np.empty((n, self.code_bytes), np.uint8)
        for lo in range(0, n, chunk):
            block = np.asarray(x[lo:lo + chunk], np.float32)
            cid = assign(block, self.centroids) if cids is None else np.asarray(cids[lo:lo + chunk], np.int64)
            resid = block - self.centroids[cid]
            # bucket = number of the dimension's cut-offs <= value (searchsorted side="right")
            buckets = (resid[:, :, None] >= self.cutoffs[None]).sum(axis=2, dtype=np.uint8)
            ids[lo:lo + chunk] = cid
            packed[lo:lo + chunk] = pack(buckets, self.nbits)
        return ids, packed

    def decode(self, ids: np.ndarray, packed: np.ndarray) -> np.ndarray:
        """Unit-norm float32 [n, D] approximations of the encoded vectors."""
        if self.nbits == 1:  # low + bit * (high - low): one multiply-add, no gather
            buckets = unpack(np.asarray(packed), self.nbits, self.dim)
            lo, hi = self.weights[:, 0], self.weights[:, 1]
            out = np.multiply(buckets, hi - lo, dtype=np.float32)
            out += lo
        elif self._lut is not None:  # one gather per packed byte
            codes = np.asarray(packed)
            out = self._lut[np.arange(codes.shape[1])[None, :], codes].reshape(len(codes), self.dim)
        else:
            levels = 2 ** self.nbits
            flat = unpack(np.asarray(packed), self.nbits, self.dim).astype(np.int32)
            flat += (np.arange(self.dim, dtype=np.int32) * levels)[None, :]
            out = np.take(self.weights.reshape(-1), flat)
        out += self.centroids[np.asarray(ids, np.intp)]
        norms = np.sqrt(np.einsum("ij,ij->i", out, out))
        out /= np.maximum(norms, 1e-12)[:, None]
        return out


def centroid_dtype(k: int) -> type:
    return np.uint16 if k <= 65536 else np.uint32


def pack(buckets: np.ndarray, nbits: int) -> np.ndarray:
    """uint8 [n, D] bucket indices < 2**nbits -> uint8 [n, D * nbits / 8] (big-endian bits)."""
    if nbits == 8:
        return buckets
    bits = np.unpackbits(buckets[:, :, None], axis=2)[:, :, 8 - nbits:]  # [n, D, nbits]
    return np.packbits(bits.reshape(len(buckets), -1), axis=1)


def unpack(packed: np.ndarray, nbits: int, dim: int) -> np.ndarray:
    """Inverse of `pack`: uint8 [n, dim]."""
    bits = np.unpackbits(packed, axis=1)[:, :dim * nbits].reshape(len(packed), dim, nbits)
    if nbits == 1:
        return bits[:, :, 0]
    weights = (1 << np.arange(nbits - 1, -1, -1)).astype(np.uint8)
    return (bits * weights).sum(axis=2, dtype=np.uint8)


def train(sample: np.ndarray, n_centroids: int, nbits: int, seed: int = 0,
          iters: int = 8, centroids: np.ndarray | None = None) -> Codec:
    """A Codec fitted on `sample` float [n, D] (unit-norm token vectors); `centroids` reuses
    given centroids (only the residual buckets are fitted)."""
    if nbits not in NBITS:
        raise ValueError(f"nbits must be one of {NBITS}, got {nbits}")
    if sample.shape[1] * nbits % 8:
        raise ValueError(f"dimension {sample.shape[1]} x {nbits} bits is not whole bytes")
    x = np.asarray(sample, np.float32)
    if centroids is None:
        centroids = kmeans(x, n_centroids, iters, seed)
    centroids = np.asarray(centroids, np.float32)
    resid = x - centroids[assign(x, centroids)]
    levels = 2 ** nbits
    qs = np.arange(1, levels) / levels
    cutoffs = np.quantile(resid, qs, axis=0).T.astype(np.float32)  # [D, levels - 1]
    weights = np.zeros((x.shape[1], levels), np.float32)
    for d in range(x.shape[1]):
        b = np.searchsorted(cutoffs[d], resid[:, d], side="right")
        sums = np.bincount(b, resid[:, d], minlength=levels)
        counts = np.bincount(b, minlength=levels)
        edges = np.r_[resid[:, d].min(), cutoffs[d], resid[:, d].max()]
        mid = (edges[:-1] + edges[1:]) / 2  # an empty bucket decodes to its midpoint
        weights[d] = np.where(counts > 0, sums / np.maximum(counts, 1), mid)
    return Codec(centroids=centroids, cutoffs=cutoffs, weights=weights, nbits=nbits)
