"""mlxcore.kernels.ffn_cuda (CUDA build with the compiled mlxio.gpu.cuda_ext only) against the composition it
replaces, residual + maximum(x @ wi.T, 0) @ wo.T: values and every gradient (x, wi, wo, residual),
eager and compiled, within GEMM rounding (the fused GEMM may pick another cuBLASLt kernel: a
float32 reference of the same inputs bounds both), and the sign bits exactly. Plus the
extension's argument checks and `usable`."""

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlxcore.kernels import ffn_cuda
from mlxio.gpu import cuda_ext

pytestmark = pytest.mark.skipif(cuda_ext.load() is None, reason="needs the built mlxio.gpu.cuda_ext (CUDA)")

TOL = {mx.float32: 2e-3, mx.bfloat16: 3e-2}


def reference(x, wi, wo, residual):
    return residual + mx.maximum(x @ wi.T, 0) @ wo.T


def rel_err(got: mx.array, want: mx.array) -> float:
    got, want = (np.array(a.astype(mx.float32)) for a in (got, want))
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-6))


@settings(max_examples=20, deadline=None)
@given(st.sampled_from([1, 7, 64, 300]), st.sampled_from([64, 96]), st.sampled_from([128, 384]),
       st.sampled_from([mx.float32, mx.bfloat16]), st.booleans(), st.integers(0, 9999))
def test_fused_ffn_matches_composition(m, d, f, dtype, compiled, seed):
    rng = np.random.default_rng(seed)
    x, residual, g = (mx.array(rng.normal(size=(m, d)).astype(np.float32)) for _ in range(3))
    wi = mx.array((rng.normal(size=(f, d)) / np.sqrt(d)).astype(np.float32))
    wo = mx.array((rng.normal(size=(d, f)) / np.sqrt(f)).astype(np.float32))
    args32 = [x, wi, wo, residual]
    args = [a.astype(dtype) for a in args32]
    assert ffn_cuda.usable({"weight": args[1]}, {"weight": args[2]}, args[0])

    def grads(fn, args):
        def loss(*a):
            return (fn(*a).astype(mx.float32) * g).sum()
        return mx.value_and_grad(loss, argnums=(0, 1, 2, 3))(*args)

    fused = mx.compile(ffn_cuda.relu_ffn) if compiled else ffn_cuda.relu_ffn
    value, fused_grads = grads(fused, args)
    want_value, want_grads = grads(reference, [a.astype(mx.float32) for a in args])
    assert rel_err(value, want_value) < TOL[dtype]
    out = fused(*args)
    assert out.dtype == dtype and out.shape == (m, d)
    assert rel_err(out, reference(*[a.astype(mx.float32) for a in args])) < TOL[dtype]
    for got, want in zip(fused_grads, want_grads, strict=True):
        assert got.dtype == dtype
        assert rel_err(got, want) < TOL[dtype]


def test_relu_bits_are_the_sign_of_the_product():
    rng = np.random.default_rng(0)
    x = mx.array(rng.normal(size=(40, 32)).astype(np.float32))
    w = mx.array(rng.normal(size=(256, 32)).astype(np.float32))
    h, bits = cuda_ext.load().matmul_relu_aux(x, w)
    pre = np.array(x @ w.T)
    unpacked = np.unpackbits(np.array(bits), axis=1, bitorder="little")
    assert bits.shape == (40, 32) and bits.dtype == mx.uint8
    np.testing.assert_array_equal(unpacked.astype(bool), pre > 0)
    np.testing.assert_allclose(np.array(h), np.maximum(pre, 0), rtol=1e-5, atol=1e-5)


def test_argument_errors_name_the_problem():
    ext = cuda_ext.load()
    x = mx.zeros((4, 32))
    with pytest.raises(ValueError, match="multiple of 128"):
        ext.matmul_relu_aux(x, mx.zeros((100, 32)))
    with pytest.raises(ValueError, match="columns must match"):
        ext.matmul_relu_aux(x, mx.zeros((128, 16)))
    with pytest.raises(ValueError, match="share a dtype"):
        ext.matmul_relu_aux(x, mx.zeros((128, 32), mx.bfloat16))


def test_usable_only_for_plain_weights():
    x = mx.zeros((2, 3, 64), mx.bfloat16)
    wi, wo = {"weight": mx.zeros((256, 64), mx.bfloat16)}, {"weight": mx.zeros((64, 256), mx.bfloat16)}
    assert ffn_cuda.usable(wi, wo, x)
    assert not ffn_cuda.usable({**wi, "lora_a": mx.zeros((64, 8))}, wo, x)
    assert not ffn_cuda.usable(wi, wo, x, dropout=0.1)
    assert not ffn_cuda.usable(wi, wo, x.astype(mx.float32))
    assert not ffn_cuda.usable(wi, wo, x.astype(mx.float16))  # relu_cuda stores bfloat16 / float32
    assert not ffn_cuda.usable({"weight": mx.zeros((200, 64), mx.bfloat16)}, {"weight": mx.zeros((64, 200), mx.bfloat16)}, x)


def test_t5_base_shapes_queued_together():
    """A workspace-using GEMM (t5-base's FFN at 4,096 tokens), several queued in one eval."""
    rng = np.random.default_rng(1)
    x = mx.array(rng.normal(size=(4096, 768)).astype(np.float32)).astype(mx.bfloat16)
    wi = mx.array(rng.normal(size=(3072, 768)).astype(np.float32) / 28).astype(mx.bfloat16)
    wo = mx.array(rng.normal(size=(768, 3072)).astype(np.float32) / 55).astype(mx.bfloat16)
    outs = [mx.grad(lambda x: ffn_cuda.relu_ffn(x, wi, wo, x).astype(mx.float32).sum())(x + i) for i in range(3)]
    mx.eval(outs)
    want = mx.grad(lambda x: reference(x, wi, wo, x).sum())((x + 2).astype(mx.float32))
    assert rel_err(outs[2], want) < TOL[mx.bfloat16]
