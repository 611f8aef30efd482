"""The process's one-time set-up: `setup()`, called by every entry point before it imports MLX.

Importing the project's packages changes nothing in the process; a program that runs MLX work
calls `setup()` once, first thing. Each recipe, benchmark, lab script and child process does so
at the top of its file, before its imports, guarded by `if __name__ == "__main__":` (so
importing the module as a library still changes nothing); `tests/conftest.py` does for pytest
(tests/test_entry_points.py checks them all). It:

1. gives MLX's Linux CPU wheel an optimised BLAS (`mlxio.blas.ensure_fast_blas`). This one
   has a deadline: the dynamic linker binds MLX's BLAS when `mlx.core` is first imported, so
   called later it leaves the reference BLAS in place (far slower matmuls) and logs a warning;
2. points MLX's on-disk GPU kernel cache at a persistent folder (`mlxio.gpu.kernel_cache.configure`:
   MLX reads MLX_PTX_CACHE_DIR when it first compiles a kernel);
3. gives mlxcore's own CUDA kernels their compiler (`mlxio.gpu.cuda_build` into `mlxcore.kernels.cuda_jit`)
   and, where it is built, the fused feed-forward its GEMM (`mlxio.gpu.cuda_ext` into
   `mlxcore.kernels.ffn_cuda`). These import MLX, after step 1;
4. with MLXIO_CACHE_LIMIT_MB set, caps what MLX's allocator keeps of freed buffers
   (`mx.set_cache_limit`): processes that share one GPU (`benchmarks/xtr_heldout_packages.py
   --jobs`) hand freed memory back instead of each keeping its own pool;
5. where MLX runs on the CPU of a Linux machine, has glibc reuse freed memory instead of
   handing it back to the kernel (`mlxio.host_memory.keep_freed_memory`; MLXIO_MALLOC=glibc
   leaves glibc's defaults).

A second call does nothing (it returns the first call's BLAS status).
"""

from __future__ import annotations

import os
import sys

from mlxio import blas, host_memory
from mlxio.gpu import kernel_cache

_done: list[str] = []  # the BLAS status of the first call, once it has run


def setup() -> str:
    """Set up this process for MLX (see the module doc); idempotent. Returns the BLAS in use
    (`mlxio.blas.status`: "openblas:<path>", "reference" or "not-needed:<why>")."""
    if _done:
        return _done[0]
    status = blas.ensure_fast_blas()
    kernel_cache.configure()
    import mlx.core as mx  # (this and the next import MLX: after the BLAS)

    from mlxcore.kernels import cuda_jit, ffn_cuda
    from mlxio.gpu import cuda_ext
    from mlxio.gpu.cuda_build import COMPILER

    cuda_jit.register_compiler(COMPILER)
    if cuda_ext.load() is not None:
        ffn_cuda.register_extension(cuda_ext.load())
    try:
        if limit := os.environ.get("MLXIO_CACHE_LIMIT_MB"):
            if not (limit.isascii() and limit.isdigit()) or len(limit) > 12:  # at most 10^12 MB: past any machine
                raise ValueError(f"MLXIO_CACHE_LIMIT_MB={limit[:40]!r}: give a whole number of megabytes (0 to "
                                 "999999999999), or unset it")
            mx.set_cache_limit(int(limit) << 20)
        if mx.default_device() == mx.cpu:
            host_memory.keep_freed_memory()
    except ValueError as err:  # a mistake in the environment: one line, before any work
        sys.exit(f"error: {err}")
    _done.append(status)
    return status
