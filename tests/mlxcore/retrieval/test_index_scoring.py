"""The per-query search kernels (mlxcore/retrieval/index_scoring.py) against direct reference formulas."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlxcore.retrieval import index_scoring


def _lists(rng: np.random.Generator, k: int, n_docs: int) -> tuple[np.ndarray, np.ndarray]:
    """Random inverted lists: (indptr [k + 1], docs) with each list ascending and unique."""
    parts = [np.sort(rng.choice(n_docs, int(rng.integers(0, n_docs + 1)), replace=False)) for _ in range(k)]
    indptr = np.zeros(k + 1, np.int64)
    indptr[1:] = np.cumsum([len(p) for p in parts])
    return indptr, np.concatenate(parts).astype(np.int32)


def _probed(rng: np.random.Generator, k: int, n_docs: int, n_q: int, nprobe: int):
    """Random inverted lists and a query's probes: (indptr, docs, probes int [n_q, P], scores
    float32 [n_q, P]) with P = min(nprobe, k) distinct lists per token, ties between a token's
    probes in about a third of the draws."""
    indptr, docs = _lists(rng, k, n_docs)
    nprobe = min(nprobe, k)
    probes = np.stack([rng.choice(k, nprobe, replace=False) for _ in range(n_q)])
    scores = rng.uniform(-1, 1, (n_q, nprobe)).astype(np.float32)
    if rng.random() < 0.3:
        scores[:, -1] = scores[:, 0]
    return indptr, docs, probes, scores


def _reference(indptr, docs, n_docs, probes, probe_scores, deleted):
    """The estimate spelt out: a [tokens, documents] matrix of each token's best probe score."""
    floor = probe_scores.min(axis=1)
    best = np.repeat(floor[:, None], n_docs, axis=1).astype(np.float64)
    seen = np.zeros(n_docs, bool)
    for t in range(len(probes)):
        for p, score in zip(probes[t], probe_scores[t], strict=True):
            on = docs[indptr[p]:indptr[p + 1]]
            best[t, on] = np.maximum(best[t, on], score)
            seen[on] = True
    if deleted is not None:
        seen &= ~deleted
    found = np.flatnonzero(seen)
    return found, best[:, found].mean(axis=0)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), k=st.integers(1, 12), n_docs=st.integers(1, 40),
       n_q=st.integers(1, 6), nprobe=st.integers(1, 5), with_deleted=st.booleans())
def test_probe_estimate_matches_the_dense_reference(seed, k, n_docs, n_q, nprobe, with_deleted):
    rng = np.random.default_rng(seed)
    indptr, docs, probes, scores = _probed(rng, k, n_docs, n_q, nprobe)
    deleted = rng.random(n_docs) < 0.3 if with_deleted else None
    found, est = index_scoring.probe_estimate(indptr, docs, n_docs, probes, scores, deleted)
    want_found, want = _reference(indptr, docs, n_docs, probes, scores, deleted)
    np.testing.assert_array_equal(found, want_found)
    assert est.dtype == np.float32 and found.dtype == np.int64
    np.testing.assert_allclose(est, want, atol=2e-7)


def _assignment_loop(indptr, docs, n_docs, probes, probe_scores, deleted):
    """The kernel as it was before its gathered path, spelt out: one assignment per probed list,
    lists in ascending score so that the best wins, rows added in token order (the bits batched
    search was checked against)."""
    n_q = len(probes)
    scores = np.asarray(probe_scores, np.float32)
    floor = scores.min(axis=1)
    order = np.argsort(scores, axis=1, kind="stable")
    probes = np.take_along_axis(np.asarray(probes, np.int64), order, axis=1)
    excess = np.take_along_axis(scores - floor[:, None], order, axis=1).astype(np.float64)
    span = 2.0 ** np.ceil(np.log2(float(excess.max(initial=0.0)) * n_q + 1.0))
    total, row = np.zeros(n_docs, np.float64), np.zeros(n_docs, np.float64)
    for t in range(n_q):
        for p, value in zip(probes[t], excess[t] + span, strict=True):
            row[docs[indptr[p]:indptr[p + 1]]] = value
        total += row
        row.fill(0.0)
    if deleted is not None:
        total[deleted] = 0.0
    found = np.flatnonzero(total)
    reached = np.floor(total[found] / span)
    return found, ((total[found] - reached * span) / n_q + floor.mean(dtype=np.float64)).astype(np.float32)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), k=st.integers(1, 12), n_docs=st.integers(1, 40),
       n_q=st.integers(1, 6), nprobe=st.integers(1, 5), cells=st.sampled_from([1, 7, 40, 1 << 21]),
       gather_max=st.sampled_from([-1, 10, 1 << 30]))
