"""Keep freed host memory in the process, for MLX on a Linux CPU.

MLX's CPU backend takes every array's buffer from malloc and frees it when the array goes. glibc
serves large requests with their own mmap (past its dynamic threshold, at most 32 MiB) and
gives freed memory back to the kernel (munmap, heap trimming), so the next step's buffers of the
same sizes arrive as fresh pages, each one zero-filled by the kernel on first touch: about ten
times the minor page faults of a run that keeps freed memory, more CPU time in the kernel, and a
slower run (`benchmarks/cpu_malloc.py`, benchmarks/results/cpu/cpu_malloc.json).

`keep_freed_memory()` tells glibc (mallopt) to serve every request from its heap and never trim
it: freed buffers are reused in place. The process's resident set stays at its peak instead of
shrinking between steps; the peak itself does not change. `mlxio.runtime.setup()` calls it when
MLX runs on the CPU (not on a GPU, whose buffers MLX caches itself, and not on macOS).
`MLXIO_MALLOC=glibc` leaves glibc's defaults (e.g. to measure them).
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys

# mallopt parameters (glibc's malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
NEVER_TRIM = 2**31 - 1  # mallopt takes an int: the largest top-of-heap glibc keeps untrimmed

status: str = "unset"  # "kept", or why not: for logs and benchmarks


def keep_freed_memory() -> str:
    """No mmap'd allocations and no heap trimming in this process (glibc on Linux); returns
    the status: "kept", or "not-needed:<why>" / "glibc-defaults:MLXIO_MALLOC=glibc"."""
    global status
    choice = os.environ.get("MLXIO_MALLOC", "keep")
    if choice not in ("keep", "glibc"):
        raise ValueError(f"MLXIO_MALLOC={choice!r}: give 'keep' (the default: reuse freed memory) or 'glibc' "
                         "(glibc's defaults), or unset it")
    if choice == "glibc":
        status = "glibc-defaults:MLXIO_MALLOC=glibc"
    elif sys.platform != "linux" or platform.libc_ver()[0] != "glibc":
        status = f"not-needed:{sys.platform} without glibc"
    else:
        libc = ctypes.CDLL(None)
        ok = libc.mallopt(M_MMAP_MAX, 0) == 1 and libc.mallopt(M_TRIM_THRESHOLD, NEVER_TRIM) == 1
        status = "kept" if ok else "not-needed:mallopt refused"
    return status
