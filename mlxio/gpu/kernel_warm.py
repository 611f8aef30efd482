"""Parallel warm-up of MLX's CUDA kernel cache for the RLAIF recipe's first step.

MLX's CUDA backend compiles a kernel module with NVRTC the first time it is used, one after
another (a process-wide lock), seconds each, and keeps it on disk
(`mlxio.gpu.kernel_cache`). Modules are named by what they compute and their dtypes, not by array
shapes: `gather_float32_int32_1` holds that gather for every index rank and size. So a graph
of a few tiny arrays compiles the same module as the real step - and separate processes
compile in parallel. `start(jobs)` launches one child process per module (`python -m
mlxio.gpu.kernel_warm KEY`: imports MLX alone, builds `module_graph(KEY)`, evaluates it, exits),
each with its own empty staging folder as MLX's cache; when a child ends, its module moves into
the run's cache folder, where the recipe's process finds it when it first needs it (it compiles
any it needs sooner itself: the same bytes).

Why one child per module (a first design ran one child per step - the sampler, decode,
prefill, update - and gained little; dev/LOG.md): each such child imported the whole stack (mlx-lm, transformers, torch)
as the recipe does, built a tiny model and then compiled the same shared modules (gathers, the
sampler's) one after another in the order the recipe needs them, so it was never ahead of the
recipe's own serial compilation, and its modules moved only when the whole job ended (the
update job: late, with modules still new). Per module, the children finish in about start-up
+ one compilation, in parallel, while the recipe loads.

A module is moved once complete: MLX writes `.ptx` (the cubin), `.txt` (kernel names), then
the `.cu` source; the `.txt` goes first and the `.ptx` last, each with an atomic rename, so a
reader that finds the `.ptx` finds both whole.

A module key (`module_keys` reads them off `kernel_cache.traced_ops`): ("gather", data dtype,
index dtype, index arrays), ("gather_axis", data, index), ("scatter_axis", data, index,
reduction), ("dynamic_offset", offset dtype, axes). Off unless MLXIO_KERNEL_PREWARM=1 (the
recipe calls `for_rlaif`); only on a CUDA device, for the eager steps.
"""

from __future__ import annotations

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # first: MLX's CPU BLAS is chosen when mlx.core loads (mlxio.runtime)

import atexit
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from mlxio import atomic

log = logging.getLogger("mlxio")
ENV = "MLXIO_KERNEL_PREWARM"


def enabled() -> bool:
    return os.environ.get(ENV, "") not in ("", "0", "false", "off")


def module_keys(ops: list) -> set[tuple]:
    """The CUDA kernel modules (keys, see the module doc) that `kernel_cache.traced_ops`' gathers,
    scatters and dynamic slice updates need; other primitives use MLX's precompiled kernels,
    except `mx.compile`d fusions and reducing slice updates (`kernel_cache.unfused`,
    `kernel_cache.reducing_updates`)."""
    keys = set()
    for name, dtypes, args in ops:
        if name == "Gather":
            keys.add(("gather", dtypes[0], dtypes[1] if len(dtypes) > 1 else "int32", len(dtypes) - 1))
        elif name == "GatherAxis":
            keys.add(("gather_axis", dtypes[0], dtypes[1]))
        elif name == "ScatterAxis":
            keys.add(("scatter_axis", dtypes[0], dtypes[1], args[0]))
        elif name == "Scatter":
            keys.add(("scatter", dtypes[0], dtypes[1], len(dtypes) - 2, args[0]))
        elif name == "DynamicSliceUpdate":
            keys.add(("dynamic_offset", dtypes[2], len(args[0])))
        elif name == "DynamicSlice":
            keys.add(("dynamic_offset", dtypes[1], len(args[0])))
    return keys


_SUM = 0  # ScatterAxis' reduction in a traced graph: 0 sums (a take_along_axis' gradient)


def module_graph(key) -> list:
    """Tiny arrays whose evaluation compiles the CUDA module `key` (and nothing but precompiled
    kernels besides)."""
    import mlx.core as mx

    kind, *rest = key
    if kind == "gather":
        data, index, n = rest
        return [mx.zeros((2,) * n, getattr(mx, data))[tuple(mx.zeros((1,), getattr(mx, index)) for _ in range(n))]]
    if kind == "gather_axis":
        data, index = rest
        return [mx.take_along_axis(mx.zeros((2, 2), getattr(mx, data)), mx.zeros((2, 1), getattr(mx, index)), axis=-1)]
    if kind == "scatter_axis" and rest[2] == _SUM:
        data, index, _ = rest
        idx = mx.zeros((2, 1), getattr(mx, index))
        return [mx.grad(lambda x: mx.take_along_axis(x, idx, axis=-1).sum())(mx.zeros((2, 2), getattr(mx, data)))]
    if kind == "dynamic_offset":
        index, n = rest
        return [mx.slice_update(mx.zeros((2,) * n), mx.ones((1,) * n), mx.zeros((n,), getattr(mx, index)),
                                axes=tuple(range(n)))]
    raise ValueError(f"no warm-up graph for kernel module {key}")


