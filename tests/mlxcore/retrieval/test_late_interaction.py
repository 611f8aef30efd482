"""Properties of MaxSim / XTR scoring and the contrastive losses, against NumPy references, and
of the multi-vector encoder head (projection + L2 normalisation)."""

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlxcore.models import t5
from mlxcore.retrieval.encoder import EncoderSpec, init_projection, token_embeddings
from mlxcore.retrieval.late_interaction import (
    contrastive_loss,
    info_nce,
    l2_normalize,
    margin_loss,
    maxsim,
    maxsim_paired,
    xtr_scores,
)
from mlxcore.train.tree import flatten, unflatten


def unit(rng, *shape):
    x = rng.normal(size=shape).astype(np.float32)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def masks(rng, batch, length):
    """[B, T] bool with 1..T real tokens per row, padding at random positions (not only the end)."""
    out = np.zeros((batch, length), bool)
    for row in range(batch):
        real = rng.choice(length, rng.integers(1, length + 1), replace=False)
        out[row, real] = True
    return out


@st.composite
def batches(draw):
    """(q, q_mask, d, d_mask) of unit vectors, Bd >= Bq (extra documents are hard negatives)."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    bq, extra = draw(st.integers(1, 4)), draw(st.integers(0, 3))
    tq, td, dim = draw(st.integers(1, 6)), draw(st.integers(1, 8)), draw(st.integers(1, 8))
    return (unit(rng, bq, tq, dim), masks(rng, bq, tq),
            unit(rng, bq + extra, td, dim), masks(rng, bq + extra, td))


def maxsim_ref(q, qm, d, dm):
    out = np.zeros((len(q), len(d)))
    for i in range(len(q)):
        for j in range(len(d)):
            sims = q[i][qm[i]] @ d[j][dm[j]].T
            out[i, j] = sims.max(1).mean()
    return out


def xtr_ref(q, qm, d, dm, k):
    """Loop version of XTR eq. 3: per query token, top-k over all real batch document tokens."""
    out = np.zeros((len(q), len(d)))
    doc_tokens = [(j, t) for j in range(len(d)) for t in np.flatnonzero(dm[j])]
    for i in range(len(q)):
        total, hits = np.zeros(len(d)), np.zeros(len(d))
        for s in np.flatnonzero(qm[i]):
            sims = np.array([q[i, s] @ d[j, t] for j, t in doc_tokens])
            cutoff = np.sort(sims)[::-1][min(k, len(sims)) - 1]
            for j in range(len(d)):
                kept = [sims[n] if sims[n] >= cutoff else 0.0
                        for n, (jj, _) in enumerate(doc_tokens) if jj == j]
                if any(sims[n] >= cutoff for n, (jj, _) in enumerate(doc_tokens) if jj == j):
                    total[j] += max(kept)
                    hits[j] += 1
        out[i] = total / np.maximum(hits, 1)
    return out


def info_nce_ref(scores, positives, temperature):
    logits = scores.astype(np.float64) / temperature
    top = logits.max(1, keepdims=True)
    lse = np.log(np.exp(logits - top).sum(1)) + top[:, 0]
    return np.mean(lse - logits[np.arange(len(scores)), positives])


def margin_ref(scores, positives, margin, hardest):
    losses = []
    for i, p in enumerate(positives):
        negs = np.delete(scores[i], p)
        hinge = np.maximum(margin - scores[i, p] + negs, 0.0)
        losses.append(hinge.max() if hardest else hinge.mean())
    return np.mean(losses)


def mxs(*arrays):
    return [mx.array(a) for a in arrays]


@given(batches())
def test_maxsim_matches_numpy_and_stays_in_unit_range(batch):
    scores = np.array(maxsim(*mxs(*batch)))
    np.testing.assert_allclose(scores, maxsim_ref(*batch), atol=1e-5)
    assert np.all(np.abs(scores) <= 1 + 1e-5)
    q, qm, d, dm = batch
    paired = np.array(maxsim_paired(*mxs(q, qm, d[: len(q)], dm[: len(q)])))
    np.testing.assert_allclose(paired, np.diag(scores[:, : len(q)]), atol=1e-6)


@given(batches(), st.integers(0, 4), st.integers(0, 4), st.integers(1, 40))
def test_padding_changes_no_score(batch, pad_q, pad_d, k_train):
    q, qm, d, dm = batch
    rng = np.random.default_rng(0)

    def pad(x, m, n):  # n extra positions holding (unit) garbage, masked out
        garbage = unit(rng, x.shape[0], n, x.shape[2])
        return np.concatenate([x, garbage], 1), np.concatenate([m, np.zeros((len(m), n), bool)], 1)

    padded = (*pad(q, qm, pad_q), *pad(d, dm, pad_d))
    for fn in (maxsim, lambda *a: xtr_scores(*a, k_train)):
        np.testing.assert_allclose(np.array(fn(*mxs(*padded))), np.array(fn(*mxs(*batch))),
                                   atol=1e-6)


@given(batches(), st.randoms(use_true_random=False))
def test_permuting_the_batch_permutes_the_scores(batch, random):
    q, qm, d, dm = batch
    pq, pd = list(range(len(q))), list(range(len(d)))
    random.shuffle(pq)
    random.shuffle(pd)
    scores = np.array(maxsim(*mxs(*batch)))
    permuted = np.array(maxsim(*mxs(q[pq], qm[pq], d[pd], dm[pd])))
    np.testing.assert_allclose(permuted, scores[np.ix_(pq, pd)], atol=1e-6)


@given(batches(), st.integers(1, 12))
def test_xtr_matches_loop_reference(batch, k_train):
    scores = np.array(xtr_scores(*mxs(*batch), k_train))
    np.testing.assert_allclose(scores, xtr_ref(*batch, k_train), atol=1e-5)
    assert np.all(np.abs(scores) <= 1 + 1e-5)


@given(batches())
def test_xtr_with_every_token_retrieved_is_maxsim(batch):
    all_tokens = batch[2].shape[0] * batch[2].shape[1]
    np.testing.assert_allclose(np.array(xtr_scores(*mxs(*batch), all_tokens)),
                               np.array(maxsim(*mxs(*batch))), atol=1e-6)


@settings(max_examples=40)
@given(st.integers(1, 5), st.integers(0, 4), st.floats(0.01, 2.0), st.integers(0, 2**32 - 1),
       st.booleans())
def test_losses_match_numpy(bq, extra, temperature, seed, shuffled):
    rng = np.random.default_rng(seed)
    bd = bq + extra
    scores = rng.uniform(-1, 1, (bq, bd)).astype(np.float32)
    positives = rng.permutation(bd)[:bq] if shuffled else np.arange(bq)
    pos_arg = mx.array(positives) if shuffled else None
    got = info_nce(mx.array(scores), pos_arg, temperature).item()
    assert got == pytest.approx(info_nce_ref(scores, positives, temperature), rel=1e-5, abs=1e-5)
    if bd < 2:
        with pytest.raises(ValueError, match="negative"):
            margin_loss(mx.array(scores), 0.2)
        return
    for hardest in (True, False):
        got = margin_loss(mx.array(scores), 0.2, hardest, pos_arg).item()
        assert got == pytest.approx(margin_ref(scores, positives, 0.2, hardest), abs=1e-6)
    loss, parts = contrastive_loss(mx.array(scores), temperature, 0.2, 0.1, pos_arg)
    assert loss.item() == pytest.approx(parts["info_nce"].item() + 0.1 * parts["margin"].item(),
                                        rel=1e-6)


def test_fewer_documents_than_queries_needs_positives():
    with pytest.raises(ValueError, match="positives_index"):
        info_nce(mx.zeros((3, 2)))
    assert info_nce(mx.zeros((3, 2)), mx.array([0, 1, 1])).item() == pytest.approx(np.log(2))


def test_l2_normalize_is_torch_normalize():
    x = mx.array([[3.0, 4.0], [0.0, 0.0]])
    np.testing.assert_allclose(np.array(l2_normalize(x)), [[0.6, 0.8], [0.0, 0.0]])


def test_token_embeddings_project_normalise_and_compile():
    cfg = t5.T5Config(vocab_size=20, d_model=8, d_kv=4, d_ff=16, num_layers=1, num_heads=2)
    flat = {name: mx.random.normal(shape, key=mx.random.key(i)) * 0.3
            for i, (name, shape) in enumerate(t5.param_shapes(cfg).items())}
    params = unflatten(flat)
    params["projection"] = init_projection(mx.random.key(99), cfg.d_model, 5)
    spec = EncoderSpec(kind="t5", model=cfg)
    ids = mx.array(np.arange(12).reshape(2, 6).astype(np.int32))
    mask = mx.array(np.array([[1] * 6, [1] * 3 + [0] * 3], bool))
    eager = token_embeddings(params, ids, mask, spec)
    compiled = mx.compile(lambda p, i, m: token_embeddings(p, i, m, spec))(params, ids, mask)
    assert eager.shape == (2, 6, 5)
    np.testing.assert_allclose(np.linalg.norm(np.array(eager), axis=-1), 1.0, atol=1e-6)
    np.testing.assert_allclose(np.array(compiled), np.array(eager), atol=1e-6)
    with pytest.raises(TypeError, match="T5Config"):
        EncoderSpec(kind="t5", model=object())


def test_lora_on_q_v_merges_and_drops_out():
    from mlxcore.train import lora
    from mlxcore.train.tree import combine

    cfg = t5.T5Config(vocab_size=20, d_model=8, d_kv=4, d_ff=16, num_layers=2, num_heads=2)
    base = unflatten({name: mx.random.normal(shape, key=mx.random.key(i)) * 0.3
                      for i, (name, shape) in enumerate(t5.param_shapes(cfg).items())})
    dims = lora.target_dims(base, ("q", "v"))
    assert sorted(dims) == [f"encoder.block.{i}.layer.0.SelfAttention.{n}"
                            for i in range(2) for n in "qv"]
    adapters = lora.init(mx.random.key(1), dims, rank=2)
    adapters = unflatten({k: v + 0.1 if k.endswith("lora_b") else v
                          for k, v in flatten(adapters).items()})  # B != 0: adapters matter
    params = combine(base, adapters)
    ids = mx.array(np.arange(10).reshape(2, 5).astype(np.int32))
    mask = mx.ones((2, 5), mx.bool_)
    spec = EncoderSpec(kind="t5", model=cfg, lora_scale=2.0)
    merged, count = lora.merge(params, 2.0)
    assert count == 4
    with_lora = np.array(token_embeddings(params, ids, mask, spec))
    np.testing.assert_allclose(np.array(token_embeddings(merged, ids, mask, spec)), with_lora,
                               atol=1e-5)
    assert np.abs(with_lora - np.array(token_embeddings(base, ids, mask, spec))).max() > 1e-3
    dropping = EncoderSpec(kind="t5", model=cfg, lora_scale=2.0, lora_dropout=0.5)
    with pytest.raises(ValueError, match="PRNG key"):
        token_embeddings(params, ids, mask, dropping)
    a, b = (np.array(token_embeddings(params, ids, mask, dropping, mx.random.key(k)))
            for k in (0, 1))
    assert np.abs(a - b).max() > 1e-4


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 4), st.integers(1, 9), st.integers(0, 2**16))
def test_max_last_gradient_goes_to_the_first_maximum(rows, width, seed):
    """max_last: values = max(-1); gradient = cotangent at the first argmax, 0 elsewhere
    (PyTorch's max(dim) rule), also when a row is all ties."""
    from mlxcore.retrieval.late_interaction import max_last
    rng = np.random.default_rng(seed)
    s = mx.array(rng.integers(-2, 3, (rows, width)).astype(np.float32))  # many ties
    c = mx.array(rng.normal(size=rows).astype(np.float32))
    np.testing.assert_array_equal(np.array(max_last(s)), np.array(s.max(-1)))
    got = np.array(mx.grad(lambda s: (max_last(s) * c).sum())(s))
    want = np.zeros((rows, width), np.float32)
    want[np.arange(rows), np.argmax(np.array(s), -1)] = np.array(c)
    np.testing.assert_array_equal(got, want)
