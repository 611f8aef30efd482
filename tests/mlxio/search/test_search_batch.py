"""Batched search (`Index.search_many`, `code_search search --queries`) returns what one-at-a-time
search returns, on a segmented index with tombstones, whatever the batch and block sizes: the
same candidates and BM25 scores bit for bit; semantic scores within `index_scoring.score_tolerance`
(BLAS rounds a product by its shape: OpenBLAS's Haswell and Zen kernels do, its Sandybridge and
SkylakeX ones did not here); the same ranking but for documents whose scores lie within the
tolerance (after fusion, within what fusion makes of it), equal scores ordered by id."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_search_index import META, FakeEmbed, _write_sources  # tests/ helpers

from mlxcore.retrieval import index_scoring, ranking
from mlxio.search import build, lexical
from mlxio.search import index as index_mod
from mlxio.search.index import Index, SearchArgumentError

WORDS = ["parse", "read", "write", "merge", "split", "encode", "decode", "sort", "count", "scan", "date",
         "file", "header", "token", "table", "queue", "tree", "graph", "image", "socket", "value", "result"]


@pytest.fixture(scope="module")
def segmented(tmp_path_factory):
    """An index of 3 segments with tombstones; FakeEmbed's per-term vectors make many exact ties."""
    root = tmp_path_factory.mktemp("batch")
    src, idx = root / "src", root / "idx"
    _write_sources(src, n_files=10, per_file=6)
    embed = FakeEmbed()
    build.update(src, idx, embed, META)
    (src / "mod1.py").write_text("def brand_new(value):\n    return encode(token, value)\n")
    build.update(src, idx, embed, META)
    (src / "mod5.py").unlink()
    (src / "mod6.py").write_text("def merge_queue_tree(a):\n    return merge(a)\n")
    build.update(src, idx, embed, META)
    index = Index(idx)
    assert len(index.segments) >= 2 and any(s.deleted is not None for s in index.segments)
    return index, embed


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n_queries=st.integers(1, 40), block=st.integers(1, 4096),
       mode=st.sampled_from(["semantic", "hybrid", "bm25"]), fusion=st.sampled_from(["interp", "rrf"]),
       alpha=st.sampled_from([None, 0.0, 0.5, 1.0]), candidates=st.integers(1, 80), top_k=st.integers(1, 12))
def test_batched_equals_one_at_a_time(segmented, seed, n_queries, block, mode, fusion, alpha, candidates, top_k):
    index, embed = segmented
    rng = np.random.default_rng(seed)
    queries = [" ".join(rng.choice(WORDS, int(rng.integers(1, 6)))) for _ in range(n_queries)]
    queries += queries[:2]  # repeated queries
    qs = [v.astype(np.float32) for v in embed(queries)]
    one = [index.search(q, v, mode, top_k, alpha, fusion, candidates=candidates) for q, v in zip(queries, qs, strict=True)]
    many = index.search_many(queries, qs, mode, top_k, alpha, fusion, candidates=candidates, block_tokens=block)
    for query, q, a, b in zip(queries, qs, one, many, strict=True):
        want = reference(index, query, q, mode, alpha, fusion, max(candidates, top_k))
        assert_ranked_alike(a, *want, top_k)
        assert_ranked_alike(b, *want, top_k)
    if mode == "bm25":
        assert many == one  # no product: bit for bit


def reference(index: Index, query: str, q: np.ndarray, mode: str, alpha: float | None, fusion: str,
              k: int) -> tuple[np.ndarray, np.ndarray, float]:
    """(the pool of documents int64 [n], their scores alone float64 [n], how far the batch may
    move a score): the semantic scores of one query scored alone by `Index.maxsim`, fused as
    search fuses them; the tolerance what `index_scoring.score_tolerance` becomes after fusion."""
    if mode == "bm25":
        scores = index.bm25(query)
        hits = index.live_ids[scores[index.live_ids] > 0]
        return hits, scores[hits].astype(np.float64), 0.0
    pool = index.generate(q, index.nprobe, k)
    if mode == "hybrid":
        (pool,), (lex,) = index._join_bm25([query], [pool])
    sem = index.maxsim(q, pool)
    tol = index_scoring.score_tolerance(q.shape[1], len(q), float(np.linalg.norm(q.astype(np.float64), axis=1).max()))
    if mode == "semantic":
        return pool, sem.astype(np.float64), tol
    if fusion == "rrf":  # a rank moves by at most the number of other scores within 2 tol
        sem64 = sem.astype(np.float64)
        near = (np.abs(sem64[:, None] - sem64[None, :]) <= 2 * tol).sum(axis=1) - 1
        rank = ranking.row_ranks(sem64[None])[0]
        k_rrf = ranking.RRF_K
        moved = 1.0 / (k_rrf + np.maximum(rank - near, 1)) - 1.0 / (k_rrf + rank + near)
        return pool, ranking.reciprocal_rank_fusion([sem[None], lex[None]])[0], float(moved.max(initial=0.0))
    weight = index.fusion_alpha() if alpha is None else alpha
    span = float(sem.max() - sem.min()) if len(sem) else 0.0  # min-max: 4 tol / (span - 2 tol) at most
    moved = 4 * tol / (span - 2 * tol) if span > 2 * tol else 1.0
    return pool, ranking.interpolate(sem[None], lex[None], weight)[0], weight * min(moved, 1.0)


