"""The per-query search kernels (mlxio/search/scoring.py) against direct reference formulas."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from mlxio.search import scoring


def _lists(rng: np.random.Generator, k: int, n_docs: int) -> tuple[np.ndarray, np.ndarray]:
    """Random inverted lists: (indptr [k + 1], docs) with each list ascending and unique."""
    parts = [np.sort(rng.choice(n_docs, int(rng.integers(0, n_docs + 1)), replace=False)) for _ in range(k)]
    indptr = np.zeros(k + 1, np.int64)
    indptr[1:] = np.cumsum([len(p) for p in parts])
    return indptr, np.concatenate(parts).astype(np.int32)


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
    indptr, docs = _lists(rng, k, n_docs)
    nprobe = min(nprobe, k)
    probes = np.stack([rng.choice(k, nprobe, replace=False) for _ in range(n_q)])
    scores = rng.uniform(-1, 1, (n_q, nprobe)).astype(np.float32)
    if rng.random() < 0.3:  # ties between probes of one token
        scores[:, -1] = scores[:, 0]
    deleted = rng.random(n_docs) < 0.3 if with_deleted else None
    found, est = scoring.probe_estimate(indptr, docs, n_docs, probes, scores, deleted)
    want_found, want = _reference(indptr, docs, n_docs, probes, scores, deleted)
    np.testing.assert_array_equal(found, want_found)
    assert est.dtype == np.float32 and found.dtype == np.int64
    np.testing.assert_allclose(est, want, atol=2e-7)


def test_probe_estimate_with_no_postings():
    indptr = np.zeros(4, np.int64)
    found, est = scoring.probe_estimate(indptr, np.zeros(0, np.int32), 5, np.array([[0, 1]]), np.array([[0.5, 0.2]], np.float32))
    assert len(found) == 0 and len(est) == 0


@settings(max_examples=100, deadline=None)
@given(lengths=st.lists(st.integers(1, 50), min_size=0, max_size=60), limit=st.integers(1, 120))
def test_doc_chunks_cover_in_order_within_the_limit(lengths, limit):
    chunks = scoring.doc_chunks(np.array(lengths, np.int64), limit)
    assert [lo for lo, _ in chunks] == ([0] + [hi for _, hi in chunks[:-1]] if chunks else [])
    assert (chunks[-1][1] if chunks else 0) == len(lengths)
    for lo, hi in chunks:
        assert hi > lo and (hi - lo == 1 or sum(lengths[lo:hi]) <= limit)
        if hi < len(lengths):  # greedy: the next document would not have fitted
            assert sum(lengths[lo:hi + 1]) > limit


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n_docs=st.integers(1, 12), n_q=st.integers(1, 5), limit=st.integers(1, 40))
def test_chunked_maxsim_equals_whole(seed, n_docs, n_q, limit):
    """MaxSim over chunks of documents (scaled vectors + their norms) == per-document MaxSim of
    the normalised vectors in float64 (float32 rounding: rtol 1e-5, atol 1e-6)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 10, n_docs)
    vectors = rng.standard_normal((int(lengths.sum()), 8)).astype(np.float32)
    norms = np.linalg.norm(vectors, axis=1)
    q = rng.standard_normal((n_q, 8)).astype(np.float32)
    q_t = np.ascontiguousarray(q.T)
    starts = np.r_[0, np.cumsum(lengths)[:-1]]
    got = np.zeros(n_docs, np.float32)
    for lo, hi in scoring.doc_chunks(lengths, limit):
        base = starts[lo]
        views = [vectors[starts[d]:starts[d] + lengths[d]] for d in range(lo, hi)]
        got[lo:hi] = scoring.docs_maxsim(q_t, views, norms[base:base + lengths[lo:hi].sum()])
    want = [(q.astype(np.float64) @ (vectors[s:s + n] / norms[s:s + n, None]).T.astype(np.float64)).max(axis=1).mean()
            for s, n in zip(starts, lengths, strict=True)]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n_docs=st.integers(1, 30), n_q=st.integers(1, 32),
       dim=st.sampled_from([8, 64, 384]))
def test_docs_maxsim_bits_do_not_depend_on_the_neighbours(seed, n_docs, n_q, dim):
    """A document's score is the same bits scored alone, in any subset, in any order (what makes
    batched search equal one-at-a-time search), at shapes where BLAS changes kernels (one query
    token to 32, one document token to 300, dims up to 384)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 300, n_docs)
    docs = [rng.standard_normal((int(n), dim)).astype(np.float32) for n in lengths]
    norms = [np.linalg.norm(d, axis=1) for d in docs]
    q_t = np.ascontiguousarray(rng.standard_normal((n_q, dim)).astype(np.float32).T)
    alone = np.array([scoring.docs_maxsim(q_t, [d], n)[0] for d, n in zip(docs, norms, strict=True)])
    pick = rng.permutation(n_docs)[:int(rng.integers(1, n_docs + 1))]
    together = scoring.docs_maxsim(q_t, [docs[i] for i in pick], np.concatenate([norms[i] for i in pick]))
    np.testing.assert_array_equal(together, alone[pick])
    assert together.dtype == np.float32


def test_docs_maxsim_of_no_documents():
    assert scoring.docs_maxsim(np.zeros((4, 3), np.float32), [], np.zeros(0, np.float32)).shape == (0,)
