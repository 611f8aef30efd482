"""Retrieval ranking in NumPy: BM25, code-aware terms, ranking metrics, score fusion.

Everything here is a pure function of its arguments (no I/O). Score matrices are float
[n_queries, n_docs], higher = better; `positives` is int [n_queries], the index of each
query's single relevant document.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

# Identifier-ish runs; '_' and punctuation separate them, which splits snake_case.
_WORDS = re.compile(r"[A-Za-z0-9]+")
# camelCase / PascalCase / ACRONYMWord / digits: "parseHTTPResponse2" -> parse HTTP Response 2
_CAMEL = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")


def code_terms(text: str) -> list[str]:
    """BM25 terms of code or prose: identifiers split on snake_case and camelCase,
    lowercased, punctuation dropped. "def getHTTPResponse(url_path):" ->
    ["def", "get", "http", "response", "url", "path"]."""
    return [part.lower() for word in _WORDS.findall(text) for part in _CAMEL.findall(word)]


def stem(term: str) -> str:
    """Harman's S-stemmer (plurals only): "queries" -> "query", "classes" -> "class", "edges"
    -> "edge", "nodes" -> "node"; "status", "class", "is" stay."""
    if len(term) > 4 and term.endswith("ies") and not term.endswith(("eies", "aies")):
        return term[:-3] + "y"
    if len(term) > 3 and term.endswith("es") and term[-3] in "sxz" and not term.endswith(("aes", "ees", "oes")):
        return term[:-2]
    if len(term) > 3 and term.endswith("s") and not term.endswith(("us", "ss")):
        return term[:-1]
    return term


# English function words: in a docstring query they match comments and strings of unrelated code
# (dropping them lifted BM25's dev MRR@10 on held-out files and packages, with `stem`: dev/LOG.md;
# test queries never looked at)
STOPWORDS = frozenset("""a about above after again against all also am an and any are as at be because been before
being below between both but by can could did do does doing down during each few for from further had has have having
he her here hers herself him himself his how i if in into is it its itself me more most my myself no nor not now of on
only or other our ours out over own same she should so some such than that the their theirs them themselves then there
these they this those through to too under until up very was we were what when where whether which while who whom why
will with would you your yours""".split())


def doc_terms(text: str) -> list[str]:
    """BM25 terms of a document: `code_terms`, each `stem`med."""
    return [stem(t) for t in code_terms(text)]


def query_terms(text: str) -> list[str]:
    """BM25 terms of a natural-language query: `doc_terms` without English STOPWORDS ("Return
    the edges of a graph" -> ["return", "edge", "graph"])."""
    return [t for t in doc_terms(text) if t not in STOPWORDS]


class Bm25Index(NamedTuple):
    """Sparse BM25 statistics. vocab: term -> id; for term t its postings are
    doc_ids[indptr[t]:indptr[t+1]] (int32, ascending) with precomputed per-posting weights
    weights[...] = idf(t) * tf * (k1 + 1) / (tf + k1 * (1 - b + b * len / avg_len))."""

    vocab: dict[str, int]
    indptr: np.ndarray   # int64 [n_terms + 1]
    doc_ids: np.ndarray  # int32 [n_postings]
    weights: np.ndarray  # float32 [n_postings]
    n_docs: int


def bm25_index(docs_tokens: Sequence[Sequence[str]], k1: float = 1.2,
               b: float = 0.75) -> Bm25Index:
    """Okapi BM25 over tokenised documents; idf(t) = ln(1 + (N - df + 0.5) / (df + 0.5))
    (the non-negative form Lucene uses)."""
    vocab: dict[str, int] = {}
    terms, docs, tfs = [], [], []
    doc_len = np.zeros(len(docs_tokens), np.float64)
    for d, tokens in enumerate(docs_tokens):
        doc_len[d] = len(tokens)
        for term, tf in Counter(tokens).items():
            terms.append(vocab.setdefault(term, len(vocab)))
            docs.append(d)
            tfs.append(tf)
    terms_a = np.asarray(terms, np.int64)
    order = np.lexsort((np.asarray(docs, np.int64), terms_a))  # by term, then doc
    terms_a = terms_a[order]
    doc_ids = np.asarray(docs, np.int32)[order]
    tf = np.asarray(tfs, np.float64)[order]
    counts = np.bincount(terms_a, minlength=len(vocab))
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    df = counts.astype(np.float64)
    n = len(docs_tokens)
    idf = np.log1p((n - df + 0.5) / (df + 0.5))
    avg_len = doc_len.mean() if n and doc_len.mean() > 0 else 1.0
    norm = k1 * (1.0 - b + b * doc_len[doc_ids] / avg_len)
    weights = idf[terms_a] * tf * (k1 + 1.0) / (tf + norm)
    return Bm25Index(vocab=vocab, indptr=indptr, doc_ids=doc_ids,
                     weights=weights.astype(np.float32), n_docs=n)


def bm25_scores(index: Bm25Index, query_tokens: Sequence[str]) -> np.ndarray:
    """BM25 score of every document for one query: float32 [n_docs]. A term repeated in
    the query counts once per occurrence; unknown terms add nothing."""
    scores = np.zeros(index.n_docs, np.float32)
    for term, qtf in Counter(query_tokens).items():
        t = index.vocab.get(term)
        if t is not None:
            lo, hi = index.indptr[t], index.indptr[t + 1]
            scores[index.doc_ids[lo:hi]] += qtf * index.weights[lo:hi]  # doc ids unique
    return scores


def bm25_matrix(index: Bm25Index, queries_tokens: Sequence[Sequence[str]]) -> np.ndarray:
    """`bm25_scores` for many queries: float32 [n_queries, n_docs]."""
    out = np.zeros((len(queries_tokens), index.n_docs), np.float32)
    for i, q in enumerate(queries_tokens):
        out[i] = bm25_scores(index, q)
    return out


# ---------------------------------------------------------------------------- metrics


def positive_ranks(scores: np.ndarray, positives: np.ndarray) -> np.ndarray:
    """1-based rank of each query's positive: int64 [n_queries].

    Ties count against the positive (rank = 1 + number of other documents scoring >= it),
    so a constant scorer gets the worst rank, and the rank does not depend on document
    order. NaN scores rank last.
    """
    scores = np.nan_to_num(np.asarray(scores, np.float64), nan=-np.inf)
    positives = np.asarray(positives, np.int64)
    pos = scores[np.arange(len(scores)), positives][:, None]
    return (scores >= pos).sum(axis=1).astype(np.int64)  # counts the positive itself once


def ranking_metrics(scores: np.ndarray, positives: np.ndarray, k: int = 10) -> dict[str, float]:
    """Mean P@1, MRR@k, Recall@k and nDCG@k over queries with one relevant document each.

    With one relevant document, nDCG@k = 1 / log2(rank + 1) when rank <= k (the ideal DCG
    is 1), Recall@k = [rank <= k], MRR@k = 1 / rank when rank <= k.
    """
    ranks = positive_ranks(scores, positives).astype(np.float64)
    hit = ranks <= k
    return {
        "p@1": float(np.mean(ranks == 1)),
        f"mrr@{k}": float(np.mean(np.where(hit, 1.0 / ranks, 0.0))),
        f"recall@{k}": float(np.mean(hit)),
        f"ndcg@{k}": float(np.mean(np.where(hit, 1.0 / np.log2(ranks + 1.0), 0.0))),
    }


# ----------------------------------------------------------------------------- fusion


def row_ranks(scores: np.ndarray) -> np.ndarray:
    """Competition rank of every score within its row (1 = best; equal scores share the
    best rank of their group): int64, the shape of `scores` [n_queries, n_docs]."""
    scores = np.nan_to_num(np.asarray(scores, np.float64), nan=-np.inf)
    ranks = np.empty(scores.shape, np.int64)
    for i, row in enumerate(scores):  # a row loop beats one 2-D argsort here (measured)
        ascending = np.sort(row)
        ranks[i] = len(row) - np.searchsorted(ascending, row, side="right") + 1
    return ranks


def reciprocal_rank_fusion(score_matrices: Sequence[np.ndarray], k: float = 60.0) -> np.ndarray:
    """RRF: sum over systems of 1 / (k + rank): float64 [n_queries, n_docs]."""
    return sum(1.0 / (k + row_ranks(s)) for s in score_matrices)


def minmax_rows(scores: np.ndarray) -> np.ndarray:
    """Each row scaled to [0, 1] (a constant row becomes zeros)."""
    scores = np.asarray(scores, np.float64)
    lo = scores.min(axis=1, keepdims=True)
    span = scores.max(axis=1, keepdims=True) - lo
    return np.where(span > 0, (scores - lo) / np.where(span > 0, span, 1.0), 0.0)


def interpolate(dense: np.ndarray, sparse: np.ndarray, alpha: float) -> np.ndarray:
    """alpha * minmax(dense) + (1 - alpha) * minmax(sparse), per query row: float64."""
    return alpha * minmax_rows(dense) + (1.0 - alpha) * minmax_rows(sparse)


RRF_K = 60.0  # reciprocal-rank fusion constant (Cormack et al. 2009)
# candidate weights of the semantic side; 1.0 is semantic alone, so a hybrid whose dev queries show
# no gain from BM25 ranks as semantic does
ALPHAS = (0.3, 0.5, 0.7, 0.8, 0.9, 0.95, 0.97, 0.99, 1.0)
MIN_DEV_QUERIES = 50  # fewer dev queries than this: no weight is tuned, RRF is used
# the one-standard-error rule's multiple (`one_se_choice`); 0 = the weight with the best dev MRR@10
SE_MULTIPLE = 1.0
_TIE = 1e-12  # mean MRRs closer than this are equal (summation order must not decide a choice)


def bm25_text_matrix(queries: Sequence[str], docs: Sequence[str]) -> np.ndarray:
    """BM25 scores float [n_queries, n_docs] of raw texts (`query_terms` over `doc_terms`)."""
    return bm25_matrix(bm25_index([doc_terms(d) for d in docs]), [query_terms(q) for q in queries])


def hybrid(semantic: np.ndarray, bm25: np.ndarray, alpha: float | None = None) -> np.ndarray:
    """Fused [n_queries, n_docs]: `interpolate` at `alpha`, or RRF (k=60) when alpha is None."""
    if alpha is None:
        return reciprocal_rank_fusion([semantic, bm25], RRF_K)
    return interpolate(semantic, bm25, alpha)


def reciprocal_ranks(scores: np.ndarray, positives: np.ndarray, k: int = 10) -> np.ndarray:
    """Each query's reciprocal rank @k (1 / rank of its positive, 0 beyond k): float64 [n_queries];
    its mean is `ranking_metrics`' MRR@k."""
    ranks = positive_ranks(scores, positives).astype(np.float64)
    return np.where(ranks <= k, 1.0 / ranks, 0.0)


def dev_scores(rr: Sequence[np.ndarray]) -> tuple[np.ndarray, int, np.ndarray]:
    """(score [n_weights], best, se [n_weights]) of per-query dev results, as `one_se_choice`
    defines them: score = the mean over tasks of each task's mean; best = the top score's index
    (ties, to within rounding: the larger); se[w] = the standard error of score[best] - score[w] from the paired
    per-query differences, sqrt(sum_t var_t(rr_t[best] - rr_t[w]) / n_t) / n_tasks (se[best] = 0)."""
    rr = [np.asarray(r, np.float64) for r in rr]
    n_weights = rr[0].shape[0] if rr else 0
    if not rr or any(r.ndim != 2 or r.shape[0] != n_weights or r.shape[1] < 2 for r in rr) or n_weights < 1:
        raise ValueError(f"rr: [n_weights >= 1, n_queries >= 2] per task, got {[np.shape(r) for r in rr]}")
    score = np.mean([r.mean(axis=1) for r in rr], axis=0)
    best = int(np.flatnonzero(score >= score.max() - _TIE)[-1])
    var = np.sum([np.var(r[best] - r, axis=1, ddof=1) / r.shape[1] for r in rr], axis=0)
    return score, best, np.sqrt(var) / len(rr)


def one_se_choice(rr: Sequence[np.ndarray], se_multiple: float = SE_MULTIPLE) -> int:
    """Index of the weight the one-standard-error rule picks from per-query dev results.

    rr: one float array [n_weights, n_queries_t] per task: query q's reciprocal rank under weight
    w (weights in ascending order of the semantic share, the same for every task; the last is
    the most semantic). With `dev_scores`' score, best and se: the largest index w with
    score[best] - score[w] <= se_multiple * se[w] and score[w] >= score[-1], i.e. the most
    semantic weight whose dev MRR is within `se_multiple` standard errors of the best's and not
    below the last weight's ("prefer the more semantic model unless the dev queries show the
    gain"). se_multiple=0: the best weight. Needs >= 2 queries per task.
    """
    score, best, se = dev_scores(rr)
    ok = (score[best] - score <= se_multiple * se + _TIE) & (score >= score[-1] - _TIE)
    ok[best] = True
    return int(np.flatnonzero(ok)[-1])


def fusion_choice(devs: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]],
                  se_multiple: float = SE_MULTIPLE) -> dict | None:
    """The ALPHAS weight (1.0: semantic alone) the one-standard-error rule picks on dev queries,
    with what it was picked from: {"alpha", "best_alpha" (the top dev MRR@10), "se_multiple",
    "dev_queries" [per task], "dev_mrr@10" {"%g" weight: mean over tasks}, "se_vs_best" {...}}.

    devs: one (semantic [n_dev, n_docs], bm25 [n_dev, n_docs], positives [n_dev]) per task
    (e.g. dev queries of held-out files and of held-out packages: one weight that serves both,
    so that the weight an index stores is not tuned to one kind of code). Each task's per-query
    reciprocal ranks @10 under every weight go to `one_se_choice`: the most semantic weight whose
    mean dev MRR@10 (tasks weighing the same) is within `se_multiple` standard errors of the best
    weight's and not below semantic alone's. Tasks with fewer than MIN_DEV_QUERIES dev queries are
    left out; None (RRF) when none is left.
    """
    usable = [d for d in devs if len(d[2]) >= MIN_DEV_QUERIES]
    if not usable:
        return None
    rr = [np.stack([reciprocal_ranks(interpolate(s, b, a), p) for a in ALPHAS]) for s, b, p in usable]
    score, best, se = dev_scores(rr)
    return {"alpha": ALPHAS[one_se_choice(rr, se_multiple)], "best_alpha": ALPHAS[best], "se_multiple": se_multiple,
            "dev_queries": [len(d[2]) for d in usable],
            "dev_mrr@10": {f"{a:g}": round(float(v), 5) for a, v in zip(ALPHAS, score, strict=True)},
            "se_vs_best": {f"{a:g}": round(float(v), 5) for a, v in zip(ALPHAS, se, strict=True)}}


