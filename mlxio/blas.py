"""Give MLX's Linux CPU wheel an optimised BLAS before `mlx.core` is first imported.

MLX's Linux CPU wheel links the reference BLAS bundled in `mlx_cpu.libs`, far slower than an
optimised one (benchmarks/cpu_blas.py). Loading OpenBLAS with RTLD_GLOBAL first makes the dynamic
linker resolve `cblas_sgemm` & co. to OpenBLAS instead (results equal to NumPy's).
This must run before anything imports `mlx.core`: `mlxio.runtime.setup()` calls it, and every
entry point (recipes, benchmarks, lab scripts, child processes, `tests/conftest.py`) calls
`setup()` before its imports.

No effect on macOS (Accelerate). The CUDA build (mlx-cuda) bundles the same reference BLAS for
its CPU stream, but is left alone unless `MLXIO_BLAS=/path/libopenblas.so.0` names a library
(e.g. for CPU query encoding on a GPU machine, slow with the reference BLAS). Set `MLXIO_BLAS=off` to keep the reference BLAS
(e.g. to measure it) or `MLXIO_BLAS=/path/libopenblas.so.0` to choose one.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import importlib.metadata
import logging
import os
import platform
import sys
from collections.abc import Iterator

log = logging.getLogger("mlxio")

_CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib/aarch64-linux-gnu/openblas-pthread/libopenblas.so.0",
    "/usr/lib64/libopenblas.so.0",
    "/usr/lib/libopenblas.so.0",
)
INSTALL_HINT = "install it with `apt-get install libopenblas0-pthread` (Debian/Ubuntu) or `dnf install openblas`"

# What happened, for logs and benchmarks: "openblas:<path>", "reference", "not-needed:<why>".
status: str = "unset"


def _has_cuda_build() -> bool:
    for dist in ("mlx-cuda", "mlx-cuda-12", "mlx-cuda-13"):
        try:
            importlib.metadata.distribution(dist)
            return True
        except importlib.metadata.PackageNotFoundError:
            pass
    return False


def find_openblas() -> str | None:
    """Path of a system OpenBLAS shared library, or None."""
    for path in _CANDIDATES:
        if os.path.exists(path):
            return path
    return ctypes.util.find_library("openblas")


def ensure_fast_blas() -> str:
    """Preload OpenBLAS for MLX's CPU backend once; returns and logs what is in use."""
    global status
    if status != "unset":
        return status
    wanted = os.environ.get("MLXIO_BLAS", "auto")
    if platform.system() != "Linux":
        status = "not-needed:" + platform.system()
    elif _has_cuda_build() and wanted in ("auto", "off"):
        status = "not-needed:cuda"
    elif wanted == "off":
        status = "reference"
        log.info("BLAS: MLX's reference BLAS (MLXIO_BLAS=off)")
    elif "mlx.core" in sys.modules:
        status = "reference"
        log.warning(
            "BLAS: mlx.core was imported before mlxio.runtime.setup(), so MLX keeps its slow "
            "reference BLAS (~25-30x slower matmul); call setup() first thing in the program"
        )
    else:
        path = wanted if wanted != "auto" else find_openblas()
        if path is None:
            status = "reference"
            log.warning("BLAS: no OpenBLAS found; MLX's CPU matmuls will be ~25-30x slower: %s", INSTALL_HINT)
        else:
            try:
                ctypes.CDLL(path, mode=os.RTLD_GLOBAL)
            except OSError as err:
                status = "reference"
                log.warning("BLAS: could not load %s (%s); %s", path, err, INSTALL_HINT)
            else:
                status = "openblas:" + path
                log.info("BLAS: OpenBLAS %s", path)
    return status


SETUP_HINT = ("call `from mlxio.runtime import setup; setup()` first thing in the program (in a notebook, "
              "its first cell, then restart the kernel), before anything imports mlx")
_checked: list[bool] = []


def check_fast_blas() -> str:
    """For the library's entry points that load a model (`load_encoder`, `load_policy`): in a
    program that never called `mlxio.runtime.setup()`, the fast BLAS when MLX is not imported
    yet, and otherwise one warning per process (MLX's CPU wheel then runs its reference BLAS,
    far slower matmuls) naming the call that fixes it. Returns `status`."""
    if status != "unset" or _checked:
        return status
    _checked.append(True)
    if "mlx.core" not in sys.modules:
        return ensure_fast_blas()
    if platform.system() == "Linux" and not _has_cuda_build() and os.environ.get("MLXIO_BLAS", "auto") != "off":
        import warnings

        warnings.warn(f"mlxio: mlx was imported before mlxio.runtime.setup(), so MLX's CPU matmuls run on its "
                      f"reference BLAS (~25-30x slower): {SETUP_HINT}", RuntimeWarning, stacklevel=3)
    return status


@functools.cache
def _controller():
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Every loaded BLAS (NumPy's, MLX's OpenBLAS) on one thread inside the block: for many small
    products run from a pool of Python threads, one per core. OpenBLAS threads any product above
    ~262,144 multiply-adds, and a document x query product (~125 x 384 x 15) is above that:
    a batched search on 2 cores ran several times slower with OpenBLAS's 2 threads than with 1
    (dev/LOG.md)."""
    with _controller().limit(limits=1, user_api="blas"):
        yield
