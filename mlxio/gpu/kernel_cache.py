"""Where MLX keeps the GPU kernels it compiles, and a note in the log while it compiles them.

MLX's CUDA backend compiles kernels with NVRTC on the first use of each kernel / shape and
caches the result on disk under `$MLX_PTX_CACHE_DIR` (MLX's default: /tmp/mlx/<version>/ptx,
lost with /tmp). The first step of a new shape can take minutes on a fresh machine; a run that
finds the kernels cached starts in seconds. `configure()` (run by `mlxio.runtime.setup()`,
before `mlx.core` is imported) points MLX at a known, persistent place:

- `MLX_PTX_CACHE_DIR` set by the user: left alone;
- else `MLXIO_KERNEL_CACHE=DIR`: that folder;
- else `$XDG_CACHE_HOME/mlx-retrieval-rl/ptx` (default `~/.cache/mlx-retrieval-rl/ptx`).
`MLXIO_KERNEL_CACHE=off` keeps MLX's own default. No effect on the CPU or Metal builds (they
compile no NVRTC kernels), but harmless there.

`export_cache(archive)` / `import_cache(archive)` (CLI: `python -m mlxio.gpu.kernel_cache_cli export|import|info`)
carry a warm cache to another machine with the same MLX version and GPU architecture (compute
capability: an H100's kernels serve an H200), whose first run then starts as a warm one (a team
builds it once, e.g. on a GPU CI runner, and shares it). MLX keeps per kernel module a `.ptx`
(SASS cubin), a `.txt` (kernel names) and the `.cu` source; the archive holds the first two.

`compile_notice(what, shape)`: wraps a call that may compile kernels (the first step of a
shape); when it is still running after `after_s` seconds a log line says that GPU kernels are
being compiled and where they are cached, and a second line gives the elapsed time when it ends.
"""

from __future__ import annotations

import io
import json
import logging
import os
import stat
import subprocess
import tarfile
import threading
import time
import zlib
from contextlib import contextmanager, suppress
from pathlib import Path

from mlxio.atomic import check_slot, open_new, replace_file, run_dir, temp_sibling
from mlxio.errors import DataError
from mlxio.inputs import kind_of, size_text

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


def use_compile(setting: bool | None) -> bool:
    """A recipe's `compile` setting: True / False as given; None (auto) compiles everywhere but on
    a CUDA device. There a fresh machine compiles each of a step's fused kernels with NVRTC, one
    after another (seconds each; the RLAIF quick run's compiled update step has dozens of distinct
    ones: dev/LOG.md), while an eager step needs only its
    few gather / scatter kernels and runs about as fast once they are cached."""
    return bool(setting) if setting is not None else not on_gpu()


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


MANIFEST = "kernel_cache.json"


def contents(folder: str | os.PathLike) -> dict:
    """{"files", "bytes"} of every file under `folder` (zeros when it does not exist)."""
    files = [p for p in Path(folder).rglob("*") if p.is_file()] if Path(folder).is_dir() else []
    return {"files": len(files), "bytes": sum(p.stat().st_size for p in files)}


