"""CUDA kernels for MaxSim's masked max over document tokens and its gradient.

Forward: one warp per row of the similarities s [R, Td] (R = Bq * Tq * Bd, row r belongs to
document r % Bd): each lane scans its share of the row, 8 elements (16 bytes) a load, with padded tokens read as NEG,
and warp shuffles give the row's max and its first index (ties go to the lowest index, as in
PyTorch's `max(dim)`). Backward: each warp writes its row of the gradient, the cotangent at
that index (when the token is real) and 0 elsewhere. Against MLX's ops this replaces a masked
copy, a max, and the max vjp's equality mask / tie count / divide / select - five passes over
the step's largest tensor ([128, 32, 128, 256] at batch 128) - by one read and one write.
Built through `mx.fast.cuda_kernel`: MLX's CUDA build only (`usable`).
"""

from __future__ import annotations

from functools import cache

import mlx.core as mx

from mlxcore.norm_cuda import VEC_HEADER

_HEADER = VEC_HEADER + """
// one lane's share of a row of s [td], V elements (V * sizeof(T) bytes) a load
template <int V, typename T>
__device__ __forceinline__ void scan(const T* x, const bool* m, int td, int lane, float neg,
                                     float& best, int& at) {
  for (int j0 = lane * V; j0 < td; j0 += 32 * V) {
    const Vec<T, V> xa = *reinterpret_cast<const Vec<T, V>*>(x + j0);
    #pragma unroll
    for (int i = 0; i < V; ++i) {
      const float v = m[j0 + i] ? static_cast<float>(xa.v[i]) : neg;
      // j rises: the first maximum of this lane is kept; a NaN wins, as in MLX's max
      if (v > best || (v != v && best == best)) { best = v; at = j0 + i; }
    }
  }
}

template <int V, typename T>
__device__ __forceinline__ void one_hot(T* dst, int td, int lane, int at, T value) {
  const T zero = static_cast<T>(0.0f);
  for (int j0 = lane * V; j0 < td; j0 += 32 * V) {
    Vec<T, V> o;
    #pragma unroll
    for (int i = 0; i < V; ++i) o.v[i] = (j0 + i == at) ? value : zero;
    *reinterpret_cast<Vec<T, V>*>(dst + j0) = o;
  }
}
"""

# Td is read from the mask's shape at run time, not a template argument: MLX compiles custom
# kernels with NVRTC in every process (they are not in its on-disk kernel cache), ~2 s each, and
# evaluation meets several document lengths
_FORWARD = """
  const int td = mask_shape[1];
  const int lane = threadIdx.x & 31;
  const long row = (long(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  if (row >= s_shape[0]) return;
  const bool* m = mask + (row % mask_shape[0]) * td;
  const T* x = s + row * td;
  float best = __int_as_float(0xff800000);  // -inf
  int at = td;
  if (td % 8 == 0) scan<8>(x, m, td, lane, NEG, best, at);
  else scan<1>(x, m, td, lane, NEG, best, at);
  #pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float b = __shfl_xor_sync(0xffffffff, best, o);
    const int a = __shfl_xor_sync(0xffffffff, at, o);
    if (b > best || (b == best && a < at) || (b != b && (best == best || a < at))) { best = b; at = a; }
  }
  if (lane == 0) {
    out[row] = static_cast<T>(best);
    idx[row] = at;
  }
"""

_BACKWARD = """
  const int td = mask_shape[1];
  const int lane = threadIdx.x & 31;
  const long row = (long(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  if (row >= idx_shape[0]) return;
  const int at = idx[row];
  const T value = mask[(row % mask_shape[0]) * td + at] ? g[row] : static_cast<T>(0.0f);
  if (td % 8 == 0) one_hot<8>(ds + row * td, td, lane, at, value);
  else one_hot<1>(ds + row * td, td, lane, at, value);
"""

_WARPS_PER_BLOCK = 8


def usable(s: mx.array) -> bool:
    """True when the kernels can run for similarities s [..., Td]: CUDA build, GPU stream,
    float32 / bfloat16 / float16."""
    return (mx.default_device() == mx.gpu and mx.cuda.is_available() and s.ndim >= 1
            and s.dtype in (mx.float32, mx.bfloat16, mx.float16))


@cache
def _kernels(neg: float):
    fwd = mx.fast.cuda_kernel(name="maxsim_masked_max", input_names=["s", "mask"], output_names=["out", "idx"],
                              header=_HEADER, source=f"  constexpr float NEG = {neg!r}f;\n" + _FORWARD)
    bwd = mx.fast.cuda_kernel(name="maxsim_masked_max_vjp", input_names=["idx", "g", "mask"],
                              output_names=["ds"], header=_HEADER, source=_BACKWARD)
    return fwd, bwd


def _grid(rows: int) -> dict:
    return {"grid": (rows * 32, 1, 1), "threadgroup": (32 * _WARPS_PER_BLOCK, 1, 1)}


@cache
def _masked_max(neg: float):
    fwd, bwd = _kernels(neg)

    @mx.custom_function
    def f(s, mask):
        rows, td = s.size // s.shape[-1], s.shape[-1]
        out, idx = fwd(inputs=[s.reshape(rows, td), mask], template=[("T", s.dtype)],
                       output_shapes=[(rows,), (rows,)], output_dtypes=[s.dtype, mx.int32], **_grid(rows))
        return out.reshape(s.shape[:-1]), idx.reshape(s.shape[:-1])

    @f.vjp
    def f_vjp(primals, cotangents, outputs):
        s, mask = primals
        rows, td = s.size // s.shape[-1], s.shape[-1]
        (ds,) = bwd(inputs=[outputs[1].reshape(rows), cotangents[0].astype(s.dtype).reshape(rows), mask],
                    template=[("T", s.dtype)], output_shapes=[(rows, td)],
                    output_dtypes=[s.dtype], **_grid(rows))
        return ds.reshape(s.shape), mx.zeros_like(mask)

    return f


def masked_max(s: mx.array, mask: mx.array, neg: float) -> mx.array:
    """max over the last axis of where(mask, s, neg): s [..., Bd, Td], mask [Bd, Td] (bool) ->
    [..., Bd] in s's dtype; the gradient goes to the first maximum, and none to padding."""
    bd, td = mask.shape
    if s.shape[-2:] != (bd, td):
        raise ValueError(f"masked_max: similarities {s.shape} do not end with the mask's {mask.shape}")
    return _masked_max(float(neg))(s, mask.astype(mx.bool_))[0]
