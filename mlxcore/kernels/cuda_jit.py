"""Launching our CUDA kernels, compiled by whatever compiler the I/O layer registers.

The kernels' sources (norm_cuda, maxsim_cuda) are self-contained - `PRELUDE` plus a template
and `extern "C"` entry points, bfloat16 handled as 16-bit integers, no headers - and run through
`mx.fast.precompiled_cuda_kernel`. Turning a source into PTX is I/O (a C library, a disk cache),
so it lives in `mlxio.gpu.cuda_build`, which `mlxio.runtime.setup()` registers here (`register_compiler`).
Why not `mx.fast.cuda_kernel`: it recompiles its source with NVRTC in every process, MLX's
device headers included, and never keeps the result (seconds a kernel at every start: dev/LOG.md).
Without a registered compiler, or off MLX's CUDA build, `available()` is False and the callers
take their MLX-ops paths.
"""

from __future__ import annotations

import struct
from typing import Protocol

import mlx.core as mx

PRELUDE = r"""
typedef unsigned short bf16;
__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(bf16 v) { return __uint_as_float(((unsigned int)v) << 16); }
__device__ __forceinline__ void store(float& d, float f) { d = f; }
__device__ __forceinline__ void store(bf16& d, float f) {
  unsigned int u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) { d = (bf16)((u >> 16) | 0x40u); return; }  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  d = (bf16)(u >> 16);
}
template <typename T, int N> struct alignas(sizeof(T) * N) Vec { T v[N]; };
__device__ __forceinline__ float warp_sum(float v) {
  #pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
"""

STORAGE = {mx.float32: "float", mx.bfloat16: "bf16"}


class Compiler(Protocol):
    """Turns a kernel source into PTX (`mlxio.gpu.cuda_build.COMPILER`)."""

    def available(self) -> bool: ...

    def ptx(self, source: str) -> bytes: ...


_compiler: list[Compiler] = []


def register_compiler(compiler: Compiler) -> None:
    """Use `compiler` (`.available()`, `.ptx(PRELUDE + source)`) for every kernel from now on."""
    _compiler[:] = [compiler]


def on_cuda() -> bool:
    """True when the default device is a GPU of MLX's CUDA build (not Metal, not the CPU)."""
    cuda = getattr(mx, "cuda", None)  # absent from some builds
    return mx.default_device() == mx.gpu and cuda is not None and cuda.is_available()


def available() -> bool:
    """True on MLX's CUDA build, GPU stream, with a registered compiler that can build kernels."""
    return on_cuda() and bool(_compiler) and _compiler[0].available()


def float_bits(x: float) -> int:
    """A float32 scalar argument as its int32 bits (the kernel takes `int` and reads it with
    `__int_as_float`): MLX 0.32.4's precompiled_cuda_kernel rejects Python float scalars."""
    return struct.unpack("<i", struct.pack("<f", x))[0]


def entry(name: str, params: str, call: str) -> str:
    """The line declaring kernel `name(params)` as an `extern "C"` entry point whose body is the
    statement `call` (typically a template instantiation: `relu_bits<bf16>(x, y, bits, n);`)."""
    return f'extern "C" __global__ void {name}({params}) {{ {call} }}\n'


def launch(name: str, source: str, inputs: list, outputs: list[tuple[tuple[int, ...], mx.Dtype]],
           scalars: list, threads: int, block: int = 128) -> list[mx.array]:
    """Run entry point `name` of `PRELUDE + source` over `threads` threads in blocks of `block`;
    outputs are (shape, dtype) pairs, scalars are appended after the output pointers."""
    if not _compiler:
        raise RuntimeError("no CUDA kernel compiler registered (call mlxio.runtime.setup() first)")
    return mx.fast.precompiled_cuda_kernel(
        name=name, compiled_source=_compiler[0].ptx(PRELUDE + source), inputs=inputs,
        output_shapes=[s for s, _ in outputs], output_dtypes=[d for _, d in outputs], scalars=scalars,
        grid=(threads, 1, 1), threadgroup=(min(block, threads), 1, 1), ensure_row_contiguous=True)
