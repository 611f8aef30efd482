"""Sequences laid end to end with a block-diagonal bias (t5.packed_bias; what the encoders do on
CUDA so that attention's backward runs fused) give the unpacked encoders' hidden states on real
tokens and the same LoRA gradients (float32: 1e-5 / 1e-4), for BERT and T5, padded batches."""

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlxcore.kernels import cuda_jit
from mlxcore.models import bert, t5
from mlxcore.train import lora
from mlxcore.train.tree import combine, flatten, partition, unflatten


def _model(kind):
    if kind == "t5":
        cfg = t5.T5Config(vocab_size=40, d_model=16, d_kv=4, d_ff=24, num_layers=2, num_heads=3)
        return t5.param_shapes(cfg), (lambda p, i, m: t5.encode(p, i, m, cfg, 2.0)), ("q", "v")
    cfg = bert.BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
                          intermediate_size=24)
    return bert.param_shapes(cfg), (lambda p, i, m: bert.encode(p, i, m, cfg, 2.0)), ("query", "value")


@settings(max_examples=12, deadline=None)
@given(st.sampled_from(["t5", "bert"]), st.sampled_from([2, 4]), st.integers(1, 3), st.integers(2, 6),
       st.integers(0, 999))
def test_packed_encoder_equals_unpacked(kind, p, groups, length, seed):
    shapes, encode, targets = _model(kind)
    rng = np.random.default_rng(seed)
    params = unflatten({k: mx.array(rng.normal(0, 0.3, s).astype(np.float32)) for k, s in shapes.items()})
    adapters = {k: mx.array(rng.normal(0, 0.1, v.shape).astype(np.float32))
                for k, v in flatten(lora.init(mx.random.key(seed), lora.target_dims(params, targets), 4)).items()}
    params = combine(params, unflatten(adapters))
    batch = p * groups
    ids = mx.array(rng.integers(0, 40, (batch, length)).astype(np.int32))
    real = np.arange(length)[None, :] < rng.integers(1, length + 1, batch)[:, None]
    mask = mx.array(real)
    trained, frozen = partition(params, lora.is_lora_path)

    def run(factor):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(t5, "pack_factor", lambda b, t: factor)  # t5.pack_sequences serves both
            h = encode(params, ids, mask)
            grads = mx.grad(lambda tr: (encode(combine(frozen, tr), ids, mask) * mask[..., None]).square().sum())(trained)
            return h, grads

    (h1, g1), (hp, gp) = run(1), run(p)
    assert hp.shape == h1.shape == (batch, length, h1.shape[-1])
    np.testing.assert_allclose(np.array(hp)[real], np.array(h1)[real], atol=1e-5, rtol=1e-5)
    for (path, a), (_, b) in zip(flatten(gp).items(), flatten(g1).items(), strict=True):
        np.testing.assert_allclose(np.array(a), np.array(b), atol=1e-4, rtol=1e-4, err_msg=path)


def test_pack_factor_is_one_off_cuda_and_for_unfit_shapes():
    assert t5.pack_factor(128, 32) == (4 if cuda_jit.on_cuda() else 1)
    assert t5.pack_factor(128, 256) == 1 and t5.pack_factor(128, 48) == 1 and t5.pack_factor(6, 32) == 1
