"""mlxcore.kernels.maxsim_cuda (CUDA build only) against the MLX form it replaces, max_last(where(mask,
s, NEG)): values exact, gradients exact (both put the cotangent on the first maximum and none on
padding), with many ties, fully padded documents, float32 and bfloat16, eager and compiled."""

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlxcore.kernels import cuda_jit, maxsim_cuda
from mlxcore.retrieval.late_interaction import NEG, max_last

pytestmark = pytest.mark.skipif(not cuda_jit.available(), reason="MLX's CUDA build with NVRTC only")


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 3), st.integers(1, 5), st.integers(1, 4), st.sampled_from([1, 7, 32, 33, 256]),
       st.sampled_from([mx.float32, mx.bfloat16]), st.booleans(), st.integers(0, 9999))
def test_masked_max_matches_the_mlx_form(bq, tq, bd, td, dtype, compiled, seed):
    rng = np.random.default_rng(seed)
    s = mx.array(rng.integers(-3, 4, (bq, tq, bd, td)).astype(np.float32)).astype(dtype)  # ties
    mask = rng.random((bd, td)) < 0.7
    mask[0, :] = False  # a fully padded document
    mask = mx.array(mask)
    c = mx.array(rng.normal(size=(bq, tq, bd)).astype(np.float32)).astype(dtype)

    def ours(s):
        return (maxsim_cuda.masked_max(s, mask, NEG) * c).sum()

    def ref(s):
        return (max_last(mx.where(mask[None, None], s, NEG)) * c).sum()

    grad = (lambda f: mx.compile(mx.grad(f))) if compiled else mx.grad
    got_v = maxsim_cuda.masked_max(s, mask, NEG)
    want_v = max_last(mx.where(mask[None, None], s, NEG))
    np.testing.assert_array_equal(np.array(got_v.astype(mx.float32)), np.array(want_v.astype(mx.float32)))
    np.testing.assert_array_equal(np.array(grad(ours)(s).astype(mx.float32)),
                                  np.array(grad(ref)(s).astype(mx.float32)))