def rlaif_modules(dtype: str = "float32") -> list[tuple]:
    """The modules of the RLAIF recipe's eager rollout and update for a `dtype` policy (the
    dequantised GGUF default: float32), as a fresh H100 run's kernel cache listed them, less
    those the recipe no longer needs (tests/mlxio/gpu/test_kernel_modules.py checks the traced steps need
    no other)."""
    return [("gather", dtype, "int32", 1),  # embedding lookups, the static cache's rows
            ("gather", "int32", "int32", 1),  # the rows' left padding
            ("gather", "int32", "uint32", 1),  # in the H100 run's cache; its op is not in the CPU graphs
            ("gather_axis", dtype, "int32"),  # picked log-probs, the top-p threshold
            ("scatter_axis", dtype, "int32", _SUM),  # the gradient of the picked log-probs
            ("dynamic_offset", "int32", 1)]  # the KV cache written at a position array


def rlaif_jobs(compute_dtype: str = "auto") -> list[tuple]:
    """The modules to warm for the RLAIF recipe's first step: a dequantised policy's are float32
    ones, a half-precision base's (`compute_dtype`, the recipe's `memory.compute_dtype`) its
    dtype's as well (the log-probs stay float32); a quantised policy (QLoRA) needs more, which
    it compiles itself."""
    jobs = rlaif_modules("float32")
    if compute_dtype in ("bfloat16", "float16"):
        jobs += [key for key in rlaif_modules(compute_dtype) if key not in jobs]
    return jobs


# ---- the parent side

def move_finished(staging: Path, dest: Path) -> int:
    """Move each complete module (its `.cu` written: MLX writes it last) from `staging` into
    `dest`, `.txt` before `.ptx`; modules `dest` already holds are left. Returns modules moved."""
    moved = 0
    for cu in sorted(staging.rglob("*.cu")):
        ptx, txt = cu.with_suffix(".ptx"), cu.with_suffix(".txt")
        if not (ptx.is_file() and txt.is_file()):
            continue
        target = dest / ptx.relative_to(staging)
        if target.exists():
            continue
        folder = dest
        for part in ptx.relative_to(staging).parts[:-1]:  # never through a link planted in the cache
            folder = atomic.run_dir(folder / part, "kernel cache folder")
        for src in (txt, cu, ptx):  # the .ptx last: a reader that sees it finds the .txt
            final = target.with_suffix(src.suffix)
            tmp = atomic.temp_sibling(final)
            with open(src, "rb") as source, os.fdopen(atomic.open_new(tmp, "kernel"), "wb") as out:
                shutil.copyfileobj(source, out)
            atomic.replace_file(tmp, final, "kernel")
        moved += 1
    return moved


class Prewarm:
    """The children of one `start` call: `wait()` joins them (moving their modules); `stop()`
    ends those still running. `moved`: modules moved so far; `seconds`: per job, its run time."""

    def __init__(self, procs: list, dest: Path, root: Path):
        self.procs, self.dest, self.root = procs, dest, root
        self.moved, self.seconds, self.codes = 0, {}, {}
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._collect, args=p, daemon=True) for p in procs]
        for t in self._threads:
            t.start()

    def _collect(self, name: str, proc: subprocess.Popen, staging: Path, start: float) -> None:
        code = proc.wait()
        n = move_finished(staging, self.dest)
        with self._lock:
            self.moved += n
            self.seconds[name] = round(time.perf_counter() - start, 1)
            self.codes[name] = code
        log.info("kernel prewarm %s: %d module(s) compiled in %.1f s%s", name, n, self.seconds[name],
                 "" if code == 0 else f" (exit code {code})")

    def wait(self, timeout: float | None = None) -> None:
        end = None if timeout is None else time.perf_counter() + timeout
        for t in self._threads:
            t.join(None if end is None else max(0.0, end - time.perf_counter()))

    def stop(self) -> None:
        for _, proc, _, _ in self.procs:
            if proc.poll() is None:
                proc.terminate()
        shutil.rmtree(self.root, ignore_errors=True)


def start(jobs: list[tuple], dest: str | os.PathLike) -> Prewarm:
    """Launch one child per module key; their modules move into `dest` (MLX's cache folder)."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix=".prewarm-", dir=dest.parent))  # same file system as dest
    procs = []
    for i, key in enumerate(jobs):
        staging = root / str(i)
        staging.mkdir()
        env = {**os.environ, "MLX_PTX_CACHE_DIR": str(staging), "MLXIO_KERNEL_CACHE": str(staging)}
        env.pop(ENV, None)
        proc = subprocess.Popen([sys.executable, "-m", "mlxio.gpu.kernel_warm", json.dumps(key)], env=env,
                                stdout=subprocess.DEVNULL, stderr=open(staging / "log.txt", "w"))
        procs.append(("_".join(map(str, key)), proc, staging, time.perf_counter()))
    warm = Prewarm(procs, dest, root)
    atexit.register(warm.stop)
    return warm


def for_rlaif(compute_dtype: str, jit: bool) -> Prewarm | None:
    """`start(rlaif_jobs(compute_dtype))` into the kernel cache in use when enabled
    (MLXIO_KERNEL_PREWARM=1), on a CUDA device, for the eager steps (`jit` False); else None."""
    from mlxio.gpu import kernel_cache

    if not enabled() or jit or not kernel_cache.on_gpu():
        return None
    jobs = rlaif_jobs(compute_dtype)
    log.info("kernel prewarm: %d child processes compile the first step's kernel modules into %s",
             len(jobs), kernel_cache.cache_dir())
    return start(jobs, kernel_cache.cache_dir())


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    import mlx.core as mx  # (MLX alone: the cache folder comes from MLX_PTX_CACHE_DIR, set by the parent)

    mx.eval(module_graph(tuple(json.loads(argv[0]))))


if __name__ == "__main__":
    main()
