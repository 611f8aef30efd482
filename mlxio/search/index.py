"""A compressed multi-vector index: loading a generation memory-mapped and searching it (the
files are written by `writer`, read a segment at a time by `segment`; the per-query kernels are `mlxcore.retrieval.index_scoring`).

Search (PLAID-style, in NumPy, on memory maps), over every segment of the live generation:
1. candidates: each query token's `nprobe` best centroids; the live documents on those
   centroids' inverted lists (of every segment) get, per query token, the best probed centroid
   score they hold (a token that probed none of a document's centroids gets the token's lowest
   probed score); their mean over query tokens ranks the candidates, and the best `candidates`
   of all segments go on;
2. re-rank: MaxSim (mean over query tokens of the max over document tokens) against the
   candidates' decompressed token vectors;
3. BM25 from sparse inverted indexes (`lexical`: CSR postings of term counts per segment;
   documents' terms are `ranking.doc_terms`, a query's `ranking.query_terms` - stemmed plurals, no
   English function words -, the terms the retriever's evaluation BM25 and its fusion weight use;
   weights from the live documents' df and mean length, so segments and tombstones change no
   score; a batch's queries scored together, each distinct term's postings read once);
   hybrid = the semantic pool plus BM25's top documents, fused over that pool by min-max
   interpolation with the stored weight, or reciprocal-rank fusion on request.
A document's id is its segment's first slot + its position in the segment; tombstoned slots
are never returned.
"""

from __future__ import annotations

import json
import os
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from mlxcore.retrieval import codec as codec_mod
from mlxcore.retrieval import index_scoring, ranking
from mlxio import blas
from mlxio.search import lexical, store
from mlxio.search.segment import Segment
from mlxio.search.store import IndexError_

FUSIONS = ("interp", "rrf")
DEFAULT_NPROBE = 8
DEFAULT_CANDIDATES = 256
# nprobe 8 / 256 candidates: what candidate generation loses against exact search is small on the
# stdlib corpus and more costs time for nothing (benchmarks/results/cpu/search_scale_stdlib.json).
# Size-aware defaults (search_defaults): candidates grow with the number of live documents,
# nprobe with candidates, within caps. CANDIDATES_PER_DOC = 0 keeps the fixed 8 / 256 above;
# NPROBE_PER_CENTROID = 0 keeps nprobe 8 at any centroid count. Set these from
# `benchmarks.search_scale --corpus stdlib --sweep`; 512 candidates per million documents gives
# 16 / 512 at a million functions, where 8 / 256 loses more (benchmarks/results/cpu/search_scale.json),
# and keeps 8 / 256 up to 500,000.
CANDIDATES_PER_DOC = 512 / 1_000_000
NPROBE_PER_CENTROID = 0.0
MAX_CANDIDATES = 1024
MAX_NPROBE = 16
BM25_POOL = 64
READ_ATTEMPTS = 5  # loads retried while updates keep switching CURRENT under a reader
# search_many decodes the union of a batch's candidates this many tokens at a time, each block a
# task for a thread (the block size barely changes the time; smaller blocks balance more threads)
BATCH_BLOCK_TOKENS = 2048
BATCH_QUERIES = 1024  # queries per batch: bounds the (query, candidate) bookkeeping
# scoring threads at most. A batch's products are one GEMM per document against its queries'
# stacked tokens (GIL released): a batch gains up to 16 threads, one query's short blocks no more
# than 4 (dev/search_workers.py, dev/results/h200/search_workers.json). Results are the same bits
# on any number.
MAX_WORKERS_BATCH, MAX_WORKERS_ONE = 16, 4
# candidate generation threads at most (a batch's queries, one task each). A query's generation is
# mostly Python and small NumPy calls that hold the GIL: more threads queue on it
# (dev/search_generation_workers.py; dev/LOG.md, 2026-11-28)
MAX_WORKERS_GENERATE = 4


class SearchArgumentError(store.MlxioError, ValueError):
    """A search argument is out of range (top-k, alpha, empty query, ...)."""