def test_probe_estimate_is_the_assignment_loops_bits_in_any_chunking(seed, k, n_docs, n_q, nprobe, cells, gather_max):
    rng = np.random.default_rng(seed)
    indptr, docs, probes, scores = _probed(rng, k, n_docs, n_q, nprobe)
    deleted = rng.random(n_docs) < 0.2
    with pytest.MonkeyPatch.context() as patch:  # tokens in chunks of cells // n_docs (at least 1)
        patch.setattr(index_scoring, "PROBE_CELLS", cells)
        patch.setattr(index_scoring, "GATHER_MAX_POSTINGS", gather_max)  # -1: always the loop; 1 << 30: always gathered
        found, est = index_scoring.probe_estimate(indptr, docs, n_docs, probes, scores, deleted)
    want_found, want = _assignment_loop(indptr, docs, n_docs, probes, scores, deleted)
    np.testing.assert_array_equal(found, want_found)
    np.testing.assert_array_equal(est.view(np.uint32), want.view(np.uint32))


def test_probe_estimate_with_no_postings():
    indptr = np.zeros(4, np.int64)
    found, est = index_scoring.probe_estimate(indptr, np.zeros(0, np.int32), 5, np.array([[0, 1]]), np.array([[0.5, 0.2]], np.float32))
    assert len(found) == 0 and len(est) == 0


@settings(max_examples=100, deadline=None)
@given(lengths=st.lists(st.integers(1, 50), min_size=0, max_size=60), limit=st.integers(1, 120))
def test_doc_chunks_cover_in_order_within_the_limit(lengths, limit):
    chunks = index_scoring.doc_chunks(np.array(lengths, np.int64), limit)
    assert [lo for lo, _ in chunks] == ([0] + [hi for _, hi in chunks[:-1]] if chunks else [])
    assert (chunks[-1][1] if chunks else 0) == len(lengths)
    for lo, hi in chunks:
        assert hi > lo and (hi - lo == 1 or sum(lengths[lo:hi]) <= limit)
        if hi < len(lengths):  # greedy: the next document would not have fitted
            assert sum(lengths[lo:hi + 1]) > limit


def _runs_maxsim(vectors, norms, starts, lengths, q, limit, scratch=None):
    """One query's MaxSim of documents (rows starts[i]:starts[i] + lengths[i] of vectors) the
    way `Index.maxsim_many` scores a run: chunks of documents, one product each."""
    got = np.zeros(len(starts), np.float32)
    for lo, hi in index_scoring.doc_chunks(lengths, limit):
        a, b = int(starts[lo]), int(starts[hi - 1] + lengths[hi - 1])
        sims = index_scoring.product(vectors, a, b, q, scratch)
        maxima = index_scoring.doc_maxima(sims, norms[a:b], starts[lo:hi] - a)
        got[lo:hi] = index_scoring.token_means(maxima.ravel(), np.arange(hi - lo) * len(q), np.full(hi - lo, len(q)))
    return got


def _exact_maxsim(vectors, norms, starts, lengths, q) -> np.ndarray:
    """float64 MaxSim of each document against q, from the same vectors and norms."""
    q64 = q.astype(np.float64)
    return np.array([(q64 @ (vectors[s:s + n].astype(np.float64) / norms[s:s + n, None]).T).max(axis=1).mean()
                     for s, n in zip(starts, lengths, strict=True)])


def _tolerance(q: np.ndarray) -> float:
    return index_scoring.score_tolerance(q.shape[1], len(q), float(np.linalg.norm(q.astype(np.float64), axis=1).max()))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n_docs=st.integers(1, 12), n_q=st.integers(1, 5), limit=st.integers(1, 40))
def test_chunked_maxsim_equals_whole(seed, n_docs, n_q, limit):
    """MaxSim over chunks of documents (scaled vectors + their norms) == per-document MaxSim of
    the normalised vectors in float64, within `score_tolerance` (the float32 error bound)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 10, n_docs)
    vectors = rng.standard_normal((int(lengths.sum()), 8)).astype(np.float32)
    norms = np.linalg.norm(vectors, axis=1)
    q = rng.standard_normal((n_q, 8)).astype(np.float32)
    starts = np.r_[0, np.cumsum(lengths)[:-1]]
    got = _runs_maxsim(vectors, norms, starts, lengths, q, limit)
    np.testing.assert_allclose(got, _exact_maxsim(vectors, norms, starts, lengths, q), rtol=0, atol=_tolerance(q))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n_rows=st.integers(1, 300), n_cols=st.integers(1, 64),
       dim=st.sampled_from([8, 64, 384]))
def test_product_is_within_the_float32_bound_in_any_shape(seed, n_rows, n_cols, dim):
    """Every element of `product`, in a product of any rows and columns (one row, one column, a
    few, hundreds; dims up to 384), is within gamma_dim sum |a_i b_i| of the exact dot product:
    the bound any BLAS keeps, whatever order its kernel sums in."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((n_rows + 40, dim)).astype(np.float32)
    b = rng.standard_normal((n_cols + 200, dim)).astype(np.float32)
    lo = int(rng.integers(0, n_rows))
    hi = int(rng.integers(lo + 1, n_rows + 1))
    cols = np.ascontiguousarray(b[np.sort(rng.choice(len(b), n_cols, replace=False))])
    exact = a[lo:hi].astype(np.float64) @ cols.T.astype(np.float64)
    bound = index_scoring._gamma(dim) * (np.abs(a[lo:hi]).astype(np.float64) @ np.abs(cols).T.astype(np.float64))
    for scratch in (None, index_scoring.Scratch()):
        part = index_scoring.product(a, lo, hi, cols, scratch)
        assert part.shape == (hi - lo, n_cols) and part.dtype == np.float32
        assert (np.abs(part - exact) <= bound * (1 + 1e-9)).all()


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n_docs=st.integers(1, 30), n_q=st.integers(1, 32),
       dim=st.sampled_from([8, 64, 384]))
