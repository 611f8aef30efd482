"""BM25 over a loaded generation's segments (sparse postings, `Segment.bm25_*`), a batch of
queries together (`bm25_blocks`: each distinct term's postings read once for the whole batch,
the scores of many queries accumulated by a few vectorised passes); one query is a batch of
one. Its rows are the float32 bits of the per-query loop it replaced (one pass per term and
segment; tests/mlxio/search/test_search_batch.py keeps that loop as the reference).

Weights: idf(t) = ln(1 + (N - df + 0.5) / (df + 0.5)) with df and N over the live documents,
length normalised by the live documents' mean length, so segments and tombstones change no
score; tombstoned slots score 0.

Why a row has the per-query loop's bits: a document's score is 0 + c_1 + c_2 + ... in float32,
c_j the contribution of the query's j-th distinct term (first-occurrence order, as `Counter`
keeps it), each c = w * tf * (k1 + 1) / (tf + norm) evaluated left to right element by element
with w = float32(qtf * idf) (`contributions`, `doc_norms`, `idf`; an element's IEEE result does
not depend on the array it sits in). The batch adds rank by rank
(every query's 1st term, then every query's 2nd, ...), so each cell sees its terms in the same
order; within a rank a (query, document) cell is hit at most once (a term's postings hold a
document once, segments hold different slots), so a plain fancy-index add does it, no
`ufunc.at`, no reordering.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import numpy as np

from mlxcore.retrieval import ranking
from mlxio.search.segment import Segment

BM25_K1, BM25_B = 1.2, 0.75
# (queries x slots) cells of one dense block of `bm25_blocks`: 8 MB of float32; a block's
# postings of one term rank are at most this many too (1,024 queries x 1,000 documents: one block)
BLOCK_CELLS = 1 << 21


class Postings(NamedTuple):
    """Live postings of a list of terms over all segments, CSR by term: term t's are
    [ptr[t]:ptr[t + 1]] (segment by segment, documents ascending within one)."""

    ptr: np.ndarray    # int64 [T + 1]
    slots: np.ndarray  # int64 [P] document slots (segment base + local id)
    tf: np.ndarray     # float32 [P] term counts
    norm: np.ndarray   # float32 [P] `doc_norms` of the posting's document


def idf(n_docs: int, df: int) -> float:
    """Lucene's non-negative BM25 idf of a term in `df` of `n_docs` live documents."""
    return np.log1p((n_docs - df + 0.5) / (df + 0.5))


def doc_norms(doc_len: np.ndarray, avg_len: float) -> np.ndarray:
    """float32 k1 * (1 - b + b * len / avg_len) of documents of lengths doc_len [n]."""
    return BM25_K1 * (1.0 - BM25_B + BM25_B * doc_len.astype(np.float32) / avg_len)


def contributions(w, tf: np.ndarray, norm: np.ndarray) -> np.ndarray:
    """float32 [n] BM25 term contributions w * tf * (k1 + 1) / (tf + norm) of postings with term
    counts tf [n] and `doc_norms` norm [n]; w float32, a scalar or one per posting [n]."""
    return w * tf * (BM25_K1 + 1.0) / (tf + norm)


def query_weights(query: str) -> list[tuple[str, int]]:
    """[(term, count in the query)] of a query's BM25 terms, in first-occurrence order."""
    return list(Counter(ranking.query_terms(query)).items())


def ranges(ptr: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(positions int64 [sum of lengths], their counts per row [len(rows)]) of CSR rows `rows`
    of an index pointer ptr [R + 1], concatenated in the order of `rows`."""
    lo, counts = ptr[rows], ptr[rows + 1] - ptr[rows]
    starts = np.cumsum(counts) - counts
    return np.repeat(lo - starts, counts) + np.arange(int(counts.sum())), counts


def gather_postings(segments: Sequence[Segment], bases: np.ndarray, terms: list[str],
                    avg_len: float) -> Postings:
    """The live postings of `terms` [T] in every segment, each segment's read by one gather."""
    parts = []  # (term index, slot, tf, norm) per segment
    for seg, base in zip(segments, bases, strict=False):
        ids = np.array([seg.bm25_vocab.get(term, -1) for term in terms], np.int64)
        have = np.flatnonzero(ids >= 0)
        at, counts = ranges(np.asarray(seg.bm25_indptr, np.int64), ids[have])
        docs = seg.bm25_docs.view(np.ndarray)[at].astype(np.int64)
        term, tf = np.repeat(have, counts), seg.bm25_tf.view(np.ndarray)[at].astype(np.float32)
        if seg.deleted is not None:
            keep = ~seg.deleted[docs]
            docs, tf, term = docs[keep], tf[keep], term[keep]
        parts.append((term, docs + base, tf, doc_norms(seg.doc_len[docs], avg_len)))
    term, slots, tf, norm = (np.concatenate([p[i] for p in parts]) for i in range(4)) if parts else \
        (np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32), np.zeros(0, np.float32))
    order = np.argsort(term, kind="stable")  # by term, then segment
    ptr = np.searchsorted(term[order], np.arange(len(terms) + 1)).astype(np.int64)
    return Postings(ptr, slots[order], tf[order], norm[order])


def bm25_blocks(segments: Sequence[Segment], bases: np.ndarray, n_docs: int, avg_len: float,
                queries: Sequence[str], block_cells: int = BLOCK_CELLS
                ) -> Iterator[tuple[int, np.ndarray]]:
    """(first query, scores float32 [rows, n_slots]) blocks covering `queries` in order, of about
    `block_cells` cells (at least one query each): row i of a block is query first + i's BM25
    scores (tombstoned slots 0). Each distinct term's postings are gathered once for the batch; a
    block adds every query's j-th term for j = 1, 2, ... (module doc)."""
    n_slots = int(bases[-1])
    vocab: dict[str, int] = {}  # the batch's distinct terms
    pair_query, pair_term, pair_rank, pair_qtf = [], [], [], []  # one (query, distinct term) pair each
    for i, query in enumerate(queries):
        for rank, (term, qtf) in enumerate(query_weights(query)):
            pair_query.append(i)
            pair_term.append(vocab.setdefault(term, len(vocab)))
            pair_rank.append(rank)
            pair_qtf.append(qtf)
    post = gather_postings(segments, bases, list(vocab), avg_len)
    df = np.diff(post.ptr)
    term_idf = np.array([idf(n_docs, int(d)) if d else 0.0 for d in df], np.float64)
    query, term, rank = (np.array(a, np.int64) for a in (pair_query, pair_term, pair_rank))
    w = (np.array(pair_qtf, np.int64) * term_idf[term]).astype(np.float32)  # float32(qtf * idf)
    order = np.lexsort((query, rank))  # pairs by rank, then query
    query, term, rank, w = query[order], term[order], rank[order], w[order]
    key, n = rank * len(queries) + query, len(queries)  # ascending
    n_ranks = int(rank.max()) + 1 if len(rank) else 0
    step = max(1, block_cells // max(n_slots, 1))
    for first in range(0, n, step):
        last = min(first + step, n)
        block = np.zeros((last - first) * n_slots, np.float32)
        for r in range(n_ranks):  # the block's queries' r-th terms, in one pass
            lo, hi = np.searchsorted(key, [r * n + first, r * n + last])
            at, counts = ranges(post.ptr, term[lo:hi])
            cells = np.repeat((query[lo:hi] - first) * n_slots, counts) + post.slots[at]
            block[cells] += contributions(np.repeat(w[lo:hi], counts), post.tf[at], post.norm[at])
        yield first, block.reshape(last - first, n_slots)
