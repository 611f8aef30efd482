"""T5's ReLU feed-forward with the ReLU inside its GEMMs (cuBLASLt epilogues, MLX's CUDA build).

    out = residual + relu(x @ wi.T) @ wo.T         x [..., d], wi [F, d], wo [d, F]

The forward's wi GEMM writes relu(.) and its sign bits (1/16 of the activation) in one pass
(`matmul_relu_aux`); the backward's g @ wo GEMM multiplies by those bits in its epilogue
(`matmul_drelu`) and so writes the pre-activation gradient directly. Against `relu_cuda` (a
kernel that reads x and writes y and the bits, and one that reads g and the bits), both ReLU
passes over [tokens, F] are gone. Needs the compiled `mlxcore.cuda_ext`; `usable` says when.

The weight gradients are returned too (lazily: a frozen wi / wo never evaluates them; wo's is
recomputed from x rather than keeping the activation).
"""

from __future__ import annotations

import mlx.core as mx

from mlxcore import cuda_ext

FLOATS = (mx.bfloat16, mx.float16, mx.float32)


def usable(wi: dict, wo: dict, x: mx.array, dropout: float = 0.0) -> bool:
    """True when the fused feed-forward can run: the extension is built and loaded (CUDA build),
    wi and wo are plain weights (no bias, LoRA or quantisation) of x's float dtype, no dropout,
    and F (wi's rows) is a multiple of 128 (cuBLASLt's bitmask rows)."""
    if dropout or cuda_ext.load() is None or set(wi) != {"weight"} or set(wo) != {"weight"}:
        return False
    w_in, w_out = wi["weight"], wo["weight"]
    return (x.dtype in FLOATS and w_in.dtype == x.dtype and w_out.dtype == x.dtype and w_in.ndim == 2
            and w_out.shape == (w_in.shape[1], w_in.shape[0]) and x.shape[-1] == w_in.shape[1]
            and w_in.shape[0] % 128 == 0)


@mx.custom_function
def _ffn(x: mx.array, wi: mx.array, wo: mx.array, residual: mx.array) -> tuple[mx.array, mx.array]:
    h, bits = cuda_ext.load().matmul_relu_aux(x, wi)
    return mx.addmm(residual, h, wo.T), bits


@_ffn.vjp
def _ffn_vjp(primals, cotangents, outputs):
    x, wi, wo, _ = primals
    g, bits = cotangents[0].astype(x.dtype), outputs[1]
    dpre = cuda_ext.load().matmul_drelu(g, wo, bits)  # (g @ wo) * relu'(x @ wi.T): [M, F]
    dwo = g.T @ mx.maximum(x @ wi.T, 0)  # lazily: only a trained wo evaluates it
    return dpre @ wi, dpre.T @ x, dwo, g


def relu_ffn(x: mx.array, wi: mx.array, wo: mx.array, residual: mx.array) -> mx.array:
    """residual + relu(x @ wi.T) @ wo.T for x, residual [..., d], wi [F, d], wo [d, F] (`usable`)."""
    lead, d = x.shape[:-1], x.shape[-1]
    out, _ = _ffn(x.reshape(-1, d), wi, wo, residual.reshape(-1, d))
    return out.reshape(*lead, d)
