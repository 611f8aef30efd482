"""mlxcore.kernels.rows_cuda (CUDA build only) against MLX's indexing it replaces, table[ids]: values
exact, table gradients equal to rounding (repeated ids add up), negative ids from the end,
float32 and bfloat16, eager and compiled."""

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlxcore.kernels import cuda_jit, rows_cuda

pytestmark = pytest.mark.skipif(not cuda_jit.available(), reason="MLX's CUDA build with NVRTC only")


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 50), st.sampled_from([8, 16, 768]), st.sampled_from([(1,), (7,), (3, 5), (2, 3, 4)]),
       st.sampled_from([mx.float32, mx.bfloat16]), st.booleans(), st.integers(0, 9999))
def test_take_rows_matches_indexing(vocab, dim, shape, dtype, compiled, seed):
    rng = np.random.default_rng(seed)
    table = mx.array(rng.normal(size=(vocab, dim)).astype(np.float32)).astype(dtype)
    ids = mx.array(rng.integers(-vocab, vocab, shape).astype(np.int32))
    c = mx.array(rng.normal(size=(*shape, dim)).astype(np.float32))
    assert rows_cuda.usable(table, ids)
    take = mx.compile(rows_cuda.take_rows) if compiled else rows_cuda.take_rows
    np.testing.assert_array_equal(np.array(take(table, ids).astype(mx.float32)),
                                  np.array(table[ids].astype(mx.float32)))
    got, want = (mx.grad(lambda t, f=f: (f(t, ids).astype(mx.float32) * c).sum())(table)
                 for f in (rows_cuda.take_rows, lambda t, i: t[i]))
    tol = 1e-5 if dtype == mx.float32 else 3e-2
    np.testing.assert_allclose(np.array(got.astype(mx.float32)), np.array(want.astype(mx.float32)),
                               rtol=0, atol=tol * max(1.0, float(mx.abs(want).max())))


def test_usable_rules():
    ids = mx.array([0, 1], mx.int32)
    assert rows_cuda.usable(mx.zeros((4, 8), mx.bfloat16), ids)
    assert not rows_cuda.usable(mx.zeros((4, 12), mx.bfloat16), ids)  # 16 bytes do not divide a row
    assert not rows_cuda.usable(mx.zeros((4, 8), mx.bfloat16), mx.array([0.5]))  # float ids
    assert not rows_cuda.usable(mx.zeros((4, 8), mx.float16), ids)  # no float16 kernel
