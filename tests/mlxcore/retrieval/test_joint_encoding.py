"""Queries, documents and negatives through one encoder pass (encoder.joint_token_embeddings, what
the contrastive loss does on CUDA) give the separate passes' embeddings on real tokens (float32:
1e-5), the same contrastive loss (1e-4: the temperature magnifies) and the same LoRA gradients of
a smooth function of the embeddings (1e-4), for BERT and T5, padded batches, with and without a
projection. The joint path is switched on here by standing in for the CUDA check."""

import types

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlxcore.models import bert, t5
from mlxcore.retrieval import encoder, objective
from mlxcore.retrieval.encoder import EncoderSpec
from mlxcore.train import lora
from mlxcore.train.tree import combine, flatten, partition, unflatten


def _spec(kind):
    if kind == "t5":
        cfg = t5.T5Config(vocab_size=40, d_model=16, d_kv=4, d_ff=24, num_layers=2, num_heads=3)
        return EncoderSpec(kind="t5", model=cfg, lora_scale=2.0), t5.param_shapes(cfg), ("q", "v")
    cfg = bert.BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
                          intermediate_size=24)
    return EncoderSpec(kind="bert", model=cfg, lora_scale=2.0), bert.param_shapes(cfg), ("query", "value")


def _params(kind, seed, projection):
    spec, shapes, targets = _spec(kind)
    rng = np.random.default_rng(seed)
    params = unflatten({k: mx.array(rng.normal(0, 0.3, s).astype(np.float32)) for k, s in shapes.items()})
    if projection:
        params["projection"] = {"weight": mx.array(rng.normal(0, 0.3, (8, 16)).astype(np.float32))}
    dims = lora.target_dims(params, targets)
    adapters = {k: mx.array(rng.normal(0, 0.1, v.shape).astype(np.float32))
                for k, v in flatten(lora.init(mx.random.key(seed), dims, 4)).items()}
    return spec, combine(params, unflatten(adapters))


def _batch(rng, n, length):
    ids = mx.array(rng.integers(0, 40, (n, length)).astype(np.int32))
    real = np.arange(length)[None, :] < rng.integers(1, length + 1, n)[:, None]
    return ids, mx.array(real), real


@pytest.fixture
def joint_on(monkeypatch):
    """encoder.joint_length as on CUDA; counts the encoder passes run."""
    monkeypatch.setattr(encoder, "dispatch", types.SimpleNamespace(on_cuda=lambda: True))
    passes = []
    for module in (t5, bert):
        blocks = module.blocks
        monkeypatch.setattr(module, "blocks", lambda *a, _b=blocks, **k: passes.append(1) or _b(*a, **k))
    return passes


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(["t5", "bert"]), st.sampled_from([(2, 4), (2, 8), (4, 8), (8, 8)]),
       st.booleans(), st.booleans(), st.integers(0, 999))
def test_joint_pass_equals_separate_passes(joint_on, kind, lengths, projection, negatives, seed):
    spec, params = _params(kind, seed, projection)
    rng = np.random.default_rng(seed)
    tq, td = lengths
    n = 8  # n * tq fills whole rows of td
    qi, qm, q_real = _batch(rng, n, tq)
    di, dm, d_real = _batch(rng, n, td)
    batch = {"query_ids": qi, "query_mask": qm, "doc_ids": di, "doc_mask": dm}
    if negatives:
        ni, nm, _ = _batch(rng, 2 * n, td)
        batch |= {"neg_ids": ni.reshape(n, 2, td), "neg_mask": nm.reshape(n, 2, td)}
    trained, frozen = partition(params, lora.is_lora_path)
    loss_fn = objective.contrastive_loss_fn(spec)

    weights = [mx.array(rng.normal(0, 1, (n, t, 8 if projection else 16)).astype(np.float32)) * m[..., None]
               for t, m in ((tq, qm), (td, dm))]

    def smooth(tr):
        """A linear function of the real tokens' embeddings: its gradient has no max to flip (the
        contrastive loss routes its gradient to each query token's best document token, and a
        1e-7 difference between GEMM shapes can change which one that is on a GPU)."""
        q, d = encoder.joint_token_embeddings(combine(frozen, tr), [(qi, qm), (di, dm)], spec)
        return (q * weights[0]).sum() + (d * weights[1]).sum()

    def run():
        q, d = encoder.joint_token_embeddings(params, [(qi, qm), (di, dm)], spec)
        loss = loss_fn(params, batch, mx.random.key(0))[0]
        return q, d, loss, mx.grad(smooth)(trained)

    joint_on.clear()
    q1, d1, loss1, g1 = run()
    assert len(joint_on) == 3  # one pass each: the embeddings, the loss, the gradient
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(encoder, "joint_length", lambda shapes: None)
        joint_on.clear()
        q0, d0, loss0, g0 = run()
        assert len(joint_on) == (7 if negatives else 6)
    np.testing.assert_allclose(np.array(q1)[q_real], np.array(q0)[q_real], atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(np.array(d1)[d_real], np.array(d0)[d_real], atol=1e-5, rtol=1e-5)
    # the loss divides scores by the temperature (0.05): 1e-5 on embeddings is ~2e-4 here on a GPU
    np.testing.assert_allclose(float(loss1), float(loss0), atol=1e-4, rtol=1e-4)
    for (path, a), (_, b) in zip(flatten(g1).items(), flatten(g0).items(), strict=True):
        np.testing.assert_allclose(np.array(a), np.array(b), atol=1e-4, rtol=1e-4, err_msg=path)


def test_joint_length_rules(joint_on):
    assert encoder.joint_length([(128, 32), (128, 256)]) == 256
    assert encoder.joint_length([(128, 32), (128, 64)]) == 128  # fused attention backward length
    assert encoder.joint_length([(128, 32), (128, 256), (256, 256)]) == 256
    assert encoder.joint_length([(128, 48), (128, 256)]) is None  # 48 does not divide 256
    assert encoder.joint_length([(3, 32), (128, 256)]) is None  # 96 tokens fill no row
    assert encoder.joint_length([(128, 256)]) is None  # one batch: nothing to join


def test_joint_length_is_off_without_cuda():
    assert encoder.joint_length([(128, 32), (128, 256)]) is None or encoder.dispatch.on_cuda()


def test_block_diagonal_bias_is_what_keeps_sequences_apart(joint_on, monkeypatch):
    """With the packed bias replaced by the unpacked one broadcast, packed queries see each
    other and the joint pass no longer equals separate passes: the test above can fail."""
    spec, params = _params("bert", 0, False)
    rng = np.random.default_rng(0)
    qi, qm, q_real = _batch(rng, 8, 2)
    di, dm, _ = _batch(rng, 8, 8)
    q1, _ = encoder.joint_token_embeddings(params, [(qi, qm), (di, dm)], spec)
    monkeypatch.setattr(t5, "packed_bias", lambda bias, p: mx.zeros((bias.shape[0] // p, bias.shape[1],
                                                                      p * bias.shape[3], p * bias.shape[3])))
    q2, _ = encoder.joint_token_embeddings(params, [(qi, qm), (di, dm)], spec)
    assert not np.allclose(np.array(q1)[q_real], np.array(q2)[q_real], atol=1e-3)
