"""CUDA kernels for the input gradient of layer norm / RMS norm with a frozen weight, and for
the RMS norm's forward (`rms_norm`: one warp a row, like the gradient's).

One warp per row of x [rows, D]: the row's x, the incoming gradient g and the weight w are
read once (up to 16 bytes per lane per load), the mean / variance (layer norm) or mean square
(RMS norm) are recomputed in float32 by warp shuffles, and

    layer:  dx = rstd * (gw - mean(gw) - x_hat * mean(gw * x_hat)),  x_hat = (x - mean) * rstd
    rms:    dx = rstd * (gw - x_hat * mean(gw * x_hat)),             x_hat = x * rstd

with gw = g * w, plus `extra` (a second gradient of x, e.g. a pre-norm block's residual path)
when given, is written once. Launched by `mlxcore.kernels.cuda_jit` (compiled once per machine by
`mlxio.gpu.cuda_build`), so it exists only on MLX's CUDA build; `usable` says when it applies (GPU
stream, D a multiple of 128 up to 8192).
"""

from __future__ import annotations

from functools import cache

import mlx.core as mx

from mlxcore.kernels import cuda_jit

MAX_D = 8192

_SOURCE = r"""
template <typename T, int D, int V, bool LAYER, bool EXTRA>
__device__ __forceinline__ void norm_vjp(const T* x, const T* g, const T* w, const T* extra, T* dx,
                                         int rows, int eps_bits) {
  const float eps = __int_as_float(eps_bits);
  constexpr int CHUNKS = D / (32 * V);  // V-element chunks per lane
  const int lane = threadIdx.x & 31;
  const long row = (long(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  if (row >= rows) return;
  const long base = row * D;
  float xv[CHUNKS][V], gv[CHUNKS][V];
  float sum = 0.f;
  #pragma unroll
  for (int c = 0; c < CHUNKS; ++c) {
    const int col = (c * 32 + lane) * V;
    const Vec<T, V> xa = *reinterpret_cast<const Vec<T, V>*>(x + base + col);
    const Vec<T, V> ga = *reinterpret_cast<const Vec<T, V>*>(g + base + col);
    const Vec<T, V> wa = *reinterpret_cast<const Vec<T, V>*>(w + col);
    #pragma unroll
    for (int i = 0; i < V; ++i) {
      xv[c][i] = to_f(xa.v[i]);
      gv[c][i] = to_f(ga.v[i]) * to_f(wa.v[i]);
      sum += xv[c][i];
    }
  }
  const float mean = LAYER ? warp_sum(sum) / D : 0.f;
  float sq = 0.f;
  #pragma unroll
  for (int c = 0; c < CHUNKS; ++c) {
    #pragma unroll
    for (int i = 0; i < V; ++i) {
      xv[c][i] -= mean;
      sq += xv[c][i] * xv[c][i];
    }
  }
  const float rstd = rsqrtf(warp_sum(sq) / D + eps);
  float sum_g = 0.f, sum_gx = 0.f;
  #pragma unroll
  for (int c = 0; c < CHUNKS; ++c) {
    #pragma unroll
    for (int i = 0; i < V; ++i) {
      xv[c][i] *= rstd;  // x_hat
      sum_g += gv[c][i];
      sum_gx += gv[c][i] * xv[c][i];
    }
  }
  const float mean_g = LAYER ? warp_sum(sum_g) / D : 0.f;
  const float mean_gx = warp_sum(sum_gx) / D;
  #pragma unroll
  for (int c = 0; c < CHUNKS; ++c) {
    const int col = (c * 32 + lane) * V;
    Vec<T, V> out;
    Vec<T, V> ea;
    if (EXTRA) ea = *reinterpret_cast<const Vec<T, V>*>(extra + base + col);
    #pragma unroll
    for (int i = 0; i < V; ++i) {
      float d = rstd * (gv[c][i] - mean_g - xv[c][i] * mean_gx);
      if (EXTRA) d += to_f(ea.v[i]);
      store(out.v[i], d);
    }
    *reinterpret_cast<Vec<T, V>*>(dx + base + col) = out;
  }
}

// y = x * rsqrt(mean(x^2) + eps) * w, one warp per row (the RMS norm's forward)
template <typename T, int D, int V>
__device__ __forceinline__ void rms_forward(const T* x, const T* w, T* y, int rows, int eps_bits) {
  const float eps = __int_as_float(eps_bits);
  constexpr int CHUNKS = D / (32 * V);
  const int lane = threadIdx.x & 31;
  const long row = (long(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  if (row >= rows) return;
  const long base = row * D;
  float xv[CHUNKS][V];
  float sq = 0.f;
  #pragma unroll
  for (int c = 0; c < CHUNKS; ++c) {
    const Vec<T, V> xa = *reinterpret_cast<const Vec<T, V>*>(x + base + (c * 32 + lane) * V);
    #pragma unroll
    for (int i = 0; i < V; ++i) {
      xv[c][i] = to_f(xa.v[i]);
      sq += xv[c][i] * xv[c][i];
    }
  }
  const float rstd = rsqrtf(warp_sum(sq) / D + eps);
  #pragma unroll
  for (int c = 0; c < CHUNKS; ++c) {
    const int col = (c * 32 + lane) * V;
    const Vec<T, V> wa = *reinterpret_cast<const Vec<T, V>*>(w + col);
    Vec<T, V> out;
    #pragma unroll
    for (int i = 0; i < V; ++i) store(out.v[i], xv[c][i] * rstd * to_f(wa.v[i]));
    *reinterpret_cast<Vec<T, V>*>(y + base + col) = out;
  }
}
"""

