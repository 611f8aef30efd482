"""The per-query kernels of index search, as pure NumPy functions over one segment's arrays.

- `probe_estimate`: the candidate stage's centroid-level MaxSim estimate of every document on
  the probed inverted lists. Short lists: every probed posting gathered at once, each (token,
  document)'s best probe kept by one `np.maximum.at`, a few NumPy calls per query (so batched
  search's generation threads do not queue on the GIL). Long lists: plain assignments per list (a list's documents are
  unique, and lists are visited in ascending probe score, so the best probe a document is on
  wins) into one reused row, faster there than `ufunc.at`. Both give the same bits.
- `doc_chunks`: the exact re-rank decodes the candidates' tokens a block of about
  `CHUNK_TOKENS` tokens at a time (for one query; `Index.search_many` uses larger blocks), so the
  decoded vectors (1.5 MB at 1,024 x 384 float32) stay in the CPU cache between the decode, the
  product and the max (a faster re-rank: dev/LOG.md).
- `query_runs` + `product` + `doc_maxima` + `token_means`: in a block, consecutive documents
  wanted by the same queries are one run, scored by one product of the run's tokens with those
  queries' tokens stacked (one query: the whole block; a batch of 1,000 queries over 1,000
  documents: mostly one document against its ~256 queries, [~125, 384] x [384, ~3,900]), then
  each document's max per query token and each (document, query) pair's mean. The previous
  kernel (one product per document per query, so small products throughout) spent most of a
  1,000 x 1,000 batch on those small calls, holding the GIL in between (dev/LOG.md).
- `score_tolerance`: how far a score may move with the product's shape. BLAS sums each element
  of a product in an order of its choosing (OpenBLAS's kernels differ by CPU - Haswell, Zen,
  SkylakeX, Sandybridge - and, within one kernel set, by the product's shape), so a pair's score
  is not the same bits batched and alone. Everything else in a score (norms, maxima, the mean
  in token order) is computed the same way in any batch, so the two differ by at most the
  float32 error bound of the dot products (and of the queries' rotation), which
  `score_tolerance` states; batched search promises that, not equal bits (`Index.search_many`).

Not used: asymmetric distance computation (per-query lookup tables of each subspace's codeword
scores instead of decoding). With ~15 query tokens and 6 dimensions a byte it gathers 15 floats
per (token, byte) where decoding gathers 6, and it would still need each token's norm (the
centroid-residual cross term needs the centroid rows anyway): slower than decoding and
multiplying in NumPy (dev/LOG.md).
"""

from __future__ import annotations

import math

import numpy as np

CHUNK_TOKENS = 1024
UNIT_ROUNDOFF = 2.0**-24  # float32: a correctly rounded operation's relative error is at most this


PROBE_CELLS = 1 << 21  # token x document cells of `probe_estimate`'s gather buffer (16 MB of float64)
# mean postings per probed list up to which `probe_estimate` gathers (beyond: one assignment per
# list): where the two cross over (dev/probe_kernel_crossover.py,
# dev/results/cpu/probe_kernel_crossover.json)
GATHER_MAX_POSTINGS = 256


def probe_estimate(indptr: np.ndarray, ivf_docs: np.ndarray, n_docs: int, probes: np.ndarray,
                   probe_scores: np.ndarray, deleted: np.ndarray | None = None
                   ) -> tuple[np.ndarray, np.ndarray]:
    """(documents int64 [c] ascending, estimates float32 [c]) of the live documents on any probed
    list. indptr int64 [K + 1] and ivf_docs (any integer type) [postings]: the inverted lists (list k's
    documents, ascending and unique, are ivf_docs[indptr[k]:indptr[k + 1]]); probes int [Tq, P]
    centroid ids and probe_scores float [Tq, P] their scores; deleted bool [n_docs] or None.
    A document's estimate is the mean over query tokens t of the best score among t's probes
    whose list holds it, or t's lowest probe score when none does.

    Each posting of a probed list gets its probe's excess over the token's floor + `span`, the
    best per (token, document) kept, and the tokens' rows are added in token order
    (`_summed_best`). `span`, a power of two above any document's summed excess, makes total =
    span x (tokens that reached it) + summed excess, both exact in float64: the documents
    reached are those with total > 0, without a separate mask."""
    n_q = len(probes)
    scores = np.asarray(probe_scores, np.float32)
    floor = scores.min(axis=1)  # [Tq]
    excess = (scores - floor[:, None]).astype(np.float64)  # >= 0
    span = 2.0 ** np.ceil(np.log2(float(excess.max(initial=0.0)) * n_q + 1.0))
    total = _summed_best(indptr, ivf_docs, n_docs, np.asarray(probes, np.int64), excess + span)
    if deleted is not None:
        total[deleted] = 0.0
    found = np.flatnonzero(total)
    reached = np.floor(total[found] / span)
    summed = total[found] - reached * span
    return found.astype(np.int64), (summed / n_q + floor.mean(dtype=np.float64)).astype(np.float32)


