"""Batched search (`Index.search_many`, `code_search search --queries`) returns what one-at-a-time
search returns, bit for bit: the same documents in the same order with the same float scores,
in every mode, on a segmented index with tombstones, whatever the batch and block sizes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_search_index import META, FakeEmbed, _write_sources  # tests/ helpers

from mlxio.search import build
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
    assert many == one  # ids and float scores, exactly


def test_batches_split_at_batch_queries(segmented, monkeypatch):
    index, embed = segmented
    queries = [f"{a} {b}" for a in WORDS[:6] for b in WORDS[6:12]]
    qs = [v.astype(np.float32) for v in embed(queries)]
    whole = index.search_many(queries, qs, "hybrid")
    monkeypatch.setattr(index_mod, "BATCH_QUERIES", 7)
    assert index.search_many(queries, qs, "hybrid") == whole


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
    """Queries of 1 to 40 tokens (a one-token query is a one-column product, which BLAS would
    round differently unless padded) batched == one at a time."""
    index, embed = segmented
    rng = np.random.default_rng(0)
    queries = [" ".join(rng.choice(WORDS, 2)) for _ in range(12)]
    dim = embed(["x"])[0].shape[1]
    qs = []
    for n in [1, 2, 40, 1, 3, 17, 1, 5, 32, 2, 1, 9]:
        v = rng.standard_normal((n, dim)).astype(np.float32)
        qs.append(v / np.linalg.norm(v, axis=1, keepdims=True))
    one = [index.search(q, v, mode, 8, candidates=30) for q, v in zip(queries, qs, strict=True)]
    assert index.search_many(queries, qs, mode, 8, candidates=30) == one
    assert index.search_many(queries, qs, mode, 8, candidates=30, block_tokens=7) == one