def choose_alpha(devs: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]],
                 se_multiple: float = SE_MULTIPLE) -> float | None:
    """`fusion_choice`'s weight alone (None: RRF, too few dev queries)."""
    choice = fusion_choice(devs, se_multiple)
    return None if choice is None else choice["alpha"]


def evaluate_modes(semantic: np.ndarray, bm25: np.ndarray, positives: np.ndarray, alpha: float | None) -> dict:
    """{"semantic", "hybrid", "hybrid_fusion", "hybrid_minus_semantic", "fusion": {variant: metrics}}
    on the test queries.

    hybrid = score interpolation at `alpha` (chosen on dev queries, never on these; "interp@1"
    ranks as semantic does), or RRF (k=60) when alpha is None. "fusion" lists every variant for
    comparison. Metrics: P@1, MRR@10, Recall@10, nDCG@10. hybrid_minus_semantic: `paired_difference`
    of the two modes' per-query reciprocal ranks @10 (is a hybrid loss more than noise?).
    """
    name = "rrf" if alpha is None else f"interp@{alpha:g}"
    fusion = {}
    for variant, weight in (("rrf", None), *((f"interp@{a:g}", a) for a in ALPHAS)):
        fused = hybrid(semantic, bm25, weight)  # one [n_queries, n_docs] matrix at a time
        fusion[variant] = ranking_metrics(fused, positives)
        if variant == name:
            hybrid_rr = reciprocal_ranks(fused, positives)
    return {"semantic": ranking_metrics(semantic, positives), "hybrid": fusion[name],
            "hybrid_fusion": name, "fusion": fusion,
            "hybrid_minus_semantic": paired_difference(hybrid_rr, reciprocal_ranks(semantic, positives))}


def paired_difference(a: np.ndarray, b: np.ndarray) -> dict:
    """{"mrr@10": mean(a - b), "se": its standard error (sample std of a - b, ddof=1, / sqrt(n)),
    "queries": n} of per-query values a, b [n] (e.g. reciprocal ranks of two modes on the same
    queries); se is 0.0 for a single query."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape or a.ndim != 1 or a.size == 0:
        raise ValueError(f"paired_difference: two equal 1-d arrays of >= 1 values, got {np.shape(a)} and {np.shape(b)}")
    d = a - b
    se = float(np.std(d, ddof=1) / np.sqrt(d.size)) if d.size > 1 else 0.0
    return {"mrr@10": float(d.mean()), "se": se, "queries": int(d.size)}