def _summed_best(indptr: np.ndarray, ivf_docs: np.ndarray, n_docs: int, probes: np.ndarray,
                 values: np.ndarray) -> np.ndarray:
    """float64 [n_docs]: sum over tokens t (in order) of the largest values[t, p] (> 0) among t's
    probes p whose list holds the document, 0 for none. Two ways, the same bits:

    - short lists (mean <= GATHER_MAX_POSTINGS postings): every probed posting gathered at
      once, each (token, document)'s best kept by one `np.maximum.at` into a [tokens, documents]
      buffer of at most PROBE_CELLS cells. A handful of NumPy calls per query: batched search
      generates candidates on threads, and per-list Python work queued them on the GIL.
    - long lists: per token, one assignment per list in ascending value (the best one a document
      is on is left), the row added and cleared: fewer, larger copies than `ufunc.at` makes.
    """
    starts, lengths = indptr[probes], indptr[probes + 1] - indptr[probes]  # [Tq, P] each
    if lengths.size and lengths.mean() > GATHER_MAX_POSTINGS:
        return _summed_best_assigned(ivf_docs, n_docs, starts, lengths, values)
    return _summed_best_gathered(ivf_docs, n_docs, starts, lengths, values)


def _summed_best_assigned(ivf_docs: np.ndarray, n_docs: int, starts: np.ndarray, lengths: np.ndarray,
                          values: np.ndarray) -> np.ndarray:
    """`_summed_best` by one assignment per probed list (starts, lengths, values [Tq, P])."""
    order = np.argsort(values, axis=1, kind="stable")  # ascending: a better probe overwrites
    lo = np.take_along_axis(starts, order, axis=1).tolist()
    hi = np.take_along_axis(starts + lengths, order, axis=1).tolist()
    ordered = np.take_along_axis(values, order, axis=1).tolist()
    total, row = np.zeros(n_docs, np.float64), np.zeros(n_docs, np.float64)
    for t in range(len(lo)):
        for a, b, value in zip(lo[t], hi[t], ordered[t], strict=True):
            row[ivf_docs[a:b]] = value
        total += row
        row.fill(0.0)
    return total