def assert_ranked_alike(results: list[tuple[int, float]], pool: np.ndarray, scores: np.ndarray, tol: float,
                        top_k: int) -> None:
    """`results` (best first) rank `pool` by `scores` up to `tol`: every score within tol of the
    document's own, consecutive results in order but for scores within 2 tol, and no document
    left out that beats the last result by more than 2 tol. With no two scores within 2 tol,
    that is exactly the ranking by `scores`."""
    tol += 1e-12  # fusion's float64 arithmetic
    own = dict(zip(pool.tolist(), scores.tolist(), strict=True))
    assert len(results) == min(top_k, len(pool))
    assert len({d for d, _ in results}) == len(results)
    for doc, score in results:
        assert abs(score - own[doc]) <= tol, (doc, score, own[doc], tol)
    ranked = [own[d] for d, _ in results]
    assert all(a >= b - 2 * tol for a, b in zip(ranked, ranked[1:], strict=False)), (ranked, tol)
    left_out = [own[d] for d in own if d not in {d for d, _ in results}]
    assert not results or max(left_out, default=-np.inf) <= ranked[-1] + 2 * tol


def test_batches_split_at_batch_queries(segmented, monkeypatch):
    index, embed = segmented
    queries = [f"{a} {b}" for a in WORDS[:6] for b in WORDS[6:12]]
    qs = [v.astype(np.float32) for v in embed(queries)]
    whole = index.search_many(queries, qs, "hybrid")
    monkeypatch.setattr(index_mod, "BATCH_QUERIES", 7)
    split = index.search_many(queries, qs, "hybrid")
    for query, q, a, b in zip(queries, qs, whole, split, strict=True):
        want = reference(index, query, q, "hybrid", None, "interp", index.candidates)
        assert_ranked_alike(a, *want, 10)
        assert_ranked_alike(b, *want, 10)


def test_search_many_bad_inputs(segmented):
    index, embed = segmented
    q = embed(["parse date"])[0].astype(np.float32)
    with pytest.raises(SearchArgumentError, match="2 queries but 1 query embeddings"):
        index.search_many(["parse date", "read file"], [q], "semantic")
    with pytest.raises(SearchArgumentError, match="query 2 is empty"):
        index.search_many(["parse date", " "], [q, q], "semantic")
    with pytest.raises(SearchArgumentError, match="block_tokens must be an integer >= 1"):
        index.search_many(["parse date"], [q], "semantic", block_tokens=0)
    assert index.search_many([], [], "semantic") == []


@pytest.mark.parametrize("mode", ["semantic", "hybrid"])
def test_ragged_query_lengths(segmented, mode):
    """Queries of 1 to 40 tokens (a one-token query is a one-column product, which BLAS may
    round by another path) batched rank as one at a time."""
    index, embed = segmented
    rng = np.random.default_rng(0)
    queries = [" ".join(rng.choice(WORDS, 2)) for _ in range(12)]
    dim = embed(["x"])[0].shape[1]
    qs = []
    for n in [1, 2, 40, 1, 3, 17, 1, 5, 32, 2, 1, 9]:
        v = rng.standard_normal((n, dim)).astype(np.float32)
        qs.append(v / np.linalg.norm(v, axis=1, keepdims=True))
    for block in (None, 7):
        many = index.search_many(queries, qs, mode, 8, candidates=30, block_tokens=block)
        for query, q, got in zip(queries, qs, many, strict=True):
            assert_ranked_alike(got, *reference(index, query, q, mode, None, "interp", 30), 8)


# ------------------------------------------------------------------ BM25 of a batch together

LEXICAL = WORDS + ["the", "of", "a", "dates", "headers", "zzqx", "nosuchterm", "ValueError", "parse_date"]