_WARPS_PER_BLOCK = 4


def usable(x: mx.array) -> bool:
    """True when the kernel can run for x [..., D]: CUDA build with NVRTC, GPU stream,
    128 | D <= MAX_D, float32 / bfloat16."""
    d = x.shape[-1] if x.ndim else 0
    return (cuda_jit.available() and d % 128 == 0 and 0 < d <= MAX_D and x.dtype in cuda_jit.STORAGE)


def _vector(d: int, dtype: mx.Dtype) -> int:
    """Elements a lane loads at once: 8 bfloat16 (16 bytes) where 256 | D, else 4 (8-byte loads
    already run it near memory bandwidth at the t5-base step's shapes)."""
    return 8 if dtype == mx.bfloat16 and d % 256 == 0 else 4


@cache
def _entry(kind: str, d: int, dtype: mx.Dtype, extra: bool) -> tuple[str, str]:
    """(entry point name, source) of one instantiation, built once."""
    t = cuda_jit.STORAGE[dtype]
    v = _vector(d, dtype)
    name = f"mlxcore_norm_vjp_{kind}_{t}_{d}_{'e' if extra else 'n'}" + ("" if v == 4 else f"_v{v}")
    params = ", ".join([f"const {t}* x", f"const {t}* g", f"const {t}* w"] + ([f"const {t}* extra"] if extra else [])
                       + [f"{t}* dx", "int rows", "int eps_bits"])
    call = (f"norm_vjp<{t}, {d}, {v}, {'true' if kind == 'layer' else 'false'}, {'true' if extra else 'false'}>"
            f"(x, g, w, {'extra' if extra else 'nullptr'}, dx, rows, eps_bits);")
    return name, _SOURCE + cuda_jit.entry(name, params, call)


@cache
def _forward_entry(d: int, dtype: mx.Dtype) -> tuple[str, str]:
    t, v = cuda_jit.STORAGE[dtype], _vector(d, dtype)
    name = f"mlxcore_rms_forward_{t}_{d}_v{v}"
    return name, _SOURCE + cuda_jit.entry(name, f"const {t}* x, const {t}* w, {t}* y, int rows, int eps_bits",
                                          f"rms_forward<{t}, {d}, {v}>(x, w, y, rows, eps_bits);")


def rms_norm(x: mx.array, w: mx.array, eps: float) -> mx.array:
    """`mx.fast.rms_norm(x, w, eps)` forward only (callers give the vjp): x [..., D], w [D] ->
    [..., D] in x's dtype. MLX's kernel runs D = 768 rows in 128-thread blocks, a quarter of
    them idle; here a warp reads a row in 16-byte loads."""
    d = x.shape[-1]
    rows = x.size // d
    name, source = _forward_entry(d, x.dtype)
    (y,) = cuda_jit.launch(name, source, [x.reshape(rows, d), w.astype(x.dtype)], [((rows, d), x.dtype)],
                           [rows, cuda_jit.float_bits(eps)], threads=rows * 32, block=32 * _WARPS_PER_BLOCK)
    return y.reshape(x.shape)


def norm_vjp(kind: str, x: mx.array, w: mx.array, g: mx.array, eps: float,
             extra: mx.array | None = None) -> mx.array:
    """x's gradient of `kind` ("layer" | "rms") norm(x) * w for cotangent g, plus `extra`:
    x, g, extra [..., D], w [D] -> [..., D] in x's dtype."""
    d = x.shape[-1]
    rows = x.size // d
    arrays = [x.reshape(rows, d), g.astype(x.dtype).reshape(rows, d), w.astype(x.dtype)]
    if extra is not None:
        arrays.append(extra.astype(x.dtype).reshape(rows, d))
    name, source = _entry(kind, d, x.dtype, extra is not None)
    (dx,) = cuda_jit.launch(name, source, arrays, [((rows, d), x.dtype)], [rows, cuda_jit.float_bits(eps)],
                            threads=rows * 32, block=32 * _WARPS_PER_BLOCK)
    return dx.reshape(x.shape)