def _summed_best_gathered(ivf_docs: np.ndarray, n_docs: int, starts: np.ndarray, lengths: np.ndarray,
                          values: np.ndarray) -> np.ndarray:
    """`_summed_best` by one `np.maximum.at` per chunk of tokens (starts, lengths, values [Tq, P])."""
    n_q, n_probes = starts.shape
    total = np.zeros(n_docs, np.float64)
    chunk = max(1, PROBE_CELLS // max(n_docs, 1))
    best = np.zeros((min(chunk, n_q), n_docs), np.float64)
    for t0 in range(0, n_q, chunk):
        t1 = min(t0 + chunk, n_q)
        count = lengths[t0:t1].ravel()
        ends = np.cumsum(count)
        if ends[-1]:
            at = np.repeat(starts[t0:t1].ravel() - (ends - count), count) + np.arange(ends[-1])  # postings
            row_at = np.repeat(np.arange(t1 - t0) * n_docs, n_probes)  # each (token, probe)'s row offset
            np.maximum.at(best[:t1 - t0].reshape(-1), np.repeat(row_at, count) + ivf_docs[at],
                          np.repeat(values[t0:t1].ravel(), count))
        for t in range(t1 - t0):
            total += best[t]
        best.fill(0.0)
    return total


def doc_chunks(lengths: np.ndarray, limit: int = CHUNK_TOKENS) -> list[tuple[int, int]]:
    """Consecutive [lo, hi) ranges covering documents 0..len(lengths)-1, each of at most `limit`
    tokens (lengths int [n] >= 1) or of one document when that alone is longer."""
    ends = np.cumsum(np.asarray(lengths, np.int64))
    bounds, lo = [], 0
    while lo < len(ends):
        before = int(ends[lo - 1]) if lo else 0
        hi = max(lo + 1, int(np.searchsorted(ends, before + limit, side="right")))
        bounds.append((lo, hi))
        lo = hi
    return bounds


class Scratch:
    """Reused buffers for one thread's re-rank temporaries (decoded blocks, gathered query
    tokens, products: MBs each). A fresh array that size is fresh pages from the OS each time,
    several times slower to decode into than a reused one."""

    def __init__(self) -> None:
        self._buffers: dict[str, np.ndarray] = {}

    def get(self, name: str, shape: tuple[int, ...], dtype=np.float32) -> np.ndarray:
        """A C-contiguous array of `shape` (contents undefined) over buffer `name`, which is
        grown (by half again at least) when too small; valid until `name` is asked for again."""
        size, dtype = math.prod(shape), np.dtype(dtype)
        buffer = self._buffers.get(name)
        if buffer is None or buffer.dtype != dtype or buffer.size < size:
            grown = 0 if buffer is None or buffer.dtype != dtype else buffer.size + buffer.size // 2
            buffer = self._buffers[name] = np.empty(max(size, grown), dtype)
        return buffer[:size].reshape(shape)


def product(a: np.ndarray, lo: int, hi: int, b: np.ndarray, scratch: Scratch | None = None) -> np.ndarray:
    """a[lo:hi] @ b.T, float32 [hi - lo, C], of rows of a [n, D] and b [C, D] (one BLAS call;
    its rounding depends on the BLAS and the shape: `score_tolerance`). `scratch`: the product
    goes in its buffer "product"."""
    x = a[lo:hi]
    return np.matmul(x, b.T, out=None if scratch is None else scratch.get("product", (len(x), len(b)), x.dtype))


def _gamma(n: int) -> float:
    """n u / (1 - n u): the relative error bound of a float32 sum or dot product of n terms in
    any order (Higham, Accuracy and Stability of Numerical Algorithms, 3.1), u = 2^-24."""
    return n * UNIT_ROUNDOFF / (1.0 - n * UNIT_ROUNDOFF)


def score_tolerance(dim: int, n_query_tokens: int, query_norm: float = 1.0) -> float:
    """The most a MaxSim score may differ between two computations that sum the products in
    different orders (batched and one-at-a-time search; two BLAS kernel sets), for query tokens
    of norm at most `query_norm` in `dim` dimensions (n_query_tokens >= 1).

    Each path's dot product q.d is within gamma_dim |q| |d| of the exact one (any summation
    order, FMA or not), the query's rotation (float64, rounded to float32) within 2u per
    element, so the two similarities q.d / |d| (the same |d| in both) differ by at most
    2 (gamma_dim + 2u) |q| (1 + gamma_dim) plus their division's rounding, 2u |q| (1 + gamma_dim);
    the max over document tokens moves no more than its inputs; the mean over query tokens,
    summed in the same order in both, adds at most 2 gamma_Tq + 2u of the largest similarity."""
    bound = query_norm * (1.0 + _gamma(dim + 2))  # |q.d| / |d| at most this
    per_similarity = 2.0 * (_gamma(dim) + 3.0 * UNIT_ROUNDOFF) * bound
    return per_similarity + (2.0 * _gamma(max(n_query_tokens - 1, 1)) + 2.0 * UNIT_ROUNDOFF) * bound


def doc_maxima(sims: np.ndarray, norms: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """float32 [docs, C]: each document's max over its rows of sims [tokens, C] (products with
    unnormalised token vectors; overwritten) divided by the tokens' norms [tokens], document i
    from row starts[i] (ascending, starts[0] = 0). Exact: the same bits in any batch."""
    sims /= norms[:, None]
    if len(starts) == 1:  # one document: a plain max, well ahead of reduceat over rows (dev/LOG.md)
        return sims.max(axis=0, keepdims=True)
    return np.maximum.reduceat(sims, starts, axis=0)


def query_runs(first: np.ndarray, queries: np.ndarray) -> list[tuple[int, int]]:
    """[lo, hi) runs of consecutive documents that the same queries want: document i wants
    queries[first[i]:first[i + 1]] (first int [n + 1], each document at least one query, in
    ascending order); a run is scored by one product with those queries' tokens."""
    n = len(first) - 1
    if n <= 0:
        return []
    if len(queries) == n and queries[0] == queries[-1] and (n < 3 or (queries == queries[0]).all()):
        return [(0, n)]  # one query wants them all (one-at-a-time search)
    count = np.diff(first)
    same = np.zeros(n, np.bool_)
    if n > 1:
        prev = np.repeat(np.r_[0, count[:-1]], count)  # each query's rank in the previous document
        shifted = queries[np.maximum(np.arange(len(queries)) - prev, 0)]
        differ = np.logical_or.reduceat(queries != shifted, first[:-1])
        same[1:] = (count[1:] == count[:-1]) & ~differ[1:]
    starts = np.flatnonzero(~same).tolist()
    return list(zip(starts, starts[1:] + [n], strict=True))


def token_means(best: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """float32 [pairs]: MaxSim of each (document, query) pair, the mean of its query tokens'
    maxima best[starts[p]:starts[p] + lengths[p]] (lengths >= 1) added one token at a time in
    order (no pairwise summation, whose order would follow the array's shape), so a pair's
    score is the same bits in any batch. Pairs are taken longest first: token t adds to the
    prefix of pairs longer than t."""
    if not len(starts):
        return np.zeros(0, np.float32)
    order = np.argsort(-lengths, kind="stable")
    s, n = starts[order], lengths[order]
    total = best[s]
    for t in range(1, int(n[0])):
        k = int(np.searchsorted(-n, -t, side="left"))  # pairs of more than t tokens
        total[:k] += best[s[:k] + t]
    out = np.empty(len(starts), np.float32)
    out[order] = total / n.astype(np.float32)
    return out
