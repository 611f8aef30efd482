"""BM25, code terms, ranking metrics and fusion against hand-computed cases and references."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from mlxcore.retrieval.ranking import (
    bm25_index,
    bm25_matrix,
    bm25_scores,
    code_terms,
    interpolate,
    minmax_rows,
    positive_ranks,
    ranking_metrics,
    reciprocal_rank_fusion,
    row_ranks,
)


@pytest.mark.parametrize(("text", "want"), [
    ("def getHTTPResponse(url_path):", ["def", "get", "http", "response", "url", "path"]),
    ("self.__max_len2 += x", ["self", "max", "len", "2", "x"]),
    ("Return the XMLParser's state!", ["return", "the", "xml", "parser", "s", "state"]),
    ("snake_case_name CamelCase", ["snake", "case", "name", "camel", "case"]),
    ("   ;;; -> ", []),
])
def test_code_terms(text, want):
    assert code_terms(text) == want


SCORES = np.array([[0.9, 0.1, 0.5, 0.3],
                   [0.2, 0.8, 0.9, 0.1],
                   [0.1, 0.2, 0.3, 0.4]])
POSITIVES = np.array([0, 1, 0])  # ranks 1, 2, 4


def test_metrics_hand_computed():
    assert positive_ranks(SCORES, POSITIVES).tolist() == [1, 2, 4]
    got = ranking_metrics(SCORES, POSITIVES, k=10)
    assert got["p@1"] == pytest.approx(1 / 3)
    assert got["mrr@10"] == pytest.approx((1 + 1 / 2 + 1 / 4) / 3)
    assert got["recall@10"] == pytest.approx(1.0)
    assert got["ndcg@10"] == pytest.approx((1 + 1 / math.log2(3) + 1 / math.log2(5)) / 3)
    at3 = ranking_metrics(SCORES, POSITIVES, k=3)
    assert at3["mrr@3"] == pytest.approx(1.5 / 3)
    assert at3["recall@3"] == pytest.approx(2 / 3)
    assert at3["ndcg@3"] == pytest.approx((1 + 1 / math.log2(3)) / 3)


def test_ties_and_nan_count_against_the_positive():
    assert positive_ranks(np.ones((1, 5)), np.array([2])).tolist() == [5]
    assert positive_ranks(np.array([[1.0, 2.0, 2.0]]), np.array([1])).tolist() == [2]
    assert positive_ranks(np.array([[np.nan, 0.5, -1.0]]), np.array([0])).tolist() == [3]


@st.composite
def score_case(draw):
    nq = draw(st.integers(1, 6))
    nd = draw(st.integers(1, 30))
    # few distinct values, so ties are common
    scores = draw(hnp.arrays(np.float32, (nq, nd),
                             elements=st.sampled_from([-1.0, 0.0, 0.25, 0.5, 1.0, 3.0])))
    positives = np.array(draw(st.lists(st.integers(0, nd - 1), min_size=nq, max_size=nq)))
    return scores, positives


@given(case=score_case(), seed=st.integers(0, 2**16))
def test_metric_properties(case, seed):
    scores, positives = case
    m = ranking_metrics(scores, positives)
    assert 0.0 <= m["p@1"] <= m["mrr@10"] <= 1.0
    assert m["p@1"] <= m["ndcg@10"] <= m["recall@10"] <= 1.0
    assert m["mrr@10"] <= m["ndcg@10"] + 1e-12  # 1/r <= 1/log2(r+1) for r >= 1
    perm = np.random.default_rng(seed).permutation(scores.shape[1])
    inverse = np.argsort(perm)
    shuffled = ranking_metrics(scores[:, perm], inverse[positives])
    assert shuffled == pytest.approx(m)


def reference_bm25(docs, query, k1=1.2, b=0.75):
    """Dense, textbook Okapi BM25 (Lucene idf), summing over query tokens."""
    vocab = sorted({t for d in docs for t in d} | set(query))
    col = {t: i for i, t in enumerate(vocab)}
    tf = np.zeros((len(docs), len(vocab)))
    for i, d in enumerate(docs):
        for t in d:
            tf[i, col[t]] += 1
    n = len(docs)
    df = (tf > 0).sum(axis=0)
    idf = np.log(1 + (n - df + 0.5) / (df + 0.5))
    dl = tf.sum(axis=1)
    avg = dl.mean() if dl.mean() > 0 else 1.0
    out = np.zeros(n)
    for t in query:
        f = tf[:, col[t]]
        out += idf[col[t]] * f * (k1 + 1) / (f + k1 * (1 - b + b * dl / avg))
    return out


TERMS = st.sampled_from(["get", "set", "path", "file", "read", "x", "open", "len"])


@given(docs=st.lists(st.lists(TERMS, max_size=12), min_size=1, max_size=15),
       queries=st.lists(st.lists(st.sampled_from(["get", "path", "x", "unknown"]), max_size=4),
                        min_size=1, max_size=4))
def test_bm25_matches_dense_reference(docs, queries):
    index = bm25_index(docs)
    matrix = bm25_matrix(index, queries)
    for q, row in zip(queries, matrix, strict=True):
        want = reference_bm25(docs, q)
        np.testing.assert_allclose(bm25_scores(index, q), want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(row, want, rtol=1e-5, atol=1e-6)


def test_bm25_prefers_rare_matching_terms():
    docs = [code_terms(t) for t in ["def read_file(path): return open(path).read()",
                                    "def write_file(path, data): open(path, 'w').write(data)",
                                    "def add(a, b): return a + b", ""]]
    scores = bm25_scores(bm25_index(docs), code_terms("read the file"))
    assert scores.argmax() == 0 and scores[2] == scores[3] == 0.0


def test_row_ranks_and_rrf_hand_cases():
    assert row_ranks(np.array([[5.0, 5.0, 1.0, np.nan]])).tolist() == [[1, 1, 3, 4]]
    s1 = np.array([[3.0, 2.0, 1.0]])  # ranks 1, 2, 3
    s2 = np.array([[1.0, 3.0, 2.0]])  # ranks 3, 1, 2
    fused = reciprocal_rank_fusion([s1, s2], k=60)
    want = [[1 / 61 + 1 / 63, 1 / 62 + 1 / 61, 1 / 63 + 1 / 62]]
    np.testing.assert_allclose(fused, want)
    assert fused.argmax() == 1
    np.testing.assert_allclose(reciprocal_rank_fusion([s1], k=0), [[1, 1 / 2, 1 / 3]])


def test_interpolation_hand_cases():
    dense = np.array([[0.0, 5.0, 10.0], [1.0, 1.0, 1.0]])
    sparse = np.array([[2.0, 2.0, 2.0], [0.0, 4.0, 2.0]])
    np.testing.assert_allclose(minmax_rows(dense), [[0, 0.5, 1], [0, 0, 0]])
    np.testing.assert_allclose(interpolate(dense, sparse, 0.3),
                               [[0, 0.15, 0.3], [0, 0.7, 0.35]])
    np.testing.assert_allclose(interpolate(dense, sparse, 1.0), minmax_rows(dense))


def test_stem_and_query_terms():
    from mlxcore.retrieval.ranking import doc_terms, query_terms, stem

    assert [stem(w) for w in ("queries", "classes", "edges", "nodes", "status", "class", "is", "boxes")] == [
        "query", "class", "edge", "node", "status", "class", "is", "box"]
    assert query_terms("Return the edges of a graph.") == ["return", "edge", "graph"]
    assert doc_terms("def get_edges(self): return self.edges") == ["def", "get", "edge", "self", "return", "self", "edge"]


def test_choose_alpha_over_tasks():
    from mlxcore.retrieval.ranking import ALPHAS, MIN_DEV_QUERIES, choose_alpha

    n = MIN_DEV_QUERIES
    pos = np.zeros(n, np.int64)
    # task A: semantic puts the positive second, BM25 first -> lower alphas rank it first
    sem_a = np.tile([0.9, 1.0, 0.0], (n, 1))
    bm_a = np.tile([10.0, 0.0, 5.0], (n, 1))
    # task B: semantic right, BM25 wrong -> only alphas near 1 keep it first
    sem_b = np.tile([1.0, 0.95, 0.0], (n, 1))
    bm_b = np.tile([0.0, 10.0, 0.0], (n, 1))
    alone_a, alone_b = choose_alpha([(sem_a, bm_a, pos)]), choose_alpha([(sem_b, bm_b, pos)])
    assert ALPHAS[-1] == 1.0  # semantic alone is a candidate
    assert alone_a < alone_b and alone_b == 1.0  # BM25 gains nothing on B: semantic alone
    both = choose_alpha([(sem_a, bm_a, pos), (sem_b, bm_b, pos)])
    mrr = lambda a, s, b: ranking_metrics(interpolate(s, b, a), pos)["mrr@10"]  # noqa: E731
    best = max(mrr(a, sem_a, bm_a) + mrr(a, sem_b, bm_b) for a in ALPHAS)
    # every query alike: no spread, so the rule keeps the best weight (the most semantic of ties)
    assert mrr(both, sem_a, bm_a) + mrr(both, sem_b, bm_b) == best
    assert both == max(a for a in ALPHAS if mrr(a, sem_a, bm_a) + mrr(a, sem_b, bm_b) == best)
    # a task with too few dev queries does not vote; none left: None (RRF)
    assert choose_alpha([(sem_a, bm_a, pos), (sem_b[:3], bm_b[:3], pos[:3])]) == alone_a
    assert choose_alpha([(sem_b[:3], bm_b[:3], pos[:3])]) is None


def test_choose_alpha_noisy_gain_stays_semantic():
    """A fused weight that rescues two dev queries in a hundred and loses one is ahead of
    semantic alone by 0.005 MRR, within one standard error (0.009): the rule keeps semantic;
    the plain best (se_multiple=0) takes the fusion."""
    from mlxcore.retrieval.ranking import choose_alpha

    n = 100
    pos = np.zeros(n, np.int64)
    sem = np.tile([1.0, 0.9, 0.0], (n, 1))
    bm = np.tile([0.0, 0.0, 10.0], (n, 1))
    sem[:2], bm[:2] = [0.9, 1.0, 0.0], [10.0, 0.0, 0.0]  # BM25 rescues the positive (weights < 0.909)
    sem[2], bm[2] = [1.0, 0.95, 0.0], [0.0, 10.0, 0.0]  # BM25 demotes it (weights < 0.952)
    assert choose_alpha([(sem, bm, pos)], se_multiple=0.0) < 1.0
    assert choose_alpha([(sem, bm, pos)]) == 1.0


def test_reciprocal_ranks_mean_is_mrr():
    from mlxcore.retrieval.ranking import reciprocal_ranks

    rng = np.random.default_rng(0)
    scores, pos = rng.normal(size=(40, 30)), rng.integers(0, 30, 40)
    rr = reciprocal_ranks(scores, pos)
    assert rr.shape == (40,) and math.isclose(rr.mean(), ranking_metrics(scores, pos)["mrr@10"])
    assert set(np.round(1 / rr[rr > 0]).astype(int)) <= set(range(1, 11))


def test_one_se_choice_hand_cases():
    from mlxcore.retrieval.ranking import one_se_choice

    # weight 0 wins every query: far beyond one standard error (zero spread) -> 0
    assert one_se_choice([np.array([[1.0, 1.0, 1.0], [0.5, 0.5, 0.5]])]) == 0
    # weight 0 ahead by 0.25 on average, but on one query of four: SE of the difference 0.25 -> 1
    rr = np.array([[1.0, 1.0, 1.0, 1.0], [0.0, 1.0, 1.0, 1.0]])
    assert one_se_choice([rr]) == 1 and one_se_choice([rr], se_multiple=0.0) == 0
    assert one_se_choice([rr], se_multiple=0.99) == 0  # 0.25 > 0.99 * 0.25
    # all weights alike: the last (most semantic)
    assert one_se_choice([np.full((4, 5), 0.5), np.full((4, 3), 0.2)]) == 3
    # within one SE of the best but below the last weight: not picked
    rr = np.array([[0.0, 0.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0], [0.0, 0.5, 0.5, 0.5], [0.5, 0.5, 0.5, 0.5]])
    assert one_se_choice([rr], se_multiple=10.0) == 3
    with pytest.raises(ValueError):
        one_se_choice([np.zeros((3, 1))])
    with pytest.raises(ValueError):
        one_se_choice([np.zeros((3, 4)), np.zeros((2, 4))])


_RR = st.sampled_from([0.0] + [1.0 / r for r in range(1, 11)])


@st.composite
def _dev_results(draw):
    """Per-task reciprocal ranks [n_weights, n_queries] with one n_weights for all tasks."""
    n_weights = draw(st.integers(1, 6))
    return [draw(hnp.arrays(np.float64, (n_weights, draw(st.integers(2, 12))), elements=_RR))
            for _ in range(draw(st.integers(1, 3)))]


def _score_and_se(rr, best):
    score = np.mean([r.mean(1) for r in rr], axis=0)
    se = np.sqrt(np.sum([np.var(r[best] - r, axis=1, ddof=1) / r.shape[1] for r in rr], axis=0)) / len(rr)
    return score, se


@given(_dev_results(), st.sampled_from([0.0, 0.5, 1.0, 2.0]))
def test_one_se_choice_properties(rr, c):
    from mlxcore.retrieval.ranking import one_se_choice

    pick = one_se_choice(rr, c)
    eps = 1e-12  # rounding of the means
    score = np.mean([r.mean(1) for r in rr], axis=0)
    best = max(w for w in range(len(score)) if score[w] >= score.max() - eps)  # ties: the larger
    _, se = _score_and_se(rr, best)
    assert 0 <= pick < len(score) and pick >= best  # never less semantic than the plain best
    assert score[pick] >= score[-1] - eps  # never worse on dev than the most semantic weight
    assert score[best] - score[pick] <= c * se[pick] + eps  # within c standard errors
    # the most semantic such weight: no later one qualifies
    assert not any(score[best] - score[w] <= c * se[w] + eps and score[w] >= score[-1] - eps
                   for w in range(pick + 1, len(score)))
    assert one_se_choice([r.copy() for r in rr], c) == pick  # deterministic
    assert one_se_choice([r[:, ::-1] for r in rr], c) == pick  # the order of queries does not matter
    assert one_se_choice(rr, c + 1.0) >= pick  # a wider band is never less semantic
    if c == 0.0:
        assert pick == best


@given(st.integers(0, 2**31 - 1), st.integers(0, 60))
def test_choose_alpha_properties(seed, n):
    from mlxcore.retrieval.ranking import ALPHAS, MIN_DEV_QUERIES, choose_alpha, reciprocal_ranks

    rng = np.random.default_rng(seed)
    sem, bm = rng.normal(size=(n, 12)), rng.exponential(size=(n, 12)) * (rng.random((n, 12)) < 0.5)
    pos = rng.integers(0, 12, n)
    alpha = choose_alpha([(sem, bm, pos)])
    if n < MIN_DEV_QUERIES:
        assert alpha is None
        return
    assert alpha in ALPHAS and alpha == choose_alpha([(sem, bm, pos)])
    mrr = {a: reciprocal_ranks(interpolate(sem, bm, a), pos).mean() for a in ALPHAS}
    assert mrr[alpha] >= mrr[1.0] - 1e-12  # never below semantic alone on the dev queries
    assert alpha >= choose_alpha([(sem, bm, pos)], se_multiple=0.0)


def test_paired_difference_hand_cases_and_errors():
    from mlxcore.retrieval.ranking import paired_difference

    out = paired_difference(np.array([1.0, 0.5, 0.0]), np.array([0.5, 0.5, 0.5]))
    assert out["queries"] == 3 and math.isclose(out["mrr@10"], 0.0)
    assert math.isclose(out["se"], 0.5 / math.sqrt(3))  # differences 0.5, 0, -0.5: std 0.5
    assert paired_difference(np.array([0.25]), np.array([1.0])) == {"mrr@10": -0.75, "se": 0.0, "queries": 1}
    for a, b in ((np.zeros(3), np.zeros(4)), (np.zeros(0), np.zeros(0)), (np.zeros((2, 2)), np.zeros((2, 2)))):
        with pytest.raises(ValueError, match="paired_difference"):
            paired_difference(a, b)


@given(st.integers(0, 2**31 - 1), st.integers(2, 40), st.sampled_from([None, 0.5, 0.9, 1.0]))
def test_evaluate_modes_hybrid_minus_semantic(seed, n, alpha):
    """The paired difference agrees with the two modes' MRR@10 and is exactly 0 at alpha 1.0
    (interp@1 ranks as semantic does)."""
    from mlxcore.retrieval.ranking import evaluate_modes

    rng = np.random.default_rng(seed)
    sem, bm = rng.normal(size=(n, 12)), rng.exponential(size=(n, 12)) * (rng.random((n, 12)) < 0.5)
    out = evaluate_modes(sem, bm, rng.integers(0, 12, n), alpha)
    diff = out["hybrid_minus_semantic"]
    assert diff["queries"] == n and diff["se"] >= 0
    assert math.isclose(diff["mrr@10"], out["hybrid"]["mrr@10"] - out["semantic"]["mrr@10"], abs_tol=1e-12)
    if alpha == 1.0:
        assert diff == {"mrr@10": 0.0, "se": 0.0, "queries": n}
