"""CUDA kernels for MaxSim's masked max over document tokens and its gradient.

Forward: one warp per row of the similarities s [R, Td] (R = Bq * Tq * Bd, row r belongs to
document r % Bd): each lane scans its share of the row, 8 elements (16 bytes) a load, with padded tokens read as NEG,
and warp shuffles give the row's max and its first index (ties go to the lowest index, as in
PyTorch's `max(dim)`). Backward: each warp writes its row of the gradient, the cotangent at
that index (when the token is real) and 0 elsewhere. Against MLX's ops this replaces a masked
copy, a max, and the max vjp's equality mask / tie count / divide / select - five passes over
the step's largest tensor ([128, 32, 128, 256] at batch 128) - by one read and one write.
Launched by `mlxcore.kernels.cuda_jit` (compiled once per machine by `mlxio.gpu.cuda_build`): MLX's CUDA
build only (`usable`).
"""

from __future__ import annotations

from functools import cache

import mlx.core as mx

from mlxcore.kernels import cuda_jit

_SOURCE = r"""
// one lane's share of a row of s [td], V elements (V * sizeof(T) bytes) a load
template <int V, typename T>
__device__ __forceinline__ void scan(const T* x, const bool* m, int td, int lane, float neg,
                                     float& best, int& at) {
  for (int j0 = lane * V; j0 < td; j0 += 32 * V) {
    const Vec<T, V> xa = *reinterpret_cast<const Vec<T, V>*>(x + j0);
    #pragma unroll
    for (int i = 0; i < V; ++i) {
      const float v = m[j0 + i] ? to_f(xa.v[i]) : neg;
      // j rises: the first maximum of this lane is kept; a NaN wins, as in MLX's max
      if (v > best || (v != v && best == best)) { best = v; at = j0 + i; }
    }
  }
}

template <typename T>
__device__ __forceinline__ void masked_max(const T* s, const bool* mask, T* out, int* idx,
                                           int rows, int td, int bd, int neg_bits) {
  const float neg = __int_as_float(neg_bits);
  const int lane = threadIdx.x & 31;
  const long row = (long(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  if (row >= rows) return;
  const bool* m = mask + (row % bd) * td;
  const T* x = s + row * td;
  float best = __int_as_float(0xff800000);  // -inf
  int at = td;
  if (td % 8 == 0) scan<8>(x, m, td, lane, neg, best, at);
  else scan<1>(x, m, td, lane, neg, best, at);
  #pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float b = __shfl_xor_sync(0xffffffffu, best, o);
    const int a = __shfl_xor_sync(0xffffffffu, at, o);
    if (b > best || (b == best && a < at) || (b != b && (best == best || a < at))) { best = b; at = a; }
  }
  if (lane == 0) {
    store(out[row], best);
    idx[row] = at;
  }
}

template <int V, typename T>
__device__ __forceinline__ void one_hot(T* dst, int td, int lane, int at, T value, T zero) {
  for (int j0 = lane * V; j0 < td; j0 += 32 * V) {
    Vec<T, V> o;
    #pragma unroll
    for (int i = 0; i < V; ++i) o.v[i] = (j0 + i == at) ? value : zero;
    *reinterpret_cast<Vec<T, V>*>(dst + j0) = o;
  }
}

template <typename T>
__device__ __forceinline__ void masked_max_vjp(const int* idx, const T* g, const bool* mask, T* ds,
                                               int rows, int td, int bd) {
  const int lane = threadIdx.x & 31;
  const long row = (long(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  if (row >= rows) return;
  const int at = idx[row];
  T zero;
  store(zero, 0.f);
  const T value = mask[(row % bd) * td + at] ? g[row] : zero;
  if (td % 8 == 0) one_hot<8>(ds + row * td, td, lane, at, value, zero);
  else one_hot<1>(ds + row * td, td, lane, at, value, zero);
}
"""

_WARPS_PER_BLOCK = 8


def usable(s: mx.array) -> bool:
    """True when the kernels can run for similarities s [..., Td]: CUDA build with NVRTC, GPU
    stream, float32 / bfloat16."""
    return cuda_jit.available() and s.ndim >= 1 and s.dtype in cuda_jit.STORAGE


@cache
def _entries(dtype: mx.Dtype) -> tuple[str, str, str]:
    """(forward name, backward name, source) for similarities of `dtype`, built once."""
    t = cuda_jit.STORAGE[dtype]
    fwd, bwd = f"mlxcore_masked_max_{t}", f"mlxcore_masked_max_vjp_{t}"
    return fwd, bwd, (
        _SOURCE
        + cuda_jit.entry(fwd, f"const {t}* s, const bool* mask, {t}* out, int* idx, int rows, int td, int bd, int neg",
                         f"masked_max<{t}>(s, mask, out, idx, rows, td, bd, neg);")
        + cuda_jit.entry(bwd, f"const int* idx, const {t}* g, const bool* mask, {t}* ds, int rows, int td, int bd",
                         f"masked_max_vjp<{t}>(idx, g, mask, ds, rows, td, bd);"))


@cache
def _masked_max(neg: float):
    @mx.custom_function
    def f(s, mask):
        (bd, td), rows = mask.shape, s.size // s.shape[-1]
        fwd, _, source = _entries(s.dtype)
        out, idx = cuda_jit.launch(fwd, source, [s.reshape(rows, td), mask], [((rows,), s.dtype), ((rows,), mx.int32)],
                                   [rows, td, bd, cuda_jit.float_bits(neg)], threads=rows * 32, block=32 * _WARPS_PER_BLOCK)
        return out.reshape(s.shape[:-1]), idx.reshape(s.shape[:-1])

    @f.vjp
    def f_vjp(primals, cotangents, outputs):
        s, mask = primals
        (bd, td), rows = mask.shape, s.size // s.shape[-1]
        _, bwd, source = _entries(s.dtype)
        (ds,) = cuda_jit.launch(bwd, source, [outputs[1].reshape(rows), cotangents[0].astype(s.dtype).reshape(rows), mask],
                                [((rows, td), s.dtype)], [rows, td, bd], threads=rows * 32,
                                block=32 * _WARPS_PER_BLOCK)
        return ds.reshape(s.shape), mx.zeros_like(mask)

    return f


def masked_max(s: mx.array, mask: mx.array, neg: float) -> mx.array:
    """max over the last axis of where(mask, s, neg): s [..., Bd, Td], mask [Bd, Td] (bool) ->
    [..., Bd] in s's dtype; the gradient goes to the first maximum, and none to padding."""
    bd, td = mask.shape
    if s.shape[-2:] != (bd, td):
        raise ValueError(f"masked_max: similarities {s.shape} do not end with the mask's {mask.shape}")
    return _masked_max(float(neg))(s, mask.astype(mx.bool_))[0]
