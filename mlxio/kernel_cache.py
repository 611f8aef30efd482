"""Where MLX keeps the GPU kernels it compiles, and a note in the log while it compiles them.

MLX's CUDA backend compiles kernels with NVRTC on the first use of each kernel / shape and
caches the result on disk under `$MLX_PTX_CACHE_DIR` (MLX's default: /tmp/mlx/<version>/ptx,
lost with /tmp). The first step of a new shape can take minutes on a fresh machine; a run that
finds the kernels cached starts in seconds. `configure()` (run by `import mlxio`, before
`mlx.core` is imported) points MLX at a known, persistent place:

- `MLX_PTX_CACHE_DIR` set by the user: left alone;
- else `MLXIO_KERNEL_CACHE=DIR`: that folder;
- else `$XDG_CACHE_HOME/mlx-retrieval-rl/ptx` (default `~/.cache/mlx-retrieval-rl/ptx`).
`MLXIO_KERNEL_CACHE=off` keeps MLX's own default. No effect on the CPU or Metal builds (they
compile no NVRTC kernels), but harmless there.

`compile_notice(what, shape)`: wraps a call that may compile kernels (the first step of a
shape); when it is still running after `after_s` seconds a log line says that GPU kernels are
being compiled and where they are cached, and a second line gives the elapsed time when it ends.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger("mlxio")
ENV = "MLXIO_KERNEL_CACHE"


def default_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "mlx-retrieval-rl" / "ptx"


def configure(path: str | os.PathLike | None = None) -> str | None:
    """Set MLX_PTX_CACHE_DIR (see the module doc); returns the folder in use, or None for MLX's
    own default. `path` overrides MLXIO_KERNEL_CACHE. Nothing is created here (MLX creates the
    folder when it first writes a kernel). Call before the first GPU kernel is compiled (MLX
    reads the variable once, on first use)."""
    if path is None and os.environ.get("MLX_PTX_CACHE_DIR"):
        return os.environ["MLX_PTX_CACHE_DIR"]
    wanted = str(path) if path is not None else os.environ.get(ENV, "")
    if wanted == "off":
        return None
    folder = Path(wanted).expanduser().absolute() if wanted else default_dir()
    os.environ["MLX_PTX_CACHE_DIR"] = str(folder)
    return str(folder)


def cache_dir() -> str:
    """The folder MLX caches compiled kernels in (what it will use when it first compiles)."""
    if os.environ.get("MLX_PTX_CACHE_DIR"):
        return os.environ["MLX_PTX_CACHE_DIR"]
    try:
        import mlx.core as mx

        return f"/tmp/mlx/{mx.__version__}/ptx"
    except ImportError:  # pragma: no cover
        return "/tmp/mlx/<version>/ptx"


def on_gpu() -> bool:
    try:
        import mlx.core as mx

        return mx.default_device().type == mx.gpu and mx.cuda.is_available()
    except Exception:  # noqa: BLE001 (no CUDA module in this build)
        return False


_seen: set = set()


@contextmanager
def compile_notice(what: str, shape, after_s: float = 5.0, logger: logging.Logger | None = None,
                   gpu: bool | None = None):
    """Log progress when the first call of `what` at `shape` runs longer than `after_s` seconds.

    Yields True for the first call per (what, shape) in this process (the caller may evaluate
    its lazy outputs inside, so the wait is attributed to the right shape), False after. Only on
    a CUDA device (`gpu=None`: detected), where first use compiles kernels; elsewhere silent."""
    key = (what, repr(shape))
    first = key not in _seen
    _seen.add(key)
    if not first or not (on_gpu() if gpu is None else gpu):
        yield first
        return
    logger = logger or log
    start = time.perf_counter()
    slow = threading.Event()

    def announce():
        slow.set()
        logger.info("first %s for shape %s is taking a while: GPU kernels compile on first use "
                    "(cached in %s for later runs) ...", what, shape, cache_dir())

    timer = threading.Timer(after_s, announce)
    timer.daemon = True
    timer.start()
    try:
        yield True
    finally:
        timer.cancel()
        if slow.is_set():
            logger.info("first %s for shape %s: done in %.1f s", what, shape, time.perf_counter() - start)


def shapes(tree) -> tuple:
    """A hashable summary of a flat {name: array} batch: ((name, shape), ...)."""
    return tuple(sorted((k, tuple(v.shape)) for k, v in tree.items() if hasattr(v, "shape")))
