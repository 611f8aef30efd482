"""Residual compression of unit-norm token vectors (ColBERTv2 / PLAID style), in NumPy.

A vector v is stored as the id of its nearest centroid c (spherical k-means over a sample of
the corpus' tokens) plus a code of its residual v - c. Two residual codes:

- `PQCodec` (the default, "pq64" for D = 384): the residual is rotated into the principal axes
  of sample residuals (PCA; the axes dealt round-robin to the subspaces, so each subspace gets
  a like share of the variance) and product-quantised: m subspaces of D / m dimensions, each
  coded by the nearest of 256 codewords (Euclidean k-means on held-out residuals), one byte per
  subspace. 64 + 2 bytes per 384-dim token. Decoding is normalise(c R + codewords) in the
  rotated basis; queries are rotated once (`rotate`), so a re-rank never multiplies by R.
- `Codec` (scalar, "1bit" / "2bit" / "4bit"): each dimension's residual cut into 2**nbits
  buckets at that dimension's sample quantiles, a bucket decoding to the mean of the sample
  values that fell in it; normalise(c + bucket_weights[bucket]). 48 + 2 bytes at 1 bit.

On the Python standard library's functions, MaxSim over every function's decompressed vectors
loses most MRR@10 against exact MaxSim at 1 bit, little with pq64 and none measurable at 2 bits
(benchmarks/results/cpu/search_scale_stdlib.json, dev/LOG.md).
"""

from __future__ import annotations

import attrs
import numpy as np

NBITS = (1, 2, 4)
KSUB = 256  # codewords per PQ subspace: one byte per code


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

    @property
    def name(self) -> str:
        return f"{self.nbits}bit"

    def arrays(self) -> dict[str, np.ndarray]:
        """The arrays an index stores besides the centroids (file stem -> array)."""
        return {"codec_cutoffs": self.cutoffs, "codec_weights": self.weights}

    def rotate(self, q: np.ndarray) -> np.ndarray:
        """Queries in the basis `decode_rotated` returns (the identity here)."""
        return np.asarray(q, np.float32)

    def decode_rotated(self, ids: np.ndarray, packed: np.ndarray, normalise: bool = True, scratch=None
                       ) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        """`decode` (the basis is not rotated); normalise=False: (vectors, norms of 1);
        `scratch` unused (PQCodec's signature)."""
        out = self.decode(ids, packed)
        return out if normalise else (out, np.ones(len(out), np.float32))

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


def default_subspaces(dim: int) -> int:
    """PQ subspaces (= code bytes per token) for `dim`: the divisor of dim nearest dim / 6
    (64 for 384: 6 dimensions a byte, 1.33 bits per dimension)."""
    divisors = [m for m in range(1, dim + 1) if dim % m == 0]
    return min(divisors, key=lambda m: (abs(m - dim / 6), m))


def parse_name(name: str, dim: int) -> tuple[str, int]:
    """("pq", subspaces) or ("scalar", nbits) of a codec name: "pq" (default subspaces),
    "pq64", "1bit", "2bit", "4bit"; ValueError naming the choices otherwise."""
    if name == "pq":
        return "pq", default_subspaces(dim)
    if name.startswith("pq") and name[2:].isdigit() and int(name[2:]) > 0 and dim % int(name[2:]) == 0:
        return "pq", int(name[2:])
    if name.endswith("bit") and name[:-3].isdigit() and int(name[:-3]) in NBITS:
        return "scalar", int(name[:-3])
    raise ValueError(f"codec must be pq, pqM (M bytes per token, M dividing the dimension {dim}) or one "
                     f"of {', '.join(f'{b}bit' for b in NBITS)}; got {name!r}")


def canonical_name(name: str, dim: int) -> str:
    """The name a trained codec reports (`name` of Codec / PQCodec): "pq" -> "pq64" at 384."""
    kind, value = parse_name(name, dim)
    return f"pq{value}" if kind == "pq" else f"{value}bit"


