"""The one place that picks, per call, one of our CUDA kernels or the MLX ops it replaces.

A kernel runs on MLX's CUDA build with a compiler registered (`cuda_jit`) and only for the
shapes and dtypes it was written for (each kernel module's `usable`); everywhere else, and
for every other input, the MLX ops below run, with the same values (tests/mlxcore/kernels
compare each pair). The models, the retrieval scores and the quantised layers call these
functions and never ask which path runs.
"""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx

from mlxcore.kernels import (
    bias_cuda,
    cuda_jit,
    ffn_cuda,
    maxsim_cuda,
    norm_cuda,
    relu_cuda,
    rows_cuda,
)


def on_cuda() -> bool:
    """True on MLX's CUDA build with a GPU as the default device."""
    return cuda_jit.on_cuda()


def take_rows(table: mx.array, ids: mx.array) -> mx.array:
    """Rows of `table` [V, D] for integer `ids` [...] -> [..., D] (`rows_cuda`: a row per block)."""
    if rows_cuda.usable(table, ids):
        return rows_cuda.take_rows(table, ids)
    return table[ids]


def relu(x: mx.array) -> mx.array:
    """max(x, 0) (`relu_cuda`: its backward reads a bitmask, not x)."""
    return relu_cuda.relu(x) if relu_cuda.usable(x) else mx.maximum(x, 0.0)


def add_heads(pos: mx.array, keys: mx.array) -> mx.array:
    """pos [1, H, L, L] + keys [R, 1, L, L] -> [R, H, L, L] (`bias_cuda`: one pass, head-major)."""
    return bias_cuda.add_heads(pos, keys) if bias_cuda.usable(pos, keys) else pos + keys


@mx.custom_function
def max_last(s: mx.array) -> mx.array:
    """s.max(-1), s [..., T] -> [...], whose gradient goes to the first maximum only (PyTorch's
    `max(dim)` rule) through an argmax: one read of s and one written gradient. MLX's own max
    vjp splits it among ties (equality mask, count, divide, select: four passes over the
    [Bq, Tq, Bd, Td] similarities). The MLX-ops path of `masked_max`."""
    return s.max(-1)


@max_last.vjp
def _max_last_vjp(s, cotangent, output):
    # (a one-input custom function gets its primal and cotangent as arrays, not tuples)
    first = mx.argmax(s, axis=-1, keepdims=True)
    hit = mx.arange(s.shape[-1], dtype=first.dtype) == first
    return mx.where(hit, cotangent[..., None], 0.0).astype(s.dtype)


def masked_max(sims: mx.array, d_mask: mx.array, neg: float) -> mx.array:
    """Each similarity row's maximum over real document tokens: sims [Bq, Tq, Bd, Td] (or any
    [..., Bd, Td]) with d_mask [Bd, Td] -> [..., Bd]; masked tokens count as `neg`; the gradient
    goes to the first maximum (`maxsim_cuda`: masking, max and argmax in one pass)."""
    if maxsim_cuda.usable(sims):
        return maxsim_cuda.masked_max(sims, d_mask, neg)
    return max_last(mx.where(d_mask.astype(mx.bool_)[None, None, :, :], sims, neg))


def norm_input_grad(kind: str, x: mx.array, w: mx.array, g: mx.array, eps: float,
                    extra: mx.array | None = None) -> mx.array:
    """d(norm(x) * w)/dx applied to g (+ extra, a second gradient of x), x, g [..., D], w [D];
    kind "layer" (layer norm without bias) or "rms" (`norm_cuda`: one warp a row)."""
    if norm_cuda.usable(x):
        return norm_cuda.norm_vjp(kind, x, w, g, eps, extra)
    if kind == "layer":
        _, (dx,) = mx.vjp(lambda x: mx.fast.layer_norm(x, None, None, eps), [x], [g * w])
    else:
        _, (dx,) = mx.vjp(lambda x: mx.fast.rms_norm(x, None, eps), [x], [g * w])
    return dx if extra is None else extra + dx


def rms_norm(x: mx.array, w: mx.array, eps: float) -> mx.array:
    """RMS norm of x [..., D] times w [D] in x's dtype (`norm_cuda` when w has x's dtype: ours
    writes x's dtype, MLX's promotes x with w, so a weight of another dtype goes to MLX)."""
    if norm_cuda.usable(x) and w.dtype == x.dtype:
        return norm_cuda.rms_norm(x, w, eps)
    return mx.fast.rms_norm(x, w, eps)


def relu_ffn(wi: dict, wo: dict, x: mx.array, residual: mx.array, dropout: float,
             unfused: Callable[[], mx.array]) -> mx.array:
    """residual + relu(x @ wi.T) @ wo.T for linear layers wi, wo ({"weight", ...}), x and
    residual [..., d]: the ReLU inside the first GEMM's epilogue (`ffn_cuda`) when the layers
    are plain weights of x's dtype and no dropout, else `unfused()` (the caller's layers, LoRA
    and quantisation included)."""
    if ffn_cuda.usable(wi, wo, x, dropout):
        return ffn_cuda.relu_ffn(x, wi["weight"], wo["weight"], residual)
    return unfused()