def test_run_maxsim_moves_within_the_tolerance_with_the_neighbours(seed, n_docs, n_q, dim):
    """A document's score scored alone and in a run of others, in any chunking, differs by at
    most `score_tolerance`, and each is within it of the exact score."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 300, n_docs)
    vectors = rng.standard_normal((int(lengths.sum()), dim)).astype(np.float32)
    norms = np.linalg.norm(vectors, axis=1)
    starts = np.r_[0, np.cumsum(lengths)[:-1]]
    q = rng.standard_normal((n_q, dim)).astype(np.float32)
    alone = np.array([_runs_maxsim(vectors[s:s + n], norms[s:s + n], np.zeros(1, np.int64), lengths[i:i + 1], q, 1)[0]
                      for i, (s, n) in enumerate(zip(starts, lengths, strict=True))])
    together = _runs_maxsim(vectors, norms, starts, lengths, q, int(rng.integers(1, 5000)), index_scoring.Scratch())
    assert together.dtype == np.float32
    tol = _tolerance(q)
    np.testing.assert_allclose(together, alone, rtol=0, atol=tol)
    np.testing.assert_allclose(together, _exact_maxsim(vectors, norms, starts, lengths, q), rtol=0, atol=tol)


def test_score_tolerance_is_the_float32_bound():
    """For 384 dimensions and 32 unit query tokens: about 2 x 386 roundings of 2^-24 (5e-5), well
    below the gaps that decide rankings, and growing with the dimension and the query's norm."""
    tol = index_scoring.score_tolerance(384, 32)
    assert 4.5e-5 < tol < 5.5e-5
    assert index_scoring.score_tolerance(128, 32) < tol < index_scoring.score_tolerance(768, 32)
    assert index_scoring.score_tolerance(384, 32, 2.0) == pytest.approx(2 * tol)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n_pairs=st.integers(0, 40))
def test_token_means_add_in_token_order(seed, n_pairs):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 33, n_pairs)
    starts = (np.cumsum(lengths) - lengths).astype(np.int64)
    best = rng.standard_normal(int(lengths.sum())).astype(np.float32)
    got = index_scoring.token_means(best, starts, lengths)
    want = []
    for s, n in zip(starts, lengths, strict=True):
        total = best[s]
        for t in range(1, n):
            total = np.float32(total + best[s + t])
        want.append(total / np.float32(n))
    np.testing.assert_array_equal(got, np.array(want, np.float32).reshape(-1))
    assert got.dtype == np.float32


@settings(max_examples=60, deadline=None)
@given(sets=st.lists(st.sampled_from([(0,), (1,), (0, 1), (0, 2), (1, 2, 3), (2,)]), min_size=0, max_size=12))
def test_query_runs_group_neighbours_wanted_by_the_same_queries(sets):
    first = np.r_[0, np.cumsum([len(q) for q in sets])].astype(np.int64)
    queries = np.array([i for q in sets for i in q], np.int64)
    runs = index_scoring.query_runs(first, queries)
    assert [i for a, b in runs for i in range(a, b)] == list(range(len(sets)))
    for a, b in runs:
        assert all(sets[i] == sets[a] for i in range(a, b))
    assert all(sets[b - 1] != sets[b] for _, b in runs[:-1])


def test_scratch_reuses_and_grows():
    scratch = index_scoring.Scratch()
    x = scratch.get("a", (4, 3))
    assert x.shape == (4, 3) and x.flags.c_contiguous
    assert np.shares_memory(scratch.get("a", (2, 5)), x)
    assert scratch.get("a", (10, 10)).shape == (10, 10) and scratch.get("b", (3,), np.intp).dtype == np.intp