def _gpu_arch() -> str | None:
    """The first GPU's compute capability ("9.0" on an H100 or H200: MLX compiles its kernels to
    that architecture's SASS), from nvidia-smi; None without a GPU."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.splitlines()[0].strip() if out else None


def _mlx_version() -> str:
    import mlx.core as mx

    return mx.__version__


def export_cache(archive: str | os.PathLike, folder: str | None = None) -> dict:
    """Write the kernel cache `folder` (default: the one in use) to `archive` (.tar.gz) with a
    manifest {mlx, gpu_arch, files, bytes}; returns the manifest. The `.cu` sources stay behind
    (MLX loads a module from its `.ptx` and `.txt`). DataError on an empty cache."""
    folder = Path(folder or cache_dir())
    files = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix != ".cu") if folder.is_dir() else []
    if not files:
        raise DataError(f"no compiled kernels in {folder}", fix="run a recipe on the GPU first (it fills the cache)")
    manifest = {"mlx": _mlx_version(), "gpu_arch": _gpu_arch(), "files": len(files),
                "bytes": sum(p.stat().st_size for p in files)}
    archive = check_slot(archive, "kernel cache archive")  # a link or device there: refused before any work
    tmp = temp_sibling(archive)
    with os.fdopen(open_new(tmp, "kernel cache archive"), "wb") as handle, tarfile.open(fileobj=handle, mode="w:gz") as tar:
        data = json.dumps(manifest).encode()
        info = tarfile.TarInfo(MANIFEST)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        for p in files:
            tar.add(p, arcname=f"ptx/{p.relative_to(folder)}")
    replace_file(tmp, archive, "kernel cache archive")
    return manifest


# What an archive may hold, checked from its headers before anything is unpacked (a real
# cache: a few hundred files, about a hundred MB unpacked).
MAX_ARCHIVE_BYTES = 1 << 30
MAX_MEMBERS = 100_000
MAX_UNPACKED_BYTES = 4 << 30
MAX_MANIFEST_BYTES = 64 << 10
_MAKE_ONE = "make one with `python -m mlxio.gpu.kernel_cache_cli export FILE`"


def import_cache(archive: str | os.PathLike, folder: str | None = None, check: bool = True) -> dict:
    """Unpack an `export_cache` archive into the kernel cache `folder` (default: the one in use);
    kernels already there are kept. With `check`, refuses (DataError) an archive built by another
    MLX version or for another GPU architecture: their kernels would not load, or not be the same
    ones. The archive must be a regular file of at most MAX_ARCHIVE_BYTES holding a JSON-object
    manifest and regular files under `ptx/` (normalised names), at most MAX_MEMBERS of them and
    MAX_UNPACKED_BYTES in all (`archive_members`): anything else is one DataError line."""
    archive = Path(archive)
    fd = _open_archive(archive)
    with os.fdopen(fd, "rb") as handle:
        try:
            tar = tarfile.open(fileobj=handle, mode="r:*")
        except (OSError, EOFError, tarfile.TarError, zlib.error) as err:
            raise DataError(f"not a kernel cache archive: not a tar or tar.gz file ({_why(err)})", where=str(archive),
                            fix=_MAKE_ONE) from None
        with tar:
            manifest_member, kernels = archive_members(tar, str(archive))
            manifest = _manifest(tar, manifest_member, str(archive))
            here = {"mlx": _mlx_version(), "gpu_arch": _gpu_arch()}
            for key, value in here.items():
                if check and value and manifest.get(key) and manifest[key] != value:
                    raise DataError(f"kernel cache built for {key} {manifest[key]!r}, this machine has {value!r}",
                                    where=str(archive), fix="build the cache on this kind of machine (or --no-check)")
            dest = Path(folder or cache_dir())
            dest.mkdir(parents=True, exist_ok=True)
            added = sum(_add_kernel(tar, member, dest, str(archive)) for member in kernels)
    return {**manifest, "added": added, "folder": str(dest)}


def _why(err: BaseException) -> str:
    """The first line of an error's text, shortened (tarfile's can span several)."""
    return (str(err).strip().splitlines() or [type(err).__name__])[0][:160]


def _open_archive(archive: Path) -> int:
    """A read descriptor of `archive` when it is a regular file of at most MAX_ARCHIVE_BYTES
    (never blocking on a FIFO, never reading a device); else a DataError naming it."""
    try:
        fd = os.open(archive, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:
        raise DataError(f"cannot read kernel cache archive: {err.strerror}", where=str(archive), fix=_MAKE_ONE) from None
    st = os.fstat(fd)
    problem = (None if stat.S_ISREG(st.st_mode) else f"is {kind_of(st.st_mode)}, not a regular file") or \
        (f"is {st.st_size} bytes, more than the {size_text(MAX_ARCHIVE_BYTES)} allowed"
         if st.st_size > MAX_ARCHIVE_BYTES else None)
    if problem:
        os.close(fd)
        raise DataError(f"the kernel cache archive {problem}", where=str(archive), fix=_MAKE_ONE)
    os.set_blocking(fd, True)
    return fd


def _bad_name(name: str) -> bool:
    """Whether a member name leaves `ptx/` or is not normalised ('ptx/../x', '/x', 'ptx//x', NUL)."""
    parts = name.split("/")
    return (len(parts) < 2 or parts[0] != "ptx" or "\0" in name or "\\" in name
            or any(part in ("", ".", "..") for part in parts[1:]))


def archive_members(tar: tarfile.TarFile, where: str) -> tuple[tarfile.TarInfo, list[tarfile.TarInfo]]:
    """(the manifest's member, the kernel files) of a kernel cache archive, read from its headers
    alone; a DataError names the first member that is not a regular file under `ptx/` with a
    normalised name, or the count / total size past MAX_MEMBERS / MAX_UNPACKED_BYTES."""
    manifest, kernels, total = None, [], 0
    try:
        for count, member in enumerate(iter(tar.next, None), 1):
            if count > MAX_MEMBERS:
                raise DataError(f"the kernel cache archive holds more than {MAX_MEMBERS} members", where=where, fix=_MAKE_ONE)
            if member.name == MANIFEST and member.isfile() and manifest is None:
                manifest = member
            elif member.isdir() and not _bad_name(member.name.rstrip("/") + "/x"):
                continue
            elif not member.isfile():
                raise DataError(f"not a kernel cache archive: member {member.name[:120]!r} is not a regular file "
                                "(links, devices and FIFOs are never unpacked)", where=where, fix=_MAKE_ONE)
            elif _bad_name(member.name):
                raise DataError(f"not a kernel cache archive: member {member.name[:120]!r} is not a plain path under ptx/",
                                where=where, fix=_MAKE_ONE)
            else:
                total += member.size
                kernels.append(member)
            if total > MAX_UNPACKED_BYTES:
                raise DataError(f"the kernel cache archive unpacks to more than {size_text(MAX_UNPACKED_BYTES)}",
                                where=where, fix=_MAKE_ONE)
    except (OSError, EOFError, tarfile.TarError, zlib.error) as err:
        raise DataError(f"cannot read kernel cache archive: {_why(err)}", where=where, fix=_MAKE_ONE) from None
    if manifest is None:
        raise DataError(f"not a kernel cache archive (no {MANIFEST})", where=where, fix=_MAKE_ONE)
    return manifest, kernels


def _manifest(tar: tarfile.TarFile, member: tarfile.TarInfo, where: str) -> dict:
    """The archive's manifest: a JSON object of at most MAX_MANIFEST_BYTES whose `mlx` and
    `gpu_arch` are strings or null; anything else a DataError naming the field."""
    bad = DataError(f"{MANIFEST} is not a kernel cache manifest (a JSON object with mlx and gpu_arch)",
                    where=where, fix=_MAKE_ONE)
    if member.size > MAX_MANIFEST_BYTES:
        raise bad
    try:
        data = json.loads(tar.extractfile(member).read(MAX_MANIFEST_BYTES))
    except (OSError, EOFError, tarfile.TarError, zlib.error, ValueError, RecursionError):
        raise bad from None
    if not isinstance(data, dict) or any(not isinstance(data.get(k), (str, type(None))) for k in ("mlx", "gpu_arch")):
        raise bad
    return data


def _add_kernel(tar: tarfile.TarFile, member: tarfile.TarInfo, dest: Path, where: str) -> int:
    """Write one kernel file of the archive under `dest` (1), or keep the one already there (0).
    Folders below `dest` are made without following a link (`run_dir`), the file is written to a
    new temp file (`open_new`) and hard-linked into place, so nothing there is ever overwritten."""
    parts = member.name.split("/")[1:]
    folder = dest
    for part in parts[:-1]:
        folder = run_dir(folder / part, "kernel cache folder")
    target = check_slot(folder / parts[-1], "kernel")
    if os.path.lexists(target):
        return 0
    tmp = temp_sibling(target)
    try:
        with os.fdopen(open_new(tmp, "kernel"), "wb") as out:
            source = tar.extractfile(member)
            remaining = member.size
            while remaining > 0 and (chunk := source.read(min(remaining, 1 << 20))):
                out.write(chunk)
                remaining -= len(chunk)
        try:
            os.link(tmp, target)  # each kernel appears whole or not at all; one already there wins
        except FileExistsError:
            return 0
        return 1
    except (EOFError, tarfile.TarError, zlib.error) as err:  # a member cut short or corrupt
        raise DataError(f"cannot read kernel cache archive member {member.name[:120]!r}: {_why(err)}", where=where,
                        fix=_MAKE_ONE) from None
    finally:
        with suppress(OSError):
            os.unlink(tmp)


# ---- which kernel modules a step needs (CUDA JIT-compiles one per op and dtypes, seconds each,
# e.g. `gather_float32_int32_1` and `gather_float32_uint32_1` apart)

INDEXED_OPS = ("Gather", "GatherAxis", "Scatter", "ScatterAxis")  # input 1: the index array
_REDUCE_NONE = 4  # SliceUpdate's first argument: its reduction (mx.slice_update: none; .at[].add: 2)


def traced_ops(fun, *args) -> list[tuple[str, tuple[str, ...], list]]:
    """[(primitive name, its inputs' dtype names, its arguments)] of the graph `fun(*args)`
    builds, in order (MLX's export tracer: nothing is evaluated; `mx.compile`d functions inside
    appear as their primitives). What a CUDA run would JIT-compile can be read off it on the CPU."""
    import mlx.core as mx

    ops = []

    def record(node: dict) -> None:
        if node["type"] == "primitive":
            ops.append((node["name"], tuple(str(x[2]).rsplit(".", 1)[-1] for x in node["inputs"]),
                        node["arguments"]))

    mx.export_function(record, fun, *args)
    return ops


def reducing_updates(ops: list) -> int:
    """How many of `traced_ops`' primitives are reducing slice updates (`x.at[i:j].add(v)`: on
    CUDA a `slice_update_Add_<dtype>` module of its own; a plain slice update is a copy)."""
    return sum(name == "SliceUpdate" and args[0] != _REDUCE_NONE for name, _, args in ops)


@contextmanager
def unfused(active: bool):
    """Run `mx.compile`d functions (mlx-lm's swiglu and sampler) as their plain ops inside, when
    `active`: an eager step on a fresh CUDA machine then compiles no fused kernel modules (each
    one a new NVRTC compilation) and uses MLX's precompiled elementwise kernels; same values
    (see tests/mlxio/gpu/test_kernel_modules.py). Left alone when MLX_DISABLE_COMPILE is set."""
    import mlx.core as mx

    if not active or os.environ.get("MLX_DISABLE_COMPILE"):
        yield
        return
    mx.disable_compile()
    try:
        yield
    finally:
        mx.enable_compile()
