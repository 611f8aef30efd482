"""Our CUDA kernels, compiled once per machine and kept on disk.

`mx.fast.cuda_kernel` compiles its source with NVRTC in every process, MLX's device headers
included, and never writes the result to MLX's on-disk kernel cache: ~2 s a kernel at every
start (the retriever's quick run reached its first step 5.5 s later warm, 11 s later cold, with
three such kernels; benchmarks/results/h100/cold_start_retriever_session9.json). Here the
sources are self-contained (bfloat16 handled as 16-bit integers, no headers), NVRTC is called
through ctypes - the library MLX's CUDA build ships and loads - and the PTX is cached beside
MLX's own kernels (`$MLX_PTX_CACHE_DIR/mlxcore`, which mlxio points at its persistent folder),
keyed by a hash of the source. Kernels run through `mx.fast.precompiled_cuda_kernel`.
"""

from __future__ import annotations

import ctypes
import glob
import hashlib
import os
import struct
import sys
from functools import cache
from pathlib import Path

import mlx.core as mx

# 16-bit storage of bfloat16 and the float conversions, shared by every kernel
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


def _cache_dir() -> Path:
    base = os.environ.get("MLX_PTX_CACHE_DIR") or f"/tmp/mlx/{mx.__version__}/ptx"
    return Path(base) / "mlxcore"


def _nvrtc_paths() -> list[str]:
    """libnvrtc candidates: the one already mapped into this process (MLX's), then the
    nvidia-cuda-nvrtc wheel's, then the system's."""
    found = []
    try:
        with open("/proc/self/maps") as maps:
            found += sorted({line.split()[-1] for line in maps if "libnvrtc.so" in line and "builtins" not in line})
    except OSError:
        pass
    for root in sys.path:
        found += sorted(glob.glob(os.path.join(root, "nvidia", "**", "libnvrtc.so*"), recursive=True))
    found += sorted(glob.glob("/usr/local/cuda*/lib64/libnvrtc.so*"))
    return [p for p in found if "builtins" not in os.path.basename(p)]


@cache
def nvrtc() -> ctypes.CDLL | None:
    """The NVRTC library, or None when this machine has none (then callers fall back)."""
    for path in _nvrtc_paths():
        try:
            lib = ctypes.CDLL(path)
            lib.nvrtcCompileProgram  # noqa: B018  (the symbol must exist)
            return lib
        except (OSError, AttributeError):
            continue
    return None


def on_cuda() -> bool:
    """True when the default device is a GPU of MLX's CUDA build (not Metal, not the CPU)."""
    cuda = getattr(mx, "cuda", None)  # absent from some builds
    return mx.default_device() == mx.gpu and cuda is not None and cuda.is_available()


def available() -> bool:
    """True on MLX's CUDA build, GPU stream, with an NVRTC library to compile our kernels."""
    return on_cuda() and nvrtc() is not None


def _compile(source: str, name: str) -> bytes:
    lib = nvrtc()
    prog = ctypes.c_void_p()
    check = _checker(lib, prog)
    check(lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), f"{name}.cu".encode(), 0, None, None))
    # compute_75: the oldest target CUDA 13 NVRTC accepts; the driver JITs it for the GPU at hand
    opts = [b"--gpu-architecture=compute_75", b"--std=c++17", b"-default-device"]
    rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    if rc != 0:
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, log)
        raise RuntimeError(f"NVRTC could not compile kernel {name}:\n{log.value.decode(errors='replace')}")
    size = ctypes.c_size_t()
    check(lib.nvrtcGetPTXSize(prog, ctypes.byref(size)))
    ptx = ctypes.create_string_buffer(size.value)
    check(lib.nvrtcGetPTX(prog, ptx))
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return ptx.raw.rstrip(b"\0") + b"\0"


def _checker(lib, prog):
    def check(rc):
        if rc != 0:
            lib.nvrtcDestroyProgram(ctypes.byref(prog))
            raise RuntimeError(f"NVRTC call failed with status {rc}")
    return check


@cache
def ptx(source: str) -> bytes:
    """PTX of `PRELUDE + source` (whose entry points are `extern "C" __global__` functions):
    read from the disk cache, or compiled with NVRTC and written there (atomically)."""
    full = PRELUDE + source
    path = _cache_dir() / f"{hashlib.sha256(full.encode()).hexdigest()[:24]}.ptx"
    if path.is_file():
        return path.read_bytes()
    code = _compile(full, path.stem)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_bytes(code)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only cache: compile again next time
    return code


def float_bits(x: float) -> int:
    """A float32 scalar argument as its int32 bits (the kernel takes `int` and reads it with
    `__int_as_float`): MLX 0.32.4's precompiled_cuda_kernel rejects Python float scalars."""
    return struct.unpack("<i", struct.pack("<f", x))[0]


def launch(name: str, source: str, inputs: list, outputs: list[tuple[tuple[int, ...], mx.Dtype]],
           scalars: list, threads: int, block: int = 128) -> list[mx.array]:
    """Run entry point `name` of `source` (see `ptx`) over `threads` threads in blocks of `block`; outputs are
    (shape, dtype) pairs, scalars are appended to the arguments after the output pointers."""
    return mx.fast.precompiled_cuda_kernel(
        name=name, compiled_source=ptx(source), inputs=inputs,
        output_shapes=[s for s, _ in outputs], output_dtypes=[d for _, d in outputs], scalars=scalars,
        grid=(threads, 1, 1), threadgroup=(min(block, threads), 1, 1), ensure_row_contiguous=True)
