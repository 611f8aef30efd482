"""mlxcore.kernels.bias_cuda (CUDA build only) against the MLX broadcast add it replaces: values bit-exact
(both add in float32 and round once), gradients equal to rounding, float32 and bfloat16, keys given per
query row [R, 1, L, L] or per key [R, 1, 1, L], eager and compiled."""

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlxcore.kernels import bias_cuda, cuda_jit

pytestmark = pytest.mark.skipif(not cuda_jit.available(), reason="MLX's CUDA build with NVRTC only")


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 5), st.integers(1, 4), st.sampled_from([4, 8, 32, 256]), st.booleans(),
       st.sampled_from([mx.float32, mx.bfloat16]), st.booleans(), st.integers(0, 9999))
def test_add_heads_matches_the_broadcast_add(rows, heads, length, per_key, dtype, compiled, seed):
    rng = np.random.default_rng(seed)
    pos = mx.array(rng.normal(size=(1, heads, length, length)).astype(np.float32)).astype(dtype)
    keys = mx.array(rng.normal(size=(rows, 1, 1 if per_key else length, length)).astype(np.float32)).astype(dtype)
    keys = mx.where(keys > 1.0, -1e9, keys).astype(dtype)  # padding-sized entries too
    assert bias_cuda.usable(pos, keys)
    c = mx.array(rng.normal(size=(rows, heads, length, length)).astype(np.float32))

    def run(f):
        return (lambda p, k: mx.compile(f)(p, k)) if compiled else f

    got = run(bias_cuda.add_heads)(pos, keys)
    want = pos + keys
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(np.array(got.astype(mx.float32)), np.array(want.astype(mx.float32)))
    grads = [mx.grad(lambda p, k, f=f: (f(p, k).astype(mx.float32) * c).sum(), (0, 1))(pos, keys)
             for f in (bias_cuda.add_heads, lambda p, k: p + k)]
    # the same sums over the broadcast axes, in another order where keys are per key (axis 1, then
    # 2): float32 rounding, or bfloat16's 8 bits over sums of up to 4 x 256 terms
    tol = 1e-5 if dtype == mx.float32 else 5e-2
    for g, w in zip(*grads, strict=True):
        g, w = np.array(g.astype(mx.float32)), np.array(w.astype(mx.float32))
        np.testing.assert_allclose(g, w, rtol=0, atol=tol * max(1.0, float(np.abs(w).max())))


def test_usable_rules():
    pos = mx.zeros((1, 2, 8, 8), mx.bfloat16)
    assert not bias_cuda.usable(pos, mx.zeros((3, 2, 8, 8), mx.bfloat16))  # keys with heads
    assert not bias_cuda.usable(pos, mx.zeros((3, 1, 8, 8), mx.float32))  # mixed dtypes
    assert not bias_cuda.usable(mx.zeros((1, 2, 3, 3), mx.bfloat16), mx.zeros((3, 1, 3, 3), mx.bfloat16))  # 8 ∤ 9
    assert bias_cuda.usable(pos, mx.zeros((3, 1, 1, 8), mx.bfloat16))
