"""CUDA kernel for an attention bias over a batch of rows: out [R, H, L, L] = pos [1, H, L, L] +
keys [R, 1, L, L] (T5's relative positions over every row's padded keys / packed blocks).

MLX's fused broadcast add writes that [R, H, L, L] tensor (226 MB at the t5-base b128 step's
144 rows of 256 tokens) well below memory bandwidth, its index arithmetic run per element, before
the first block can start (measured: dev/LOG.md, benchmarks/results/h100). Here each thread adds 8 elements (16 bytes of
bfloat16) of a row of pos to the same 8 of keys, in float32, rounded once - MLX's bfloat16 add,
bit for bit. The vjp is MLX's ops (sums over the broadcast axes). Launched by
`mlxcore.kernels.cuda_jit`: MLX's CUDA build only (`usable`).
"""

from __future__ import annotations

from functools import cache

import mlx.core as mx

from mlxcore.kernels import cuda_jit

_SOURCE = r"""
template <typename T>
__device__ __forceinline__ void head_bias(const T* pos, const T* keys, T* out, int vectors, int heads,
                                          int n8) {
  const long v = long(blockIdx.x) * blockDim.x + threadIdx.x;
  if (v >= vectors) return;
  const long rh = v / n8;  // row * heads + head
  const long m = (v - rh * n8) * 8;  // offset in the [L, L] plane
  const long n = long(n8) * 8;
  const Vec<T, 8> a = *reinterpret_cast<const Vec<T, 8>*>(pos + (rh % heads) * n + m);
  const Vec<T, 8> b = *reinterpret_cast<const Vec<T, 8>*>(keys + (rh / heads) * n + m);
  Vec<T, 8> o;
  #pragma unroll
  for (int i = 0; i < 8; ++i) store(o.v[i], to_f(a.v[i]) + to_f(b.v[i]));
  *reinterpret_cast<Vec<T, 8>*>(out + v * 8) = o;
}
"""

_BLOCK = 256


def usable(pos: mx.array, keys: mx.array) -> bool:
    """True when `add_heads` can run: CUDA build with a kernel compiler, GPU stream, pos
    [1, H, L, L] and keys [R, 1, L|1, L] of one float32 / bfloat16 dtype, 8 | L * L."""
    if pos.ndim != 4 or keys.ndim != 4 or pos.dtype != keys.dtype or pos.dtype not in cuda_jit.STORAGE:
        return False
    _, _, length, width = pos.shape
    return (cuda_jit.available() and pos.shape[0] == 1 and length == width and keys.shape[1] == 1
            and keys.shape[2] in (1, length) and keys.shape[3] == length and (length * length) % 8 == 0
            and keys.shape[0] * pos.shape[1] * length * length // 8 < 2**31)


@cache
def _entry(dtype: mx.Dtype) -> tuple[str, str]:
    t = cuda_jit.STORAGE[dtype]
    name = f"mlxcore_head_bias_{t}"
    return name, _SOURCE + cuda_jit.entry(name, f"const {t}* pos, const {t}* keys, {t}* out, int vectors, int heads, int n8",
                                          f"head_bias<{t}>(pos, keys, out, vectors, heads, n8);")


@mx.custom_function
def _add_heads(pos: mx.array, keys: mx.array) -> mx.array:
    (_, heads, length, _), rows = pos.shape, keys.shape[0]
    vectors = rows * heads * length * length // 8
    name, source = _entry(pos.dtype)
    (out,) = cuda_jit.launch(name, source, [pos, keys], [((rows, heads, length, length), pos.dtype)],
                             [vectors, heads, length * length // 8], threads=vectors, block=_BLOCK)
    return out


@_add_heads.vjp
def _add_heads_vjp(primals, cotangent, _output):
    return cotangent.sum(axis=0, keepdims=True), cotangent.sum(axis=1, keepdims=True)


def add_heads(pos: mx.array, keys: mx.array) -> mx.array:
    """pos [1, H, L, L] + keys [R, 1, L|1, L] -> [R, H, L, L] (see `usable`)."""
    length = pos.shape[-1]
    return _add_heads(pos, mx.broadcast_to(keys, (keys.shape[0], 1, length, length)))