def _bits(scores: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(scores, np.float32).view(np.uint32)  # -0.0 != 0.0, NaN == NaN


def per_query_bm25(index: Index, query: str) -> np.ndarray:
    """The reference: BM25 scores float32 [n_slots] of one query by one pass per term and
    segment, as `Index.bm25` computed them before BM25 was batched (`lexical`'s module doc)."""
    out = np.zeros(index.n_slots, np.float32)
    for term, qtf in lexical.query_weights(query):
        parts = []
        for seg, base in zip(index.segments, index.bases, strict=False):
            t = seg.bm25_vocab.get(term)
            if t is None:
                continue
            lo, hi = seg.bm25_indptr[t], seg.bm25_indptr[t + 1]
            docs, tf = np.asarray(seg.bm25_docs[lo:hi]), np.asarray(seg.bm25_tf[lo:hi], np.float32)
            if seg.deleted is not None:
                keep = ~seg.deleted[docs]
                docs, tf = docs[keep], tf[keep]
            parts.append((seg, base, docs, tf))
        df = sum(len(d) for _, _, d, _ in parts)
        if df == 0:
            continue
        w = np.float32(qtf * lexical.idf(index.n_docs, df))
        for seg, base, docs, tf in parts:
            out[docs + base] += lexical.contributions(w, tf, lexical.doc_norms(seg.doc_len[docs], index.avg_len))
    return out


def _stacked(index: Index, queries: list[str], block_cells: int) -> np.ndarray:
    blocks = list(index.bm25_blocks(queries, block_cells))
    assert [first for first, _ in blocks] == list(np.cumsum([0] + [len(b) for _, b in blocks])[:-1])
    return np.concatenate([b for _, b in blocks]) if blocks else np.zeros((0, index.n_slots), np.float32)


@settings(max_examples=40, deadline=None)
@given(picks=st.lists(st.lists(st.sampled_from(LEXICAL), max_size=9), max_size=12),
       block_cells=st.integers(1, 400))
def test_batched_bm25_equals_per_query_bm25(segmented, picks, block_cells):
    """Every row of `bm25_blocks` is the per-query reference of its query, bit for bit: repeated terms,
    stop words only, terms in no segment's vocabulary, empty queries, blocks of one row to all
    rows, over segments with tombstones."""
    index, _ = segmented
    queries = [" ".join(words) for words in picks]
    want = np.stack([per_query_bm25(index, q) for q in queries]) if queries else np.zeros((0, index.n_slots), np.float32)
    assert np.array_equal(_bits(_stacked(index, queries, block_cells)), _bits(want))


def test_batched_bm25_pinned_cases(segmented):
    index, _ = segmented
    queries = ["parse parse date parse", "", "the of a", "zzqx nosuchterm", "date parse", "parse date",
               "value result value token value", "Parse a token from the queues"]
    want = np.stack([per_query_bm25(index, q) for q in queries])
    assert want[1:4].max() == 0.0 and want[0].max() > 0 and want[6].max() > 0
    assert any(s.deleted is not None for s in index.segments)
    assert not want[:, [i for i in range(index.n_slots) if i not in set(index.live_ids)]].any()
    for cells in (1, index.n_slots, 3 * index.n_slots + 1, 1 << 21):
        assert np.array_equal(_bits(_stacked(index, queries, cells)), _bits(want))
    assert list(index.bm25_blocks([])) == []
    assert all(np.array_equal(_bits(index.bm25(q)), _bits(w)) for q, w in zip(queries, want, strict=True))


@pytest.mark.parametrize("pool_size", [1, 3, 64, 10_000])
def test_joined_pools_equal_per_query_bm25_top(segmented, monkeypatch, pool_size):
    """A hybrid pool is the semantic candidates joined with the positive documents among
    argpartition's top BM25_POOL of the query's dense per-query BM25 scores (ties at the
    boundary included: FakeEmbed's short documents share lengths and counts), as before BM25
    was batched."""
    index, _ = segmented
    monkeypatch.setattr(index_mod, "BM25_POOL", pool_size)
    rng = np.random.default_rng(pool_size)
    queries = [" ".join(rng.choice(WORDS, int(rng.integers(1, 5)))) for _ in range(30)] + ["the of a"]
    pools = [np.sort(rng.choice(index.live_ids, int(rng.integers(0, 12)), replace=False)) for _ in queries]
    joined, lex = index._join_bm25(queries, pools)
    k = min(pool_size, index.n_slots)
    for query, pool, got, got_lex in zip(queries, pools, joined, lex, strict=True):
        scores = per_query_bm25(index, query)
        top = np.argpartition(-scores, k - 1)[:k] if k < index.n_slots else np.arange(index.n_slots)
        want = np.union1d(pool, top[scores[top] > 0])
        assert np.array_equal(got, want) and np.array_equal(_bits(got_lex), _bits(scores[want]))