def check_args(top_k: int, alpha: float | None = None, nprobe: int | None = None,
               candidates: int | None = None) -> None:
    if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1:
        raise SearchArgumentError(f"--top-k must be an integer >= 1, got {top_k!r}")
    if alpha is not None and not (isinstance(alpha, (int, float)) and 0.0 <= alpha <= 1.0):
        raise SearchArgumentError(f"--alpha must be in [0, 1], got {alpha!r}")
    for name, value in (("--nprobe", nprobe), ("--candidates", candidates)):
        if value is not None and (not isinstance(value, int) or value < 1):
            raise SearchArgumentError(f"{name} must be an integer >= 1, got {value!r}")


def search_defaults(n_docs: int, n_centroids: int = 0, candidates_per_doc: float | None = None,
                    nprobe_per_centroid: float | None = None) -> tuple[int, int]:
    """(nprobe, candidates) for an index of `n_docs` live documents and `n_centroids` centroids
    when its manifest pins neither: candidates = ceil(candidates_per_doc * n_docs) within
    [DEFAULT_CANDIDATES, MAX_CANDIDATES]; nprobe = the larger of DEFAULT_NPROBE scaled by
    candidates / DEFAULT_CANDIDATES (more documents to gather) and ceil(nprobe_per_centroid *
    n_centroids) (finer centroids, each list a smaller share of the space), at most MAX_NPROBE."""
    per_doc = CANDIDATES_PER_DOC if candidates_per_doc is None else candidates_per_doc
    per_centroid = NPROBE_PER_CENTROID if nprobe_per_centroid is None else nprobe_per_centroid
    candidates = int(min(max(DEFAULT_CANDIDATES, int(np.ceil(per_doc * max(n_docs, 0)))),
                         max(MAX_CANDIDATES, DEFAULT_CANDIDATES)))
    nprobe = max(DEFAULT_NPROBE, round(DEFAULT_NPROBE * candidates / DEFAULT_CANDIDATES),
                 int(np.ceil(per_centroid * max(n_centroids, 0))))
    return int(min(nprobe, max(MAX_NPROBE, DEFAULT_NPROBE))), candidates


