"""CUDA kernel for the input gradient of layer norm / RMS norm with a frozen weight.

One warp per row of x [rows, D]: the row's x, the incoming gradient g and the weight w are
read once (4 elements per lane per load), the mean / variance (layer norm) or mean square
(RMS norm) are recomputed in float32 by warp shuffles, and

    layer:  dx = rstd * (gw - mean(gw) - x_hat * mean(gw * x_hat)),  x_hat = (x - mean) * rstd
    rms:    dx = rstd * (gw - x_hat * mean(gw * x_hat)),             x_hat = x * rstd

with gw = g * w, plus `extra` (a second gradient of x, e.g. a pre-norm block's residual path)
when given, is written once. Built through `mx.fast.cuda_kernel`, so it exists only on MLX's
CUDA build; `usable` says when it applies (GPU stream, CUDA, D a multiple of 128 up to 8192).
"""

from __future__ import annotations

from functools import cache

import mlx.core as mx

MAX_D = 8192

VEC_HEADER = """
template <typename T, int N>
struct alignas(sizeof(T) * N) Vec { T v[N]; };
"""

_HEADER = VEC_HEADER + """
__device__ __forceinline__ float warp_sum(float v) {
  #pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
  return v;
}
"""

_SOURCE = """
  constexpr int CHUNKS = D / 128;  // 4-element chunks per lane
  const int lane = threadIdx.x & 31;
  const long row = (long(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  if (row >= x_shape[0]) return;
  const long base = row * D;
  float xv[CHUNKS][4], gv[CHUNKS][4];
  float sum = 0.f;
  #pragma unroll
  for (int c = 0; c < CHUNKS; ++c) {
    const int col = (c * 32 + lane) * 4;
    Vec<T, 4> xa = *reinterpret_cast<const Vec<T, 4>*>(x + base + col);
    Vec<T, 4> ga = *reinterpret_cast<const Vec<T, 4>*>(g + base + col);
    Vec<T, 4> wa = *reinterpret_cast<const Vec<T, 4>*>(w + col);
    #pragma unroll
    for (int i = 0; i < 4; ++i) {
      xv[c][i] = static_cast<float>(xa.v[i]);
      gv[c][i] = static_cast<float>(ga.v[i]) * static_cast<float>(wa.v[i]);
      sum += xv[c][i];
    }
  }
  const float mean = LAYER ? warp_sum(sum) / D : 0.f;
  float sq = 0.f;
  #pragma unroll
  for (int c = 0; c < CHUNKS; ++c) {
    #pragma unroll
    for (int i = 0; i < 4; ++i) {
      xv[c][i] -= mean;
      sq += xv[c][i] * xv[c][i];
    }
  }
  const float rstd = rsqrtf(warp_sum(sq) / D + EPS);
  float sum_g = 0.f, sum_gx = 0.f;
  #pragma unroll
  for (int c = 0; c < CHUNKS; ++c) {
    #pragma unroll
    for (int i = 0; i < 4; ++i) {
      xv[c][i] *= rstd;  // x_hat
      sum_g += gv[c][i];
      sum_gx += gv[c][i] * xv[c][i];
    }
  }
  const float mean_g = LAYER ? warp_sum(sum_g) / D : 0.f;
  const float mean_gx = warp_sum(sum_gx) / D;
  #pragma unroll
  for (int c = 0; c < CHUNKS; ++c) {
    const int col = (c * 32 + lane) * 4;
    Vec<T, 4> out;
    Vec<T, 4> ea;
    if (EXTRA) ea = *reinterpret_cast<const Vec<T, 4>*>(extra + base + col);
    #pragma unroll
    for (int i = 0; i < 4; ++i) {
      float d = rstd * (gv[c][i] - mean_g - xv[c][i] * mean_gx);
      if (EXTRA) d += static_cast<float>(ea.v[i]);
      out.v[i] = static_cast<T>(d);
    }
    *reinterpret_cast<Vec<T, 4>*>(dx + base + col) = out;
  }
"""

_WARPS_PER_BLOCK = 4


def usable(x: mx.array) -> bool:
    """True when the kernel can run for x [..., D]: CUDA build, GPU stream, 128 | D <= MAX_D,
    float32 / bfloat16 / float16."""
    d = x.shape[-1] if x.ndim else 0
    return (mx.default_device() == mx.gpu and mx.cuda.is_available() and d % 128 == 0
            and 0 < d <= MAX_D and x.dtype in (mx.float32, mx.bfloat16, mx.float16))


@cache
def _kernel(eps: float, extra: bool):
    inputs = ["x", "g", "w"] + (["extra"] if extra else [])
    # eps is a literal of the source (cuda_kernel's template arguments are int / bool / dtype);
    # the extra input is named only when present, so one source serves both
    source = f"  constexpr float EPS = {eps!r}f;\n" + _SOURCE
    if not extra:
        source = source.replace("ea = *reinterpret_cast<const Vec<T, 4>*>(extra + base + col)", "(void)0")
    # a name per eps: a kernel is cached by name and template arguments
    tag = f"{'e' if extra else 'n'}_{eps:.3e}".replace(".", "p").replace("-", "m").replace("+", "")
    return mx.fast.cuda_kernel(name=f"norm_vjp_{tag}", input_names=inputs,
                               output_names=["dx"], header=_HEADER, source=source)


def norm_vjp(kind: str, x: mx.array, w: mx.array, g: mx.array, eps: float,
             extra: mx.array | None = None) -> mx.array:
    """x's gradient of `kind` ("layer" | "rms") norm(x) * w for cotangent g, plus `extra`:
    x, g, extra [..., D], w [D] -> [..., D] in x's dtype."""
    d = x.shape[-1]
    rows = x.size // d
    arrays = [x.reshape(rows, d), g.astype(x.dtype).reshape(rows, d), w.astype(x.dtype)]
    if extra is not None:
        arrays.append(extra.astype(x.dtype).reshape(rows, d))
    (dx,) = _kernel(float(eps), extra is not None)(
        inputs=arrays, template=[("T", x.dtype), ("D", d), ("LAYER", kind == "layer"),
                                 ("EXTRA", extra is not None)],
        grid=(rows * 32, 1, 1), threadgroup=(32 * _WARPS_PER_BLOCK, 1, 1),
        output_shapes=[(rows, d)], output_dtypes=[x.dtype])
    return dx.reshape(x.shape)
