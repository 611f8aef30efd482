"""MaxSim in bfloat16 (the similarities in the embeddings' dtype, maxima to float32) stays within
the rounding of its inputs of the float32 scores: stated tolerance 4e-3 absolute on scores of
unit vectors (a bf16 similarity is off by at most ~2^-8; the mean over query tokens averages
the roundings)."""

import mlx.core as mx
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from mlxcore.retrieval.late_interaction import l2_normalize, maxsim


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 6), st.integers(1, 6), st.integers(1, 9), st.integers(1, 17), st.sampled_from([8, 32, 128]),
       st.integers(0, 2**16))
def test_bfloat16_maxsim_close_to_float32(bq, bd, tq, td, dim, seed):
    k = mx.random.split(mx.random.key(seed), 4)
    q = l2_normalize(mx.random.normal((bq, tq, dim), key=k[0])).astype(mx.bfloat16)
    d = l2_normalize(mx.random.normal((bd, td, dim), key=k[1])).astype(mx.bfloat16)
    qm = mx.random.bernoulli(0.8, (bq, tq), key=k[2])
    dm = mx.random.bernoulli(0.8, (bd, td), key=k[3])
    dm[:, 0] = True  # every document has a real token
    want = maxsim(q.astype(mx.float32), qm, d.astype(mx.float32), dm)
    got = maxsim(q, qm, d, dm)
    assert got.dtype == mx.float32
    np.testing.assert_allclose(np.array(got), np.array(want), atol=4e-3, rtol=0)
