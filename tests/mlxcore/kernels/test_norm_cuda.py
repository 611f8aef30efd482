"""mlxcore.kernels.norm_cuda's kernel (CUDA build only) against the weight-free norm's own vjp: layer
and RMS norm, with and without the extra gradient, float32 (2e-5 relative to the largest
gradient) and bfloat16 (one bf16 rounding of the result: 1e-2), eager and compiled."""

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlxcore.kernels import cuda_jit, norm_cuda

pytestmark = pytest.mark.skipif(not cuda_jit.available(), reason="MLX's CUDA build with NVRTC only")


def _reference(kind, x, w, g, eps, extra):
    f = (lambda x: mx.fast.layer_norm(x, None, None, eps)) if kind == "layer" else (
        lambda x: mx.fast.rms_norm(x, None, eps))
    xf, gf, wf = (a.astype(mx.float32) for a in (x, g, w))
    _, (dx,) = mx.vjp(f, [xf], [gf * wf])
    return dx if extra is None else dx + extra.astype(mx.float32)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["layer", "rms"]), st.sampled_from([(1,), (3,), (2, 5), (4, 33)]),
       st.sampled_from([128, 384, 768, 1024]), st.booleans(), st.sampled_from([mx.float32, mx.bfloat16]),
       st.sampled_from([1e-12, 1e-6]), st.booleans(), st.integers(0, 999))
def test_kernel_matches_reference(kind, lead, d, with_extra, dtype, eps, compiled, seed):
    k = mx.random.split(mx.random.key(seed), 4)
    x = (mx.random.normal((*lead, d), key=k[0]) * 2 + 0.5).astype(dtype)
    w = mx.random.normal((d,), key=k[1]).astype(dtype)
    g = mx.random.normal((*lead, d), key=k[2]).astype(dtype)
    extra = mx.random.normal((*lead, d), key=k[3]).astype(dtype) if with_extra else None
    def kernel(x, w, g, e):
        return norm_cuda.norm_vjp(kind, x, w, g, eps, e if with_extra else None)

    got = (mx.compile(kernel) if compiled else kernel)(x, w, g, extra if with_extra else mx.array(0.0))
    want = _reference(kind, x, w, g, eps, extra)
    assert got.shape == x.shape and got.dtype == dtype
    scale = float(mx.abs(want).max())
    tol = 2e-5 if dtype == mx.float32 else 1e-2
    np.testing.assert_allclose(np.array(got.astype(mx.float32)), np.array(want), atol=tol * scale, rtol=tol)


@settings(max_examples=30, deadline=None)
@given(st.sampled_from([(1,), (3,), (4, 33)]), st.sampled_from([128, 384, 768, 1024]),
       st.sampled_from([mx.float32, mx.bfloat16]), st.sampled_from([1e-12, 1e-6]), st.booleans(), st.integers(0, 999))
def test_rms_forward_matches_mlx(lead, d, dtype, eps, compiled, seed):
    """norm_cuda.rms_norm against mx.fast.rms_norm: float32 rounding, or one bf16 rounding."""
    k = mx.random.split(mx.random.key(seed), 2)
    x = (mx.random.normal((*lead, d), key=k[0]) * 2 + 0.5).astype(dtype)
    w = mx.random.normal((d,), key=k[1]).astype(dtype)

    def f(x, w):
        return norm_cuda.rms_norm(x, w, eps)

    got = (mx.compile(f) if compiled else f)(x, w)
    want = mx.fast.rms_norm(x.astype(mx.float32), w.astype(mx.float32), eps)
    assert got.shape == x.shape and got.dtype == dtype
    tol = 1e-5 if dtype == mx.float32 else 1e-2
    np.testing.assert_allclose(np.array(got.astype(mx.float32)), np.array(want),
                               atol=tol * float(mx.abs(want).max()), rtol=tol)
