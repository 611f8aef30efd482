"""The per-query kernels of index search, as pure NumPy functions over one segment's arrays.

- `probe_estimate`: the candidate stage's centroid-level MaxSim estimate of every document on
  the probed inverted lists, by plain assignments per list (a list's documents are unique, and
  lists are visited in ascending probe score, so the best probe a document is on wins) into one
  reused row: no [query tokens, documents] matrix, no sort of the postings, no `ufunc.at`.
- `doc_chunks` + `docs_maxsim`: the exact re-rank decodes the candidates' tokens a block of
  about `CHUNK_TOKENS` tokens at a time, so the decoded vectors (1.5 MB at 1,024 x 384 float32)
  stay in the CPU cache between the decode, the product and the max; on 256 stdlib candidates
  (~43,000 tokens) that took the re-rank from ~60 to ~36 ms on one core here.
- `docs_maxsim` scores each document by its own product: batched search (many queries sharing
  one decode of each document, `Index.search_many`) gives the bits of one-at-a-time search.

Not used: asymmetric distance computation (per-query lookup tables of each subspace's codeword
scores instead of decoding). With ~15 query tokens and 6 dimensions a byte it gathers 15 floats
per (token, byte) where decoding gathers 6, and it would still need each token's norm (the
centroid-residual cross term needs the centroid rows anyway): 1.76 ms per 1,024 tokens + 3.7 ms
of tables per query, against 0.67-0.78 ms to decode and multiply (NumPy, one core, session 7).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

CHUNK_TOKENS = 1024


def probe_estimate(indptr: np.ndarray, ivf_docs: np.ndarray, n_docs: int, probes: np.ndarray,
                   probe_scores: np.ndarray, deleted: np.ndarray | None = None
                   ) -> tuple[np.ndarray, np.ndarray]:
    """(documents int64 [c] ascending, estimates float32 [c]) of the live documents on any probed
    list. indptr int64 [K + 1] and ivf_docs int32 [postings]: the inverted lists (list k's
    documents, ascending and unique, are ivf_docs[indptr[k]:indptr[k + 1]]); probes int [Tq, P]
    centroid ids and probe_scores float [Tq, P] their scores; deleted bool [n_docs] or None.
    A document's estimate is the mean over query tokens t of the best score among t's probes
    whose list holds it, or t's lowest probe score when none does.

    Per token, each probed list's documents are assigned the probe's excess over that floor +
    `span`, lists in ascending score so the best one a document is on is left; the row is added
    to the total and cleared (two dense passes: cheaper than scattering every posting again,
    ~1 M documents included). `span`, a power of two above any document's summed excess, makes
    total = span x (tokens that reached it) + summed excess, both exact in float64: the
    documents reached are those with total > 0, without a separate mask."""
    n_q = len(probes)
    scores = np.asarray(probe_scores, np.float32)
    floor = scores.min(axis=1)  # [Tq]
    order = np.argsort(scores, axis=1, kind="stable")  # ascending: a better probe overwrites
    probes = np.take_along_axis(np.asarray(probes, np.int64), order, axis=1)
    excess = np.take_along_axis(scores - floor[:, None], order, axis=1).astype(np.float64)  # >= 0
    span = 2.0 ** np.ceil(np.log2(float(excess.max(initial=0.0)) * n_q + 1.0))
    lo, hi = indptr[probes].tolist(), indptr[probes + 1].tolist()
    total = np.zeros(n_docs, np.float64)
    row = np.zeros(n_docs, np.float64)
    for t in range(n_q):
        for a, b, value in zip(lo[t], hi[t], (excess[t] + span).tolist(), strict=True):
            row[ivf_docs[a:b]] = value
        total += row
        row.fill(0.0)
    if deleted is not None:
        total[deleted] = 0.0
    found = np.flatnonzero(total)
    reached = np.floor(total[found] / span)
    summed = total[found] - reached * span
    return found.astype(np.int64), (summed / n_q + floor.mean(dtype=np.float64)).astype(np.float32)


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


def docs_maxsim(q_t: np.ndarray, docs: Sequence[np.ndarray], norms: np.ndarray) -> np.ndarray:
    """MaxSim float32 [len(docs)] of query tokens q_t [D, Tq] (the query transposed, C-contiguous)
    against documents given as their unnormalised token vectors docs[i] [L_i >= 1, D] (row-major
    views), norms [sum L_i] the tokens' norms in the same order.

    A document's score depends on its vectors and the query alone, bit for bit: each document is
    its own product ([L_i, D] @ [D, Tq]: BLAS picks kernels, hence rounding, by matrix shape, so
    one product over many documents would round a document differently beside other neighbours),
    then `maxsim_of_products`."""
    if not docs:
        return np.zeros(0, np.float32)
    lengths = np.fromiter((len(d) for d in docs), np.int64, len(docs))
    starts = np.zeros(len(docs), np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    sims = np.empty((int(lengths.sum()), q_t.shape[1]), np.float32)  # [tokens, Tq]
    for doc, lo, n in zip(docs, starts.tolist(), lengths.tolist(), strict=True):
        np.matmul(doc, q_t, out=sims[lo:lo + n])
    return maxsim_of_products(sims, norms, starts)


def maxsim_of_products(sims: np.ndarray, norms: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """MaxSim float32 [docs] from one query's products with documents' unnormalised tokens,
    sims [tokens, Tq] (overwritten) with the tokens' norms [tokens], document i from row
    starts[i]: each row divided by its norm, the max over each document's rows (exact), and
    the mean over query tokens adding columns in a fixed order (no pairwise summation whose
    order could follow the array's shape)."""
    sims /= norms[:, None]
    best = np.maximum.reduceat(sims, starts, axis=0)  # [docs, Tq]
    total = best[:, 0].copy()
    for t in range(1, best.shape[1]):
        total += best[:, t]
    return total / np.float32(best.shape[1])
