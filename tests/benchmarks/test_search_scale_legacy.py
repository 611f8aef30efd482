"""benchmarks/search_scale.py's new-versus-legacy re-rank comparison on a tiny synthetic index."""

import json

import numpy as np

from benchmarks import search_scale as ss
from mlxio.search import build
from mlxio.search.index import Index

DIM = 32


def _unit(x):
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def _embed(texts, progress=None):
    """Seeded token vectors [3 + len(text) % 7, DIM] per text (float16, as the encoder's)."""
    out = []
    for text in texts:
        rng = np.random.default_rng(sum(map(ord, text)))
        out.append(_unit(rng.standard_normal((3 + len(text) % 7, DIM))).astype(np.float16))
    return out


def test_search_vs_legacy_times_both_and_they_agree(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"f{i}", "code": f"def f{i}(x):\n    return x + {i * 7}"}) + "\n"
                              for i in range(60)))
    build.update(corpus, tmp_path / "index", _embed, {"model": "fake", "max_doc_len": 16, "max_query_len": 8,
                                                      "dim": DIM})
    index = Index(tmp_path / "index")
    queries = [f"query {i}" for i in range(5)]
    vecs = [_unit(np.random.default_rng(i).standard_normal((4, DIM))) for i in range(5)]
    encoded = []
    runs = ss.search_vs_legacy(index, queries, vecs, encode=encoded.append)
    assert encoded == queries  # each query encoded once, in order
    for key in ("encode_ms", "search_ms", "legacy_ms", "search_cpu_ms", "legacy_cpu_ms", "ids", "legacy_ids"):
        assert len(runs[key]) == 5
    assert runs["ids"] == [[d for d, _ in index.search(t, v, "semantic")] for t, v in zip(queries, vecs, strict=True)]
    assert all(len(ids) == 10 for ids in runs["ids"])
    summary = ss.legacy_summary(runs)
    assert summary["queries"] == 5 and summary["top10_agree"] == 5 and summary["top10_disagree_queries"] == []
    assert summary["max_score_diff"] < 1e-5
    assert summary["p50_ms"] >= summary["p50_search_ms"] > 0 and summary["p95_legacy_ms"] >= summary["p50_legacy_ms"]
    assert summary["search_over_legacy_p50"] == summary["p50_search_ms"] / summary["p50_legacy_search_ms"]
    assert "p50_ms" not in ss.legacy_summary({**runs, "encode_ms": []})  # no encoding timed: search only


def test_legacy_summary_counts_queries_whose_top10_differ():
    runs = {"encode_ms": [1.0, 1.0, 1.0], "search_ms": [2.0, 4.0, 6.0], "legacy_ms": [4.0, 8.0, 12.0],
            "search_cpu_ms": [2.0] * 3, "legacy_cpu_ms": [4.0] * 3, "ids": [[1, 2], [3, 4], [5, 6]],
            "legacy_ids": [[1, 2], [4, 3], [5, 6]], "max_score_diff": [0.0, 1e-7, 0.0]}
    summary = ss.legacy_summary(runs)
    assert summary["top10_agree"] == 2 and summary["top10_disagree_queries"] == [1]  # order counts
    assert summary["search_over_legacy_p50"] == 0.5 and summary["p50_legacy_ms"] == 9.0
    assert summary["over_legacy_p50"] == 5.0 / 9.0 and summary["max_score_diff"] == 1e-7