@attrs.frozen
class PQCodec:
    """centroids float32 [K, D] (unit norm); rotation float32 [D, D] orthogonal (residual r is
    coded as r @ rotation); codebooks float32 [m, KSUB, D / m]."""

    centroids: np.ndarray
    rotation: np.ndarray
    codebooks: np.ndarray
    _rot_centroids: np.ndarray = attrs.field(init=False, eq=False, repr=False)
    _half_norms: np.ndarray = attrs.field(init=False, eq=False, repr=False)
    _flat: np.ndarray = attrs.field(init=False, eq=False, repr=False)
    _rotation64: np.ndarray = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        c = np.asarray(self.centroids, np.float32)
        r = np.asarray(self.rotation, np.float32)
        books = np.asarray(self.codebooks, np.float32)
        object.__setattr__(self, "_rot_centroids", np.ascontiguousarray(c @ r))
        object.__setattr__(self, "_half_norms", 0.5 * np.einsum("mkd,mkd->mk", books, books))
        object.__setattr__(self, "_flat", np.ascontiguousarray(books.reshape(-1, books.shape[2])))
        object.__setattr__(self, "_rotation64", np.asarray(r, np.float64))

    @property
    def dim(self) -> int:
        return int(self.centroids.shape[1])

    @property
    def subspaces(self) -> int:
        return int(self.codebooks.shape[0])

    @property
    def code_bytes(self) -> int:
        return self.subspaces

    @property
    def name(self) -> str:
        return f"pq{self.subspaces}"

    def arrays(self) -> dict[str, np.ndarray]:
        return {"codec_rotation": np.asarray(self.rotation, np.float16),
                "codec_codebooks": np.asarray(self.codebooks, np.float16)}

    def rotate(self, q: np.ndarray) -> np.ndarray:
        """Queries float32 [n, D] in the basis `decode_rotated` returns: q @ rotation (inner
        products kept), summed in float64 and rounded once, so a row is within one float32 ulp
        per element whatever rows it is rotated with (search rotates a batch's queries stacked;
        `scoring.score_tolerance` counts this)."""
        return (np.asarray(q, np.float64) @ self._rotation64).astype(np.float32)

    def encode(self, x: np.ndarray, chunk: int = 32768, cids: np.ndarray | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
        """(centroid ids uint16/uint32 [n], codes uint8 [n, m]); `cids` skips the
        nearest-centroid search."""
        n, m = len(x), self.subspaces
        ds = self.dim // m
        ids = np.empty(n, centroid_dtype(len(self.centroids)))
        codes = np.empty((n, m), np.uint8)
        for lo in range(0, n, chunk):
            block = np.asarray(x[lo:lo + chunk], np.float32)
            cid = assign(block, self.centroids) if cids is None else np.asarray(cids[lo:lo + chunk], np.int64)
            resid = (block - self.centroids[cid]) @ self.rotation
            for j in range(m):  # nearest codeword: max of r.c - |c|^2 / 2
                part = resid[:, j * ds:(j + 1) * ds] @ self.codebooks[j].T
                part -= self._half_norms[j]
                codes[lo:lo + chunk, j] = np.argmax(part, axis=1)
            ids[lo:lo + chunk] = cid
        return ids, codes

    def decode_rotated(self, ids: np.ndarray, codes: np.ndarray, normalise: bool = True, scratch=None
                       ) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        """Unit-norm float32 [n, D] approximations in the rotated basis (pair with `rotate`);
        normalise=False: (the unnormalised vectors, their norms) - a caller that scores them
        divides its [queries, n] scores by the norms instead of scaling [n, D] vectors.
        `scratch` (a `scoring.Scratch`): the vectors and temporaries go in its reused buffers
        (valid until its next use), the same values."""
        codes, ids = np.asarray(codes), np.asarray(ids, np.intp)
        n, m = codes.shape
        # take(mode="clip") writes into given buffers (mode "raise" buffers them itself); codes are
        # < KSUB by their dtype, ids are checked here
        if n:
            lo, hi = int(ids.min()), int(ids.max())
            if lo < 0 or hi >= len(self._rot_centroids):
                raise IndexError(f"centroid id {hi if hi >= len(self._rot_centroids) else lo} out of range "
                                 f"({len(self._rot_centroids)} centroids)")

        def buffer(name, shape, dtype=np.float32):
            return None if scratch is None else scratch.get(name, shape, dtype)

        flat = np.add(codes, (np.arange(m, dtype=np.intp) * KSUB)[None, :], out=buffer("flat", (n, m), np.intp))
        out = np.take(self._flat, flat, axis=0, mode="clip",
                      out=buffer("decoded", (n, m, self.dim // m))).reshape(n, self.dim)
        out += np.take(self._rot_centroids, ids, axis=0, mode="clip", out=buffer("centroid", (n, self.dim)))
        norms = np.maximum(np.sqrt(np.einsum("ij,ij->i", out, out)), 1e-12)
        if not normalise:
            return out, norms
        out /= norms[:, None]
        return out

    def decode(self, ids: np.ndarray, codes: np.ndarray) -> np.ndarray:
        """Unit-norm float32 [n, D] approximations of the encoded vectors (original basis)."""
        return self.decode_rotated(ids, codes) @ self.rotation.T


def kmeans_l2(x: np.ndarray, k: int, iters: int = 10, seed: int = 0) -> np.ndarray:
    """Euclidean k-means: float32 centroids [k, d] of `x` [n, d]; initialised from k distinct
    random rows (rows repeated when n < k); an empty cluster keeps its centroid."""
    rng = np.random.default_rng(seed)
    x = np.asarray(x, np.float32)
    pick = rng.choice(len(x), k, replace=False) if len(x) >= k else np.arange(k) % len(x)
    c = x[pick].copy()
    for _ in range(iters):
        labels = np.argmax(x @ c.T - 0.5 * np.einsum("kd,kd->k", c, c)[None, :], axis=1)
        sums = np.zeros_like(c)
        _segment_sum(sums, labels, x)
        counts = np.bincount(labels, minlength=k)
        filled = counts > 0
        c[filled] = sums[filled] / counts[filled, None]
    return c


def train_pq(sample: np.ndarray, n_centroids: int, subspaces: int, seed: int = 0, iters: int = 8,
             centroids: np.ndarray | None = None, residual_sample: np.ndarray | None = None) -> PQCodec:
    """A PQCodec: spherical k-means centroids on `sample` (or the given `centroids`), the PCA
    rotation and the codebooks fitted on the residuals of `residual_sample` (tokens the
    centroids were not trained on: in-sample residuals are markedly smaller than a corpus's, so
    codebooks fitted on them would be too small; default: `sample`)."""
    x = np.asarray(sample, np.float32)
    dim = x.shape[1]
    if subspaces < 1 or dim % subspaces:
        raise ValueError(f"{subspaces} subspaces do not divide dimension {dim}")
    if centroids is None:
        centroids = kmeans(x, n_centroids, iters, seed)
    centroids = np.asarray(centroids, np.float32)
    held = x if residual_sample is None else np.asarray(residual_sample, np.float32)
    resid = held - centroids[assign(held, centroids)]
    _, vectors = np.linalg.eigh(np.cov(resid.T.astype(np.float64)) if len(resid) > 1 else np.eye(dim))
    ds = dim // subspaces
    order = vectors[:, ::-1]  # descending variance; axis i goes to subspace i % subspaces
    rotation = np.ascontiguousarray(order[:, np.arange(dim).reshape(ds, subspaces).T.ravel()], np.float32)
    rotated = resid @ rotation
    books = np.stack([kmeans_l2(np.ascontiguousarray(rotated[:, j * ds:(j + 1) * ds]), KSUB, 10, seed + j)
                      for j in range(subspaces)])
    # stored as float16 (as the centroids): the codec that encodes is the one a loaded index decodes with
    return PQCodec(centroids=_f16(centroids), rotation=_f16(rotation), codebooks=_f16(books))


def _f16(x: np.ndarray) -> np.ndarray:
    """float32 copy of x rounded to float16 (the precision the index files keep)."""
    return np.asarray(x, np.float16).astype(np.float32)


def train_named(name: str, sample: np.ndarray, n_centroids: int, seed: int = 0,
                centroids: np.ndarray | None = None, residual_sample: np.ndarray | None = None
                ) -> Codec | PQCodec:
    """The codec `name` (see `parse_name`) trained on `sample` (+ `residual_sample`)."""
    kind, value = parse_name(name, np.asarray(sample).shape[1])
    if kind == "pq":
        return train_pq(sample, n_centroids, value, seed, centroids=centroids, residual_sample=residual_sample)
    held = sample if residual_sample is None else residual_sample
    if centroids is None:
        centroids = kmeans(np.asarray(sample, np.float32), n_centroids, 8, seed)
    return train(held, n_centroids, value, seed, centroids=centroids)


def from_arrays(name: str, centroids: np.ndarray, arrays: dict[str, np.ndarray]) -> Codec | PQCodec:
    """A codec from its stored arrays (`arrays()` of a trained one, + centroids)."""
    kind, value = parse_name(name, centroids.shape[1])
    if kind == "pq":
        return PQCodec(centroids=centroids, rotation=np.asarray(arrays["codec_rotation"], np.float32),
                       codebooks=np.asarray(arrays["codec_codebooks"], np.float32))
    return Codec(centroids=centroids, cutoffs=arrays["codec_cutoffs"], weights=arrays["codec_weights"], nbits=value)


def array_shapes(name: str, dim: int) -> dict[str, tuple[int, ...]]:
    """Shapes of the arrays `from_arrays` needs for codec `name` at dimension `dim`."""
    kind, value = parse_name(name, dim)
    if kind == "pq":
        return {"codec_rotation": (dim, dim), "codec_codebooks": (value, KSUB, dim // value)}
    return {"codec_cutoffs": (dim, 2 ** value - 1), "codec_weights": (dim, 2 ** value)}
