"""lora.shared_input_linears (q, k, v as one GEMM over weights with their adapters merged, and
its own vjp) equals one `lora.linear` per layer in the plain CPU form: values and every
gradient (x, weights, adapters, biases), eager and under mx.compile. Tolerances: float32
rounding, 1e-5 relative for values and 1e-4 for gradients (the merged form sums in another
order); bfloat16 weights 2e-2 (bf16 keeps 8 bits)."""

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlxcore.train import lora, quant
from mlxcore.train.tree import flatten


def _close(a, b, tol):
    np.testing.assert_allclose(np.array(a.astype(mx.float32)), np.array(b.astype(mx.float32)),
                               rtol=tol, atol=tol)


def _layers(seed, d_in, d_outs, loras, has_bias, rank, dtype=mx.float32):
    keys = iter(mx.random.split(mx.random.key(seed), 4 * len(d_outs)))
    layers = []
    for d_out, has_lora in zip(d_outs, loras, strict=True):
        layer = {"weight": mx.random.normal((d_out, d_in), key=next(keys)).astype(dtype)}
        if has_lora:
            layer |= {"lora_a": mx.random.normal((d_in, rank), key=next(keys)),
                      "lora_b": mx.random.normal((rank, d_out), key=next(keys)) * 0.5}
        if has_bias:
            layer["bias"] = mx.random.normal((d_out,), key=next(keys)).astype(dtype)
        layers.append(layer)
    return layers


def _loss_fn(fused: bool, scale: float, weights: list[mx.array]):
    def loss(layers, x):
        ys = (lora.shared_input_linears(layers, x, scale) if fused
              else [lora.linear(layer, x, scale) for layer in layers])
        return sum((y.astype(mx.float32) * w).sum() for y, w in zip(ys, weights, strict=True))
    return loss


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([(5,), (2, 3), (2, 3, 4)]), st.integers(1, 9),
       st.lists(st.tuples(st.integers(1, 9), st.booleans()), min_size=1, max_size=3),
       st.booleans(), st.integers(1, 3), st.sampled_from([1.0, 2.0, 0.25]), st.integers(0, 999))
def test_equals_one_linear_per_layer(lead, d_in, outs, has_bias, rank, scale, seed):
    d_outs, loras = [d for d, _ in outs], [has_lora for _, has_lora in outs]
    layers = _layers(seed, d_in, d_outs, loras, has_bias, rank)
    k = mx.random.split(mx.random.key(seed + 1), 1 + len(d_outs))
    x = mx.random.normal((*lead, d_in), key=k[0])
    weights = [mx.random.normal((*lead, d), key=kk) for d, kk in zip(d_outs, k[1:], strict=True)]

    want = mx.value_and_grad(_loss_fn(False, scale, weights), (0, 1))(layers, x)
    eager = mx.value_and_grad(_loss_fn(True, scale, weights), (0, 1))(layers, x)
    compiled = mx.compile(mx.value_and_grad(_loss_fn(True, scale, weights), (0, 1)))(layers, x)
    ys = lora.shared_input_linears(layers, x, scale)
    assert [y.shape for y in ys] == [(*lead, d) for d in d_outs]
    for got in (eager, compiled):
        _close(got[0], want[0], 1e-4)
        got_grads, want_grads = flatten({"l": got[1][0], "x": got[1][1]}), flatten({"l": want[1][0], "x": want[1][1]})
        assert got_grads.keys() == want_grads.keys()
        for path, g in got_grads.items():
            assert g.shape == want_grads[path].shape and g.dtype == want_grads[path].dtype, path
            _close(g, want_grads[path], 1e-4)


def test_bfloat16_weights_close_to_float32():
    """bf16 base weights with float32 adapters (the recipe's mixed precision): the merged weight
    is formed in float32 and rounded once; adapter gradients come back float32."""
    layers = _layers(3, 16, [16, 16, 16], [True, False, True], False, 4, mx.bfloat16)
    x = mx.random.normal((4, 7, 16), key=mx.random.key(9)).astype(mx.bfloat16)
    weights = [mx.random.normal((4, 7, 16), key=mx.random.key(10 + i)) for i in range(3)]
    want = mx.value_and_grad(_loss_fn(False, 2.0, weights))(layers, x)
    got = mx.value_and_grad(_loss_fn(True, 2.0, weights))(layers, x)
    assert abs(float(got[0]) - float(want[0])) <= 2e-2 * abs(float(want[0])) + 1.0
    for i in (0, 2):
        for name in lora.LORA_KEYS:
            g, w = got[1][i][name], want[1][i][name]
            assert g.dtype == mx.float32
            scale = float(mx.abs(w).max())
            assert float(mx.abs(g - w).max()) <= 2e-2 * scale, (i, name)


def test_fusable_rules(monkeypatch):
    monkeypatch.setattr(lora, "fuse_epilogues", lambda: True)
    plain = _layers(0, 8, [8, 8], [True, False], True, 2)
    assert lora.fusable(plain, 0.0)
    assert not lora.fusable(plain, 0.1)  # dropout draws a mask per layer: not one GEMM
    assert not lora.fusable([plain[0], {"weight": plain[1]["weight"]}], 0.0)  # bias on one only
    assert not lora.fusable([plain[0], {**plain[1], "weight": plain[1]["weight"].astype(mx.bfloat16)}], 0.0)
    packed, _ = quant.quantize_tree({"q": {"weight": mx.random.normal((8, 64))}},
                                    (quant.parse_rule("*=4/64"),))
    assert not lora.fusable([packed["q"], {"weight": mx.random.normal((8, 64))}], 0.0)
    monkeypatch.setattr(lora, "fuse_epilogues", lambda: False)
    assert not lora.fusable(plain, 0.0)  # the CPU keeps one GEMM a layer


@pytest.mark.parametrize("dropout", [0.0, 0.2])
def test_quant_linears_falls_back_per_layer(monkeypatch, dropout):
    """quant.linears equals one quant.linear per layer whether or not it fuses (dropout: keys)."""
    monkeypatch.setattr(lora, "fuse_epilogues", lambda: True)
    layers = _layers(1, 8, [8, 4], [True, True], False, 2)
    x = mx.random.normal((3, 8), key=mx.random.key(2))
    keys = list(mx.random.split(mx.random.key(5), 2))
    got = quant.linears(layers, x, 2.0, dropout, keys)
    want = [quant.linear(layer, x, 2.0, dropout, key) for layer, key in zip(layers, keys, strict=True)]
    for g, w in zip(got, want, strict=True):
        _close(g, w, 1e-5)


@pytest.mark.parametrize("n, out_dim, in_dim", [(4096, 16, 16), (4100, 16, 16), (8192, 384, 130), (3000, 5, 7)])
def test_weight_grad_in_token_chunks_equals_one_gemm(n, out_dim, in_dim):
    """lora._weight_grad (a batch of token chunks, summed, where the GPU would be under-filled)
    equals g.T @ x to float32 rounding; 4100 and 3000 tokens take the one-GEMM form."""
    g = mx.random.normal((n, out_dim), key=mx.random.key(n))
    x = mx.random.normal((n, in_dim), key=mx.random.key(n + 1))
    want = g.T @ x
    got = lora._weight_grad(g, x)
    assert got.shape == (out_dim, in_dim)
    _close(got / float(mx.abs(want).max()), want / float(mx.abs(want).max()), 1e-5)
