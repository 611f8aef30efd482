"""lora.linear's GPU form (adds in GEMM epilogues: mx.addmm, the fused LoRA vjp) equals its CPU
form - values and every gradient - alone and inside whole T5 / BERT encoders; tolerances are
float32 rounding (1e-5 relative for one layer, 1e-4 for an encoder's LoRA gradients)."""

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlxcore.models import bert, t5
from mlxcore.train import lora
from mlxcore.train.tree import combine, flatten, partition, unflatten


@pytest.fixture
def fused(monkeypatch):
    """Call f() with lora.linear's GPU form on this CPU."""
    def run(f):
        monkeypatch.setattr(lora, "fuse_epilogues", lambda: True)
        try:
            return f()
        finally:
            monkeypatch.setattr(lora, "fuse_epilogues", lambda: False)
    return run


def _close(a, b, tol):
    np.testing.assert_allclose(np.array(a), np.array(b), rtol=tol, atol=tol)


@settings(max_examples=30, deadline=None)
@given(st.sampled_from([(5,), (2, 3), (2, 3, 4)]), st.integers(1, 9), st.integers(1, 9),
       st.booleans(), st.booleans(), st.booleans(), st.integers(0, 999))
def test_gpu_form_equals_cpu_form_values_and_gradients(lead, d_in, d_out, has_bias, has_lora,
                                                       has_residual, seed):
    k = mx.random.split(mx.random.key(seed), 6)
    layer = {"weight": mx.random.normal((d_out, d_in), key=k[0])}
    if has_bias:
        layer["bias"] = mx.random.normal((d_out,), key=k[1])
    if has_lora:
        layer |= {"lora_a": mx.random.normal((d_in, 2), key=k[2]),
                  "lora_b": mx.random.normal((2, d_out), key=k[3])}
    x = mx.random.normal((*lead, d_in), key=k[4])
    residual = mx.random.normal((*lead, d_out), key=k[5]) if has_residual else None
    weights = mx.random.normal((*lead, d_out), key=k[0])

    def loss(layer, x, residual):
        return (lora.linear(layer, x, 2.0, residual=residual) * weights).sum()

    argnums = (0, 1, 2) if has_residual else (0, 1)
    want = mx.value_and_grad(loss, argnums)(layer, x, residual)
    real = lora.fuse_epilogues
    try:
        lora.fuse_epilogues = lambda: True
        got = mx.value_and_grad(loss, argnums)(layer, x, residual)
        compiled = mx.compile(mx.value_and_grad(loss, argnums))(layer, x, residual)
        assert lora.linear(layer, x, 2.0, residual=residual).shape == (*lead, d_out)
    finally:
        lora.fuse_epilogues = real
    for other in (got, compiled):
        _close(other[0], want[0], 1e-5)
        for (path, g), (_, r) in zip(flatten(other[1]).items(), flatten(want[1]).items(), strict=True):
            assert g.shape == r.shape, path
            _close(g, r, 1e-4)


def _encoder_lora_grads(encode, params, ids, mask):
    lora_tree, frozen = partition(params, lora.is_lora_path)

    def loss(lora_tree):
        h = encode(combine(frozen, lora_tree), mx.array(ids), mx.array(mask))
        return (h * h).mean()

    return mx.value_and_grad(loss)(lora_tree)


def _with_lora(params, targets, seed):
    dims = lora.target_dims(params, targets)
    adapters = lora.init(mx.random.key(seed), dims, 4)
    # B = 0 would make every A gradient zero: give B values so both are compared
    adapters = {p: (mx.random.normal(v.shape, key=mx.random.key(seed + 1)) * 0.1 if p.endswith("lora_b") else v)
                for p, v in flatten(adapters).items()}
    return combine(params, unflatten(adapters))


@pytest.mark.parametrize("model", ["t5", "bert"])
def test_whole_encoder_gpu_form_equals_cpu_form(model, fused):
    rng = np.random.default_rng(0)
    if model == "t5":
        cfg = t5.T5Config(vocab_size=40, d_model=16, d_kv=4, d_ff=24, num_layers=2, num_heads=3)
        shapes, encode = t5.param_shapes(cfg), lambda p, i, m: t5.encode(p, i, m, cfg, 2.0)
        targets = ("q", "v", "o", "wo")
    else:
        cfg = bert.BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
                              intermediate_size=24)
        shapes, encode = bert.param_shapes(cfg), lambda p, i, m: bert.encode(p, i, m, cfg, 2.0)
        targets = ("query", "value", "output.dense")
    params = unflatten({k: mx.array(rng.normal(0, 0.3, s).astype(np.float32)) for k, s in shapes.items()})
    params = _with_lora(params, targets, 1)
    ids = rng.integers(0, 40, (3, 7)).astype(np.int32)
    mask = np.arange(7)[None, :] < np.array([7, 4, 2])[:, None]
    want = _encoder_lora_grads(encode, params, ids, mask)
    got = fused(lambda: _encoder_lora_grads(encode, params, ids, mask))
    _close(got[0], want[0], 1e-5)
    for (path, g), (_, r) in zip(flatten(got[1]).items(), flatten(want[1]).items(), strict=True):
        assert float(mx.abs(r).max()) > 0, path
        _close(g, r, 1e-4)
