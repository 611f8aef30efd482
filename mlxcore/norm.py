"""Layer norm and RMS norm whose backward pass costs nothing for frozen weights.

`mx.fast.layer_norm(x, w, b)` runs one fused kernel forward, but its vjp primitive returns the
gradients of x, w and b together: on CUDA it writes a [rows, D] temporary for w's gradient and
runs two column reductions over every token, whether or not w and b are trained (MLX's
`LayerNormVJP::eval_gpu`; `RMSNormVJP` likewise). In LoRA training they never are: on the H100
the MiniLM b128 step spent 3.2 ms of its 26 in layer-norm backward, 1.9 ms of it in those
reductions (benchmarks/results/h100/retriever_minilm_b128*.json, kernel profile).

These keep the fused forward and give the backward as the normalisation's own vjp without
weight (`mx.fast.layer_norm(x, None, None)`: no temporary, no reduction) applied to g * w; the
weight and bias gradients are separate lazy expressions, so they are computed only when
something asks for them. Values and gradients equal the fused ones up to rounding
(tests/test_norm.py).
"""

from __future__ import annotations

from functools import cache

import mlx.core as mx


@cache
def _layer_norm(eps: float):
    @mx.custom_function
    def f(x, w, b):
        return mx.fast.layer_norm(x, w, b, eps)

    @f.vjp
    def f_vjp(primals, cotangent, output):
        x, w, b = primals
        g = cotangent
        _, (dx,) = mx.vjp(lambda x: mx.fast.layer_norm(x, None, None, eps), [x], [g * w])
        rows = tuple(range(x.ndim - 1))
        x_hat = mx.fast.layer_norm(x, None, None, eps)
        return dx, (g * x_hat).sum(rows).astype(w.dtype), g.sum(rows).astype(b.dtype)

    return f


@cache
def _rms_norm(eps: float):
    @mx.custom_function
    def f(x, w):
        return mx.fast.rms_norm(x, w, eps)

    @f.vjp
    def f_vjp(primals, cotangent, output):
        x, w = primals
        g = cotangent
        _, (dx,) = mx.vjp(lambda x: mx.fast.rms_norm(x, None, eps), [x], [g * w])
        rows = tuple(range(x.ndim - 1))
        return dx, (g * mx.fast.rms_norm(x, None, eps)).sum(rows).astype(w.dtype)

    return f


def layer_norm(x: mx.array, weight: mx.array, bias: mx.array, eps: float) -> mx.array:
    """LayerNorm over the last axis of x [..., D] with weight, bias [D] (= mx.fast.layer_norm)."""
    return _layer_norm(float(eps))(x, weight, bias)


def rms_norm(x: mx.array, weight: mx.array, eps: float) -> mx.array:
    """RMSNorm over the last axis of x [..., D] with weight [D] (= mx.fast.rms_norm)."""
    return _rms_norm(float(eps))(x, weight)
