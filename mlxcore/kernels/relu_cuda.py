"""CUDA kernels for a ReLU whose backward reads one bit per element instead of the activation.

T5's feed-forward ReLU runs on [tokens, d_ff] (t5-base b128: 36,864 x 3,072 bfloat16, 226 MB).
MLX's forward `maximum(x, 0)` reads x and writes y (452 MB a layer); its backward
`g * (x > 0)` reads g and x and writes the input gradient (678 MB), both at memory bandwidth.
Here the forward also writes the sign bits (x > 0), eight to a byte (1/16 of x), and the
backward reads those in place of x (466 MB; timings: commit d713caf's benchmarks/results/h100/session12/). The activation x need not outlive the forward either
(the frozen `wo` needs no weight gradient), which frees 226 MB a layer. A forward with no
backward (encoding) writes the bits all the same: 1/16 more bytes than MLX's.

Values are MLX's bit for bit, except a NaN's payload: y = x where x > 0, NaN where x is NaN (as
MLX's maximum), +0 elsewhere; dx = g * (x > 0) as a float multiply (so -0 and NaN products as
MLX's). Each thread handles 8 elements. Launched by `mlxcore.kernels.cuda_jit`: MLX's CUDA build only
(`usable`).
"""

from __future__ import annotations

from functools import cache

import mlx.core as mx

from mlxcore.kernels import cuda_jit

_SOURCE = r"""
template <typename T>
__device__ __forceinline__ void relu_bits(const T* x, T* y, unsigned char* bits, int vectors) {
  const long v = long(blockIdx.x) * blockDim.x + threadIdx.x;
  if (v >= vectors) return;
  const Vec<T, 8> a = *reinterpret_cast<const Vec<T, 8>*>(x + v * 8);
  Vec<T, 8> o;
  unsigned int m = 0;
  #pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float f = to_f(a.v[i]);
    const bool pos = f > 0.f;
    m |= (unsigned int)pos << i;
    if (pos || f != f) o.v[i] = a.v[i]; else store(o.v[i], 0.f);
  }
  *reinterpret_cast<Vec<T, 8>*>(y + v * 8) = o;
  bits[v] = (unsigned char)m;
}

template <typename T>
__device__ __forceinline__ void relu_bits_vjp(const T* g, const unsigned char* bits, T* dx, int vectors) {
  const long v = long(blockIdx.x) * blockDim.x + threadIdx.x;
  if (v >= vectors) return;
  const Vec<T, 8> a = *reinterpret_cast<const Vec<T, 8>*>(g + v * 8);
  const unsigned int m = bits[v];
  Vec<T, 8> o;
  #pragma unroll
  for (int i = 0; i < 8; ++i) store(o.v[i], to_f(a.v[i]) * ((m >> i) & 1u ? 1.f : 0.f));
  *reinterpret_cast<Vec<T, 8>*>(dx + v * 8) = o;
}
"""

_BLOCK = 256


def usable(x: mx.array) -> bool:
    """True when `relu` can run: CUDA build with a kernel compiler, GPU stream, float32 or
    bfloat16 x whose last axis is a multiple of 8."""
    return (cuda_jit.available() and x.ndim >= 1 and x.dtype in cuda_jit.STORAGE and x.shape[-1] % 8 == 0
            and x.size // 8 < 2**31)


@cache
def _entries(dtype: mx.Dtype) -> tuple[str, str, str]:
    t = cuda_jit.STORAGE[dtype]
    forward, backward = f"mlxcore_relu_bits_{t}", f"mlxcore_relu_bits_vjp_{t}"
    return forward, backward, (
        _SOURCE
        + cuda_jit.entry(forward, f"const {t}* x, {t}* y, unsigned char* bits, int vectors",
                         f"relu_bits<{t}>(x, y, bits, vectors);")
        + cuda_jit.entry(backward, f"const {t}* g, const unsigned char* bits, {t}* dx, int vectors",
                         f"relu_bits_vjp<{t}>(g, bits, dx, vectors);"))


@mx.custom_function
def _relu(x: mx.array) -> tuple[mx.array, mx.array]:
    vectors = x.size // 8
    forward, _, source = _entries(x.dtype)
    y, bits = cuda_jit.launch(forward, source, [x], [(x.shape, x.dtype), ((vectors,), mx.uint8)], [vectors],
                              threads=vectors, block=_BLOCK)
    return y, bits


@_relu.vjp
def _relu_vjp(x, cotangents, outputs):
    return masked_grad(cotangents[0].astype(x.dtype), outputs[1])  # one primal comes as the array itself


def masked_grad(g: mx.array, bits: mx.array) -> mx.array:
    """g * (bit set) for g [..., F] (`usable`) and its sign bits [g.size / 8] or [..., F / 8]
    uint8, element 8 v + i in bit i of byte v (`relu`'s, and cuBLASLt's RELU_AUX bitmask)."""
    vectors = g.size // 8
    _, backward, source = _entries(g.dtype)
    (dx,) = cuda_jit.launch(backward, source, [g, bits.reshape(-1)], [(g.shape, g.dtype)], [vectors],
                            threads=vectors, block=_BLOCK)
    return dx


def relu(x: mx.array) -> mx.array:
    """max(x, 0) for x [..., F] (see `usable`), as `mx.maximum(x, 0.0)` in values and gradient."""
    return _relu(x)[0]
