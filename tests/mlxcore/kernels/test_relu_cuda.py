"""mlxcore.kernels.relu_cuda (CUDA build only) against the MLX ops it replaces, mx.maximum(x, 0.0) and its
vjp g * (x > 0): values and gradients bit-exact (zeros, -0, NaN and inf inputs included; a NaN
may come back with another payload, as from the GPU's own max), float32 and bfloat16, eager and
compiled, inside a larger function whose other terms also reach x."""

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlxcore.kernels import cuda_jit, relu_cuda
from mlxcore.models import t5

pytestmark = pytest.mark.skipif(not cuda_jit.available(), reason="MLX's CUDA build with NVRTC only")

SPECIAL = np.array([0.0, -0.0, np.nan, np.inf, -np.inf, 1e-3, -1e-3], np.float32)


def assert_same_bits(got: mx.array, want: mx.array) -> None:
    """Equal bit for bit (so -0 differs from +0), except that any NaN matches any NaN."""
    got, want = (np.array(a.astype(mx.float32)) for a in (got, want))
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    keep = ~np.isnan(want)
    np.testing.assert_array_equal(got[keep].view(np.uint32), want[keep].view(np.uint32))


@settings(max_examples=30, deadline=None)
@given(st.sampled_from([(8,), (3, 16), (2, 5, 24), (4, 3072)]), st.sampled_from([mx.float32, mx.bfloat16]),
       st.booleans(), st.integers(0, 9999))
def test_relu_matches_maximum(shape, dtype, compiled, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=shape).astype(np.float32)
    flat = x.reshape(-1)
    flat[rng.integers(0, flat.size, min(flat.size, 7))] = SPECIAL[: min(flat.size, 7)]
    x = mx.array(x).astype(dtype)
    c = mx.array(rng.normal(size=shape).astype(np.float32)).astype(dtype)
    assert relu_cuda.usable(x)

    def loss(f):
        # the relu's output scaled, plus x itself: two gradient paths that MLX sums
        return lambda x: (f(x) * c).astype(mx.float32).sum() + (x * c).astype(mx.float32).sum()

    ours, want = relu_cuda.relu, (lambda x: mx.maximum(x, 0.0))
    run = mx.compile if compiled else (lambda f: f)
    assert_same_bits(run(ours)(x), want(x))
    got, expected = (run(mx.grad(loss(f)))(x) for f in (ours, want))
    assert_same_bits(got, expected)


def test_t5_uses_it_and_usable_rules():
    x = mx.array([[1.0, -1.0] * 4], mx.bfloat16)
    assert relu_cuda.usable(x)
    assert not relu_cuda.usable(mx.zeros((2, 12), mx.bfloat16))  # 8 does not divide the last axis
    assert not relu_cuda.usable(mx.zeros((8,), mx.float16))  # no float16 kernel
    np.testing.assert_array_equal(np.array(t5.relu(x).astype(mx.float32)), [[1.0, 0.0] * 4])
