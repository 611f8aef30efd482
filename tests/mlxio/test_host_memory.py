"""mlxio.host_memory: with freed memory kept, a buffer freed and asked for again comes back
without fresh pages; with glibc's defaults (MLXIO_MALLOC=glibc) a large one is unmapped and
faults in again; a bad MLXIO_MALLOC is named."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from mlxio import host_memory

pytestmark = pytest.mark.skipif(sys.platform != "linux" or platform.libc_ver()[0] != "glibc",
                                reason="glibc's malloc only")

# a child: 64 MiB malloc'd, written, freed, malloc'd and written again; the second write's
# minor page faults (a fresh mapping: one per 4 KiB page, ~16,000)
CHILD = r"""
import ctypes, resource, sys
from mlxio import host_memory
print(host_memory.keep_freed_memory() if sys.argv[1] == "call" else "not-called")
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
n = 64 << 20
p = libc.malloc(n); ctypes.memset(p, 1, n); libc.free(p)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
p = libc.malloc(n); ctypes.memset(p, 2, n); libc.free(p)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def second_touch_faults(call: bool, malloc: str | None = None) -> tuple[str, int]:
    env = {k: v for k, v in os.environ.items() if k != "MLXIO_MALLOC"} | ({"MLXIO_MALLOC": malloc} if malloc else {})
    out = subprocess.run([sys.executable, "-c", CHILD, "call" if call else "no"], capture_output=True,
                         text=True, env=env, check=True).stdout.split()
    return out[0], int(out[1])


def test_freed_memory_is_reused_without_fresh_pages():
    status, faults = second_touch_faults(call=True)
    assert status == "kept"
    assert faults < 500  # the same pages again (a few for the interpreter's own work)


def test_glibc_defaults_fault_a_large_buffer_in_again():
    opted_out = second_touch_faults(call=True, malloc="glibc")
    assert opted_out[0] == "glibc-defaults:MLXIO_MALLOC=glibc"
    for status, faults in (second_touch_faults(call=False), opted_out):
        assert faults > 10_000, (status, faults)  # 64 MiB of fresh 4 KiB pages


def test_setup_keeps_freed_memory_on_the_cpu():
    import mlx.core as mx

    if mx.default_device() != mx.cpu:
        pytest.skip("MLX runs on a GPU here")
    assert host_memory.status == "kept"  # tests/conftest.py ran mlxio.runtime.setup()


def test_a_bad_setting_is_named(monkeypatch):
    monkeypatch.setenv("MLXIO_MALLOC", "jemalloc")
    with pytest.raises(ValueError, match="MLXIO_MALLOC='jemalloc': give 'keep'"):
        host_memory.keep_freed_memory()
