"""lora.linear's GPU form (bias in the GEMM epilogue, mx.addmm) equals its CPU form."""

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlxcore import lora


@settings(max_examples=20, deadline=None)
@given(st.sampled_from([(5,), (2, 3), (2, 3, 4)]), st.integers(1, 9), st.integers(1, 9), st.integers(0, 999))
def test_addmm_form_equals_matmul_plus_bias(lead, d_in, d_out, seed):
    k = mx.random.split(mx.random.key(seed), 5)
    layer = {"weight": mx.random.normal((d_out, d_in), key=k[0]), "bias": mx.random.normal((d_out,), key=k[1]),
             "lora_a": mx.random.normal((d_in, 2), key=k[2]), "lora_b": mx.random.normal((2, d_out), key=k[3])}
    x = mx.random.normal((*lead, d_in), key=k[4])
    cpu = lora.linear(layer, x, 2.0)
    real = mx.default_device
    try:
        mx.default_device = lambda: "not the cpu"  # take the GPU branch on this CPU
        gpu = lora.linear(layer, x, 2.0)
    except (AttributeError, TypeError):
        pytest.skip("mlx.core.default_device cannot be patched")
    finally:
        mx.default_device = real
    assert gpu.shape == cpu.shape == (*lead, d_out)
    np.testing.assert_allclose(np.array(gpu), np.array(cpu), rtol=1e-5, atol=1e-5)
