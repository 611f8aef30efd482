"""mlxcore.models.norm: the same values and gradients as MLX's fused norms, frozen weights or not."""

import mlx.core as mx
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from mlxcore.models import norm

shapes = st.tuples(st.integers(1, 3), st.integers(1, 5), st.sampled_from([4, 8, 33, 64]))


def _arrays(shape, seed):
    k = mx.random.split(mx.random.key(seed), 4)
    x = mx.random.normal(shape, key=k[0]) * 3 + 1
    w = mx.random.normal(shape[-1:], key=k[1])
    b = mx.random.normal(shape[-1:], key=k[2])
    g = mx.random.normal(shape, key=k[3])
    return x, w, b, g


def _close(a, b, tol=2e-5):
    np.testing.assert_allclose(np.array(a), np.array(b), rtol=tol, atol=tol)


@settings(max_examples=25, deadline=None)
@given(shapes, st.integers(0, 2**16), st.sampled_from([1e-12, 1e-6, 1e-5]))
def test_layer_norm_matches_fused_values_and_every_gradient(shape, seed, eps):
    x, w, b, g = _arrays(shape, seed)
    ref = lambda x, w, b: mx.fast.layer_norm(x, w, b, eps)  # noqa: E731
    ours = lambda x, w, b: norm.layer_norm(x, w, b, eps)  # noqa: E731
    _close(ours(x, w, b), ref(x, w, b))
    _, want = mx.vjp(ref, [x, w, b], [g])
    _, got = mx.vjp(ours, [x, w, b], [g])
    for a, r in zip(got, want, strict=True):
        _close(a, r, 1e-4)


@settings(max_examples=25, deadline=None)
@given(shapes, st.integers(0, 2**16), st.sampled_from([1e-6, 1e-5]))
def test_rms_norm_matches_fused_values_and_every_gradient(shape, seed, eps):
    x, w, _, g = _arrays(shape, seed)
    ref = lambda x, w: mx.fast.rms_norm(x, w, eps)  # noqa: E731
    ours = lambda x, w: norm.rms_norm(x, w, eps)  # noqa: E731
    _close(ours(x, w), ref(x, w))
    _, want = mx.vjp(ref, [x, w], [g])
    _, got = mx.vjp(ours, [x, w], [g])
    for a, r in zip(got, want, strict=True):
        _close(a, r, 1e-4)


def test_frozen_weights_compiled_and_checkpointed():
    """Gradient in x only (weights frozen, as in LoRA training), through mx.compile and
    mx.checkpoint: the same as the fused norm's."""
    x, w, b, _ = _arrays((2, 7, 32), 3)

    def loss(norm_fn):
        return lambda x: (mx.checkpoint(lambda x: norm_fn(x, w, b, 1e-12))(x) ** 2 * mx.arange(32)).sum()

    want = mx.grad(loss(mx.fast.layer_norm))(x)
    got = mx.compile(mx.grad(loss(norm.layer_norm)))(x)
    _close(got, want, 1e-4)


@settings(max_examples=25, deadline=None)
@given(shapes, st.integers(0, 2**16), st.sampled_from([1e-6, 1e-5]))
def test_rms_norm_residual_is_identity_plus_norm_with_summed_gradients(shape, seed, eps):
    """(h, rms_norm(h)): values exact, and h's gradient is the sum through both outputs."""
    x, w, _, g = _arrays(shape, seed)
    g_h = mx.random.normal(shape, key=mx.random.key(seed + 1))
    h, y = norm.rms_norm_residual(x, w, eps)
    _close(h, x, 0)
    _close(y, mx.fast.rms_norm(x, w, eps))
    _, want = mx.vjp(lambda x, w: (x, mx.fast.rms_norm(x, w, eps)), [x, w], [g_h, g])
    _, got = mx.vjp(lambda x, w: norm.rms_norm_residual(x, w, eps), [x, w], [g_h, g])
    for a, r in zip(got, want, strict=True):
        _close(a, r, 1e-4)
    # only the norm's output used: the residual's cotangent is zero
    only = mx.grad(lambda x: (norm.rms_norm_residual(x, w, eps)[1] * g).sum())(x)
    _close(only, mx.grad(lambda x: (mx.fast.rms_norm(x, w, eps) * g).sum())(x), 1e-4)
