"""Layer norm and RMS norm whose backward pass costs nothing for frozen weights.

`mx.fast.layer_norm(x, w, b)` runs one fused kernel forward, but its vjp primitive returns the
gradients of x, w and b together: on CUDA it writes a [rows, D] temporary for w's gradient and
runs two column reductions over every token, whether or not w and b are trained (MLX's
`LayerNormVJP::eval_gpu`; `RMSNormVJP` likewise). In LoRA training they never are, and those
reductions were most of the layer-norm backward's time (benchmarks/results/h100/retriever_minilm_b128*.json,
kernel profile).

These keep the fused forward and give x's gradient alone; the weight and bias gradients are
separate lazy expressions, computed only when something asks for them. On CUDA that gradient is
one kernel of ours (`mlxcore.kernels.norm_cuda`: one warp per row, x, g and w read once, dx written
once - MLX's weight-free vjp kernel took several times as long as PyTorch's: dev/norm_kernel.py,
dev/LOG.md); elsewhere it is the weight-free norm's own vjp (`mx.fast.layer_norm(x, None, None)`)
applied to g * w.

`rms_norm_residual` is the pre-norm block's `h -> (h, rms_norm(h))`: the gradient of h that
comes back through the residual and the one through the norm are summed inside the same
kernel, not by a separate [rows, D] add. Values and gradients equal the fused ones up to
rounding (tests/mlxcore/models/test_norm.py; tests/mlxcore/kernels/test_norm_cuda.py on a CUDA machine).
"""

from __future__ import annotations

from functools import cache

import mlx.core as mx

from mlxcore.kernels import dispatch


def _rows(x: mx.array) -> tuple[int, ...]:
    return tuple(range(x.ndim - 1))


@cache
def _layer_norm(eps: float):
    @mx.custom_function
    def f(x, w, b):
        return mx.fast.layer_norm(x, w, b, eps)

    @f.vjp
    def f_vjp(primals, cotangent, output):
        x, w, b = primals
        g = cotangent
        x_hat = mx.fast.layer_norm(x, None, None, eps)
        return (dispatch.norm_input_grad("layer", x, w, g, eps), (g * x_hat).sum(_rows(x)).astype(w.dtype),
                g.sum(_rows(x)).astype(b.dtype))

    return f


@cache
def _rms_norm(eps: float, residual: bool):
    @mx.custom_function
    def f(x, w):
        y = dispatch.rms_norm(x, w, eps)
        return (x, y) if residual else y

    @f.vjp
    def f_vjp(primals, cotangents, outputs):
        x, w = primals
        g_x, g = cotangents if residual else (None, cotangents)
        dw = (g * mx.fast.rms_norm(x, None, eps)).sum(_rows(x)).astype(w.dtype)
        return dispatch.norm_input_grad("rms", x, w, g, eps, g_x), dw

    return f


def layer_norm(x: mx.array, weight: mx.array, bias: mx.array, eps: float) -> mx.array:
    """LayerNorm over the last axis of x [..., D] with weight, bias [D] (= mx.fast.layer_norm)."""
    return _layer_norm(float(eps))(x, weight, bias)


def rms_norm(x: mx.array, weight: mx.array, eps: float) -> mx.array:
    """RMSNorm over the last axis of x [..., D] with weight [D] (= mx.fast.rms_norm)."""
    return _rms_norm(float(eps), False)(x, weight)


def rms_norm_residual(h: mx.array, weight: mx.array, eps: float) -> tuple[mx.array, mx.array]:
    """(h, rms_norm(h, weight)) for a pre-norm block `h + F(rms_norm(h))`, h [..., D]: the
    gradients of h through both outputs are summed in the norm's backward kernel."""
    return _rms_norm(float(eps), True)(h, weight)
