"""Compiles mlxcore's CUDA kernels once per machine (`mlxcore.kernels.cuda_jit` launches them).

NVRTC is called through ctypes - the library MLX's CUDA build ships and loads - on the
self-contained sources (no headers: a kernel compiles in well under a second), and the PTX is
cached beside MLX's own kernels (`<MLX_PTX_CACHE_DIR>/mlxcore`, the folder `mlxio.gpu.kernel_cache`
configures), keyed by a hash of the source, written atomically. `mlxio.runtime.setup()`
registers `COMPILER` with `mlxcore.kernels.cuda_jit`.
"""

from __future__ import annotations

import ctypes
import glob
import hashlib
import os
import sys
from functools import cache
from pathlib import Path

from mlxio.atomic import write_bytes_atomic
from mlxio.errors import MlxioError
from mlxio.gpu import kernel_cache


def _nvrtc_paths() -> list[str]:
    """libnvrtc candidates: the one already mapped into this process (MLX's), then the
    nvidia-cuda-nvrtc wheel's, then the system's."""
    found = []
    try:
        with open("/proc/self/maps") as maps:
            found += sorted({line.split()[-1] for line in maps if "libnvrtc.so" in line})
    except OSError:
        pass
    for root in sys.path:
        found += sorted(glob.glob(os.path.join(root, "nvidia", "**", "libnvrtc.so*"), recursive=True))
    found += sorted(glob.glob("/usr/local/cuda*/lib64/libnvrtc.so*"))
    return [p for p in found if "builtins" not in os.path.basename(p)]


@cache
def nvrtc() -> ctypes.CDLL | None:
    """The NVRTC library, or None when this machine has none (then mlxcore takes MLX's ops)."""
    for path in _nvrtc_paths():
        try:
            lib = ctypes.CDLL(path)
            lib.nvrtcCompileProgram  # noqa: B018  (the symbol must exist)
            return lib
        except (OSError, AttributeError):
            continue
    return None


def _compile(source: str, name: str) -> bytes:
    lib = nvrtc()
    prog = ctypes.c_void_p()

    def check(rc):
        if rc != 0:
            lib.nvrtcDestroyProgram(ctypes.byref(prog))
            raise RuntimeError(f"NVRTC call failed with status {rc}")

    check(lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), f"{name}.cu".encode(), 0, None, None))
    # compute_75: the oldest target CUDA 13 NVRTC accepts; the driver JITs it for the GPU at hand
    opts = [b"--gpu-architecture=compute_75", b"--std=c++17", b"-default-device"]
    rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    if rc != 0:
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, log)
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
        raise RuntimeError(f"NVRTC could not compile kernel {name}:\n{log.value.decode(errors='replace')}")
    size = ctypes.c_size_t()
    check(lib.nvrtcGetPTXSize(prog, ctypes.byref(size)))
    ptx = ctypes.create_string_buffer(size.value)
    check(lib.nvrtcGetPTX(prog, ptx))
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return ptx.raw.rstrip(b"\0") + b"\0"


def cache_dir() -> Path:
    return Path(kernel_cache.cache_dir()) / "mlxcore"


@cache
def ptx(source: str) -> bytes:
    """PTX of a CUDA source whose entry points are `extern "C" __global__` functions: read from
    the disk cache, or compiled with NVRTC and written there."""
    path = cache_dir() / f"{hashlib.sha256(source.encode()).hexdigest()[:24]}.ptx"
    if path.is_file():
        return path.read_bytes()
    code = _compile(source, path.stem)
    try:
        write_bytes_atomic(path, code, "kernel cache")
    except (OSError, MlxioError):
        pass  # a read-only cache: compile again next time
    return code


class _Compiler:
    """What `mlxcore.kernels.cuda_jit.register_compiler` expects."""

    def available(self) -> bool:
        return nvrtc() is not None

    def ptx(self, source: str) -> bytes:
        return ptx(source)


COMPILER = _Compiler()
