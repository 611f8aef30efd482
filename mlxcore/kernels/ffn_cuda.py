"""T5's ReLU feed-forward with the ReLU inside its first GEMM (a cuBLASLt epilogue, MLX's CUDA build).

    out = residual + relu(x @ wi.T) @ wo.T         x [..., d], wi [F, d], wo [d, F]

The forward's wi GEMM writes relu(.) and its sign bits (1/16 of the activation) in one pass
(`matmul_relu_aux`, the compiled `mlxio.gpu.cuda_ext`, which `mlxio.runtime.setup()` registers here), in place of a GEMM and `relu_cuda`'s ReLU kernel
(less time than the two, dev/ffn_epilogue.py). The
backward is `relu_cuda`'s: MLX's GEMM for g @ wo, then the bit-mask kernel (cuBLASLt's DRELU
epilogue runs as a slower separate kernel). `usable` says when it runs.

A mask bit is cuBLASLt's sign of the float32 accumulator, so where the pre-activation rounds
to within ~1e-7 of zero it can disagree with the sign of the rounded output (a handful of
elements in a t5-base b128 layer: dev/LOG.md): the gradient there is a subgradient either way. Values
equal MLX's matmul + maximum bit for bit in that layer. The weight gradients are returned too,
lazily: a frozen wi / wo never evaluates them (wo's recomputes the activation from x).
"""

from __future__ import annotations

import mlx.core as mx

from mlxcore.kernels import relu_cuda

_extension: list = []  # the loaded extension module, once registered


def register_extension(module) -> None:
    """Use `module.matmul_relu_aux` (the I/O layer loads it: `mlxio.gpu.cuda_ext`)."""
    _extension[:] = [module]


def usable(wi: dict, wo: dict, x: mx.array, dropout: float = 0.0) -> bool:
    """True when the fused feed-forward can run: the extension is registered and
    `relu_cuda` can compile (CUDA build), wi and wo are plain weights (no bias, LoRA or
    quantisation) of x's dtype (bfloat16 or float32), x not empty, no dropout, and F (wi's rows)
    is a multiple of 128 (cuBLASLt's bitmask rows)."""
    if dropout or not _extension or set(wi) != {"weight"} or set(wo) != {"weight"}:
        return False
    w_in, w_out = wi["weight"], wo["weight"]
    # relu_cuda.usable(x): its storage dtypes (bfloat16, float32), a CUDA build that can compile;
    # its backward runs on the [tokens, F] activation, whose bytes of bits must index as int
    return (x.size > 0 and w_in.dtype == x.dtype and w_out.dtype == x.dtype and w_in.ndim == 2
            and w_out.shape == (w_in.shape[1], w_in.shape[0]) and x.shape[-1] == w_in.shape[1]
            and w_in.shape[0] % 128 == 0 and relu_cuda.usable(x)
            and x.size // x.shape[-1] * w_in.shape[0] // 8 < 2**31)


@mx.custom_function
def _ffn(x: mx.array, wi: mx.array, wo: mx.array, residual: mx.array) -> tuple[mx.array, mx.array]:
    h, bits = _extension[0].matmul_relu_aux(x, wi)
    return mx.addmm(residual, h, wo.T), bits


@_ffn.vjp
def _ffn_vjp(primals, cotangents, outputs):
    x, wi, wo, _ = primals
    g, bits = cotangents[0].astype(x.dtype), outputs[1]
    dpre = relu_cuda.masked_grad(g @ wo, bits)  # (g @ wo) * relu'(x @ wi.T): [M, F]
    dwo = g.T @ mx.maximum(x @ wi.T, 0)  # lazily: only a trained wo evaluates it
    return dpre @ wi, dpre.T @ x, dwo, g


def relu_ffn(x: mx.array, wi: mx.array, wo: mx.array, residual: mx.array) -> mx.array:
    """residual + relu(x @ wi.T) @ wo.T for x, residual [..., d], wi [F, d], wo [d, F] (`usable`)."""
    lead, d = x.shape[:-1], x.shape[-1]
    out, _ = _ffn(x.reshape(-1, d), wi, wo, residual.reshape(-1, d))
    return out.reshape(*lead, d)