class Index:
    """A loaded (memory-mapped) generation. `Index(INDEX_DIR)`; raises IndexError_ with one
    line naming the problem when the index is missing, corrupt or of another version."""

    def __init__(self, index_dir: Path | str, full_hashes: bool = False):
        self.root = Path(index_dir)
        for attempt in range(READ_ATTEMPTS):  # an update may switch CURRENT while this one loads
            gen = store.current(self.root) if self.root.is_dir() else None
            try:
                self._load(gen, full_hashes)
                return
            except (IndexError_, OSError) as err:
                again = store.current(self.root) if self.root.is_dir() else None
                if again is None or again == gen or attempt + 1 == READ_ATTEMPTS:
                    if isinstance(err, IndexError_):
                        raise
                    raise IndexError_(f"{gen}: unreadable ({err.strerror or err}); rebuild with `index --rebuild`") from None
                # CURRENT moved on (an update committed): read the new generation

    def _load(self, gen: Path | None, full_hashes: bool) -> None:
        if gen is None:
            raise IndexError_(f"{self.root}: no search index here (no CURRENT); build one with "
                              "code_search's `index SRC --model M --index DIR`")
        if not gen.is_dir():
            raise IndexError_(f"{gen}: the live generation named by CURRENT is missing; rebuild with `index --rebuild`")
        self.gen = gen
        self.manifest = m = store.read_manifest(gen, full_hashes)
        try:
            dim, k = (int(m[key]) for key in ("dim", "centroids"))
            name, infos = str(m["codec"]), list(m["segments"])
            shapes = codec_mod.array_shapes(name, dim)
        except (KeyError, TypeError, ValueError):
            raise IndexError_(f"{gen / 'manifest.json'}: lacks dim/centroids/codec/segments or names an "
                              "unknown codec; rebuild with `index --rebuild`") from None
        centroids = store.load_npy(gen, "centroids.npy", (k, dim)).astype(np.float32)
        self.codec = codec_mod.from_arrays(name, centroids, {stem: store.load_npy(gen, f"{stem}.npy", shape)
                                                             for stem, shape in shapes.items()})
        self.segments = [Segment(gen, info, self.codec) for info in infos]
        self.bases = np.zeros(len(self.segments) + 1, np.int64)  # first slot of each segment
        self.bases[1:] = np.cumsum([s.n for s in self.segments])
        self.n_slots = int(self.bases[-1])
        self.n_docs = sum(s.live for s in self.segments)
        self.n_tokens = sum(s.n_tokens for s in self.segments)
        self.live_ids = np.concatenate([np.flatnonzero(s.live_mask()) + b for s, b in
                                        zip(self.segments, self.bases, strict=False)] or [np.zeros(0, np.int64)])
        live_len = sum(float(s.doc_len[s.live_mask()].sum()) for s in self.segments)
        self.avg_len = live_len / self.n_docs if self.n_docs and live_len > 0 else 1.0
        search = m.get("search") or {}  # pinned values; else search_defaults of this index's size
        nprobe, candidates = search_defaults(self.n_docs, k)
        self.nprobe = int(search.get("nprobe") or nprobe)
        self.candidates = int(search.get("candidates") or candidates)
        self._units: dict | None = None

    # -- documents

    def locate(self, i: int) -> tuple[Segment, int]:
        """(segment, local id) of document slot i."""
        if not 0 <= i < self.n_slots:
            raise IndexError(f"document {i} out of range (index has {self.n_slots} slots)")
        s = int(np.searchsorted(self.bases, i, side="right")) - 1
        return self.segments[s], int(i - self.bases[s])

    def record_json(self, i: int) -> bytes:
        """Document slot i's record as one line of JSON bytes."""
        seg, j = self.locate(i)
        try:
            return seg.record_json(j)
        except (zlib.error, ValueError) as err:
            raise IndexError_(f"{self.gen / seg.name / 'records.bin'}: record {j} unreadable ({err}); "
                              "rebuild with `index --rebuild`") from None

    def record(self, i: int) -> dict:
        line = self.record_json(i)
        try:
            return json.loads(line)
        except ValueError as err:
            raise IndexError_(f"{self.gen / 'records.bin'}: record {i} unreadable ({err}); rebuild with `index --rebuild`") from None

    def codes(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """(centroid ids, packed residuals) of document slot i."""
        seg, j = self.locate(i)
        lo, hi = seg.offsets[j], seg.offsets[j + 1]
        return np.asarray(seg.cids[lo:hi]), np.asarray(seg.residuals[lo:hi])

    def _by_segment(self, docs: np.ndarray):
        """(segment, its base, positions in `docs`, local ids) for each segment `docs` touch."""
        seg_of = np.searchsorted(self.bases, docs, side="right") - 1
        for s in np.unique(seg_of):
            where = np.flatnonzero(seg_of == s)
            yield self.segments[s], self.bases[s], where, docs[where] - self.bases[s]

    # -- scoring

    def maxsim(self, q: np.ndarray, docs: np.ndarray) -> np.ndarray:
        """MaxSim float32 [len(docs)] of query tokens q [Tq, D] against decompressed documents
        (decoded `index_scoring.CHUNK_TOKENS` tokens at a time: the block stays in the CPU cache)."""
        return self.maxsim_many([q], [docs], index_scoring.CHUNK_TOKENS)[0]

    def maxsim_many(self, qs: list[np.ndarray], pools: list[np.ndarray],
                    block_tokens: int = BATCH_BLOCK_TOKENS, workers: int | None = None) -> list[np.ndarray]:
        """MaxSim float32 [len(pools[i])] of each query qs[i] [Tq_i, D] against its documents
        pools[i], decoding each document once for all the queries that need it: the union of the
        pools is decoded in blocks of about `block_tokens` tokens; in a block, each run of
        consecutive documents wanted by the same queries is one product with those queries'
        tokens stacked (`index_scoring.query_runs`, `product`), so a query's scores in a batch are
        within `index_scoring.score_tolerance` of its scores alone (BLAS rounds by the product's
        shape). Blocks run on `workers` threads (default: one per usable core, at most
        MAX_WORKERS_BATCH for several queries and MAX_WORKERS_ONE for one), BLAS on one thread
        each; the blocks, so the results, do not depend on the number."""
        q_len = np.array([len(q) for q in qs], np.int64)
        q_all = self.codec.rotate(np.concatenate(qs) if qs else np.zeros((0, self.codec.dim), np.float32))  # [sum Tq, D]
        q_first = np.cumsum(q_len) - q_len  # query i's tokens: q_all[q_first[i]:][:q_len[i]]
        sizes = [len(p) for p in pools]
        owner = np.repeat(np.arange(len(pools)), sizes)  # one (query, document) pair per pool slot
        wanted = np.concatenate([np.asarray(p, np.int64) for p in pools] or [np.zeros(0, np.int64)])
        union, which = np.unique(wanted, return_inverse=True)
        order = np.argsort(which, kind="stable")  # pairs by document, then query
        first = np.searchsorted(which[order], np.arange(len(union) + 1))  # pairs of union[u]: first[u]:first[u + 1]
        pair_query = owner[order]
        pair_len = q_len[pair_query]
        pair_at = np.zeros(len(order) + 1, np.int64)  # each pair's query-token maxima: best[pair_at[p]:pair_at[p + 1]]
        np.cumsum(pair_len, out=pair_at[1:])
        best = np.empty(int(pair_at[-1]), np.float32)
        blocks = []  # (segment, token positions, document bounds in them, first and last + 1 union index)
        for seg, _, where, local in self._by_segment(union):
            positions, starts = seg.tokens(local)
            ends = np.r_[starts[1:], len(positions)]
            for lo, hi in index_scoring.doc_chunks(ends - starts, block_tokens):
                blocks.append((seg, positions[starts[lo]:ends[hi - 1]], starts[lo:hi] - starts[lo],
                               ends[lo:hi] - starts[lo], int(where[lo]), int(where[hi - 1]) + 1))

        local = threading.local()  # each thread's index_scoring.Scratch

        def score(block) -> None:
            seg, rows, doc_starts, doc_ends, u0, u1 = block  # a segment's documents are a run of `union`
            if not hasattr(local, "scratch"):
                local.scratch = index_scoring.Scratch()
            scratch = local.scratch
            vectors, norms = self.codec.decode_rotated(seg.cids[rows], seg.residuals[rows], normalise=False,
                                                       scratch=scratch)
            firsts = first[u0:u1 + 1]
            for a, b in index_scoring.query_runs(firsts - firsts[0], pair_query[firsts[0]:firsts[-1]]):
                p0, p1 = int(firsts[a]), int(firsts[a + 1])  # the run's queries: those of its first document
                if p1 - p0 == 1:  # one query: its tokens are a slice
                    i = int(pair_query[p0])
                    stacked = q_all[q_first[i]:q_first[i] + q_len[i]]
                else:
                    lengths = pair_len[p0:p1]
                    tokens = np.repeat(q_first[pair_query[p0:p1]] - (pair_at[p0:p1] - pair_at[p0]), lengths)
                    tokens += np.arange(int(pair_at[p1] - pair_at[p0]))
                    stacked = np.take(q_all, tokens, axis=0, mode="clip",
                                      out=scratch.get("queries", (len(tokens), q_all.shape[1])))
                lo, hi = int(doc_starts[a]), int(doc_ends[b - 1])
                sims = index_scoring.product(vectors, lo, hi, stacked, scratch)
                maxima = index_scoring.doc_maxima(sims, norms[lo:hi], doc_starts[a:b] - lo)  # [b - a, tokens]
                best[pair_at[p0]:pair_at[p0] + maxima.size] = maxima.ravel()  # pairs by document, then query

        _map(score, blocks, workers or _workers(len(qs)))
        flat = np.empty(len(order), np.float32)
        flat[order] = index_scoring.token_means(best, pair_at[:-1], pair_len)
        return np.split(flat, np.cumsum(sizes)[:-1]) if sizes else []

    def generate(self, q: np.ndarray, nprobe: int, candidates: int) -> np.ndarray:
        """The `candidates` best live documents by centroid-level scores (ascending ids)."""
        q = np.asarray(q, np.float32)
        scores = q @ self.codec.centroids.T  # [Tq, K]
        nprobe = min(nprobe, scores.shape[1])
        probes = np.argpartition(-scores, nprobe - 1, axis=1)[:, :nprobe]  # [Tq, nprobe]
        probe_scores = np.take_along_axis(scores, probes, axis=1)
        found = [(seg.approx(probes, probe_scores), base) for seg, base in zip(self.segments, self.bases, strict=False)]
        docs = np.concatenate([d + base for (d, _), base in found] or [np.zeros(0, np.int64)])
        approx = np.concatenate([a for (_, a), _ in found] or [np.zeros(0, np.float32)])
        if len(docs) > candidates:
            keep = np.argpartition(-approx, candidates - 1)[:candidates]
            docs = np.sort(docs[keep])
        return docs.astype(np.int64)

    def bm25(self, query: str) -> np.ndarray:
        """BM25 scores float32 [n_slots] of a query (a batch of one: `bm25_blocks`; df and mean
        length over the live documents; tombstoned slots score 0)."""
        return next(self.bm25_blocks([query]))[1][0]

    def bm25_blocks(self, queries: list[str], block_cells: int = lexical.BLOCK_CELLS):
        """(first query, scores float32 [rows, n_slots]) blocks covering `queries` in order, row i
        the BM25 scores of queries[first + i], each distinct term's postings read once
        (`lexical.bm25_blocks`)."""
        return lexical.bm25_blocks(self.segments, self.bases, self.n_docs, self.avg_len, queries, block_cells)

    def search(self, query: str, q: np.ndarray | None, mode: str, top_k: int = 10,
               alpha: float | None = None, fusion: str = "interp", nprobe: int | None = None,
               candidates: int | None = None) -> list[tuple[int, float]]:
        """[(document, score)] best first, at most top_k. q: query token embeddings [Tq, D]
        (unit norm; not needed for mode "bm25"). Hybrid: `fusion` "interp" with semantic
        weight `alpha` (default: the weight stored in the index) or "rrf"."""
        return self.search_many([query], [q], mode, top_k, alpha, fusion, nprobe, candidates)[0]

    def search_many(self, queries: list[str], qs: list[np.ndarray | None], mode: str, top_k: int = 10,
                    alpha: float | None = None, fusion: str = "interp", nprobe: int | None = None,
                    candidates: int | None = None, block_tokens: int | None = None
                    ) -> list[list[tuple[int, float]]]:
        """`search` of every query (qs[i]: queries[i]'s token embeddings), with the exact
        re-rank shared: `BATCH_QUERIES` queries at a time, each candidate decoded once per batch
        (`maxsim_many`, in blocks of `block_tokens`; default `BATCH_BLOCK_TOKENS`, or
        `index_scoring.CHUNK_TOKENS` for a single query).

        Against `search` of each query alone: the same candidates and BM25 scores (bit for bit),
        each semantic score within `index_scoring.score_tolerance` (BLAS rounds a product by its
        shape), and so the same ranking except that documents whose scores lie that close may
        trade places; equal scores are ordered by document id in both."""
        check_args(top_k, alpha, nprobe, candidates)
        if block_tokens is not None and (not isinstance(block_tokens, int) or isinstance(block_tokens, bool)
                                         or block_tokens < 1):
            raise SearchArgumentError(f"block_tokens must be an integer >= 1, got {block_tokens!r}")
        if len(queries) != len(qs):
            raise SearchArgumentError(f"{len(queries)} queries but {len(qs)} query embeddings")
        for i, query in enumerate(queries):
            if not isinstance(query, str) or not query.strip():
                raise SearchArgumentError("the query is empty" if len(queries) == 1 else f"query {i + 1} is empty")
        if mode not in ("semantic", "bm25", "hybrid"):
            raise SearchArgumentError(f"mode must be semantic, bm25 or hybrid, got {mode!r}")
        if fusion not in FUSIONS:
            raise SearchArgumentError(f"fusion must be one of {FUSIONS}, got {fusion!r}")
        if self.n_docs == 0:
            return [[] for _ in queries]
        out = []
        for lo in range(0, len(queries), BATCH_QUERIES):
            batch = range(lo, min(lo + BATCH_QUERIES, len(queries)))
            if mode == "bm25":  # documents sharing no term with the query score 0: not results
                for _, block in self.bm25_blocks([queries[i] for i in batch]):
                    for scores in block:
                        hits = self.live_ids[scores[self.live_ids] > 0]
                        out.append(_top(hits, scores[hits], top_k))
                continue
            k = max(candidates or self.candidates, top_k)
            pools = _map(lambda i, k=k: self.generate(qs[i], nprobe or self.nprobe, k), batch,
                         min(_workers(len(batch)), MAX_WORKERS_GENERATE))
            if mode == "hybrid":
                pools, lexical_scores = self._join_bm25([queries[i] for i in batch], pools)
            block = block_tokens or (index_scoring.CHUNK_TOKENS if len(batch) == 1 else BATCH_BLOCK_TOKENS)
            semantic = self.maxsim_many([qs[i] for i in batch], pools, block)
            if mode == "semantic":
                out += [_top(pool, sem, top_k) for pool, sem in zip(pools, semantic, strict=True)]
                continue
            for pool, sem, lex in zip(pools, semantic, lexical_scores, strict=True):
                if fusion == "rrf":
                    fused = ranking.reciprocal_rank_fusion([sem[None], lex[None]])[0]
                else:
                    fused = ranking.interpolate(sem[None], lex[None], self.fusion_alpha() if alpha is None else alpha)[0]
                out.append(_top(pool, fused, top_k))
        return out

    def _join_bm25(self, queries: list[str], pools: list[np.ndarray]
                   ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """(each pools[i] joined with BM25's top `BM25_POOL` documents of queries[i], ascending;
        their BM25 scores float32), the batch's BM25 scored together (`bm25_blocks`)."""
        k = min(BM25_POOL, self.n_slots)
        joined, lex = [], []
        for first, block in self.bm25_blocks(queries):
            for pool, scores in zip(pools[first:first + len(block)], block, strict=True):
                top = np.argpartition(-scores, k - 1)[:k] if k < self.n_slots else np.arange(self.n_slots)
                joined.append(_union(pool, top[scores[top] > 0]))  # a tombstoned slot scores 0
                lex.append(scores[joined[-1]])
        return joined, lex

    def fusion_alpha(self) -> float:
        """The stored semantic weight of hybrid interpolation (1.0: semantic ranking)."""
        value = self.manifest.get("fusion", {}).get("alpha")
        return 1.0 if value is None else float(value)

    def units(self) -> dict:
        """{"kind", "units": {key: [sha256, size, mtime_ns, segment, first, count]}} (read once)."""
        if self._units is not None:
            return self._units
        try:
            self._units = json.loads(zlib.decompress((self.gen / "units.json.z").read_bytes()))
            return self._units
        except (OSError, ValueError, zlib.error) as err:
            raise IndexError_(f"{self.gen / 'units.json.z'}: unreadable ({err}); rebuild with `index --rebuild`") from None


def _workers(n_queries: int) -> int:
    """Threads for a search of `n_queries` queries: one per usable core, at most MAX_WORKERS_BATCH
    (several queries) or MAX_WORKERS_ONE (one)."""
    return min(len(os.sched_getaffinity(0)), MAX_WORKERS_BATCH if n_queries > 1 else MAX_WORKERS_ONE)


def _map(fn, items, workers: int) -> list:
    """[fn(item) for item in items] on min(workers, len(items)) threads, BLAS on one thread each."""
    items = list(items)
    with blas.one_thread():
        if min(workers, len(items)) <= 1:
            return [fn(item) for item in items]
        with ThreadPoolExecutor(min(workers, len(items))) as pool:
            return list(pool.map(fn, items))


def _union(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """np.union1d(a, b) of int64 arrays (ascending, unique), by one sort of the concatenation
    (a third of union1d's time on a 256-document pool and BM25's 64)."""
    c = np.concatenate((a, b))
    c.sort()
    return c[np.r_[True, c[1:] != c[:-1]]] if len(c) else c


def _top(docs: np.ndarray, scores: np.ndarray, k: int) -> list[tuple[int, float]]:
    """Best k by score (ties: lower document id first)."""
    order = np.lexsort((docs, -np.asarray(scores, np.float64)))[:k]
    return [(int(docs[i]), float(scores[i])) for i in order]
