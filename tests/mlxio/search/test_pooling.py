"""Token pooling (mlxio.search.pooling) against PyLate's hierarchical pooling."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mlxio.search.pooling import pool_tokens, pooled


def _unit_rows(seed: int, n: int, dim: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, dim))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@given(seed=st.integers(0, 2**31 - 1), n=st.integers(1, 40), dim=st.integers(4, 24), factor=st.integers(1, 4))
def test_shapes_units_and_the_kept_first_token(seed, n, dim, factor):
    x = _unit_rows(seed, n, dim).astype(np.float16)
    out = pool_tokens(x, factor)
    rest = n - 1
    want = n if factor == 1 or max(rest // factor, 1) >= rest else 1 + max(rest // factor, 1)
    assert out.dtype == np.float16 and out.shape == (want, dim)
    assert np.array_equal(out[0], x[0])
    np.testing.assert_allclose(np.linalg.norm(out.astype(np.float64), axis=1), 1.0, atol=2e-3)


def test_tight_groups_pool_to_their_directions():
    base = _unit_rows(0, 4, 16)
    rng = np.random.default_rng(1)
    groups = np.tile(base[[2, 0, 3, 1]], (3, 1)) + 0.01 * rng.standard_normal((12, 16))  # interleaved
    doc = np.concatenate([_unit_rows(2, 1, 16), groups / np.linalg.norm(groups, axis=1, keepdims=True)])
    out = pool_tokens(doc, 3)
    assert out.shape == (5, 16)
    np.testing.assert_allclose(np.abs(out[1:] @ base.T).max(axis=1), 1.0, atol=1e-3)  # one centre per group
    assert (out[1:] @ base.T).argmax(axis=1).tolist() == [2, 0, 3, 1]  # in the order of their first tokens


@pytest.mark.slow  # imports PyLate (sentence-transformers, torch): ~30 s on a shared 2-core box
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(3, 48), dim=st.integers(4, 24), factor=st.integers(2, 4))
def test_same_clusters_as_pylate(seed, n, dim, factor):
    torch = pytest.importorskip("torch")
    colbert = pytest.importorskip("pylate.models.colbert")
    x = _unit_rows(seed, n, dim)
    theirs = colbert.ColBERT.pool_embeddings_hierarchical(None, [torch.from_numpy(x)], pool_factor=factor,
                                                          protected_tokens=1)[0].numpy()
    theirs = theirs / np.linalg.norm(theirs, axis=1, keepdims=True)  # PyLate keeps the raw means
    ours = pool_tokens(x, factor)
    assert ours.shape == theirs.shape
    # the same cluster centres, in another order (PyLate's: fcluster's labels; ours: first token)
    np.testing.assert_allclose((ours @ theirs.T).max(axis=1), 1.0, atol=1e-9)
    np.testing.assert_allclose((theirs @ ours.T).max(axis=1), 1.0, atol=1e-9)


def test_pooled_embed_and_bad_factor():
    docs = [_unit_rows(3, 9, 8), _unit_rows(4, 2, 8)]

    def embed(texts, progress=None):
        return docs[:len(texts)]

    assert pooled(embed, 1) is embed
    got = pooled(embed, 2)(["a", "b"])
    assert [len(v) for v in got] == [5, 2]
    with pytest.raises(ValueError, match="pool factor"):
        pool_tokens(docs[0], 0)


def test_a_pooled_index_stores_fewer_tokens_and_a_new_factor_rebuilds(tmp_path):
    from mlxio.search import build
    from mlxio.search.index import Index
    from tests.mlxio.search.test_search_index import META, FakeEmbed, _write_sources

    src, idx = tmp_path / "src", tmp_path / "idx"
    _write_sources(src, n_files=3)
    build.update(src, idx, FakeEmbed(), META)
    whole = Index(idx).n_tokens
    report = build.update(src, idx, pooled(FakeEmbed(), 2), {**META, "pool_factor": 2})
    pooled_index = Index(idx)
    assert report.rebuilt_because and "pool_factor" in report.rebuilt_because  # vectors of another kind
    assert pooled_index.manifest["pool_factor"] == 2 and pooled_index.n_tokens < 0.6 * whole
    (src / "mod0.py").write_text("def brand_new(value):\n    total = encode(token, value)\n    return total\n")
    again = build.update(src, idx, pooled(FakeEmbed(), 2), {**META, "pool_factor": 2})
    assert again.rebuilt_because is None and again.embedded == 1  # same factor: an incremental update
