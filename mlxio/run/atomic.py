"""Nothing half-written: an output directory is built in a temporary sibling and swapped into
place only once every file in it is complete and synced.

    with atomic_dir(out / "merged", "merged model") as tmp:
        save(tmp / "model.safetensors") ...

On success `out/merged` is the new directory (the previous one, if any, is removed after the
swap; on Linux the swap is one `renameat2(RENAME_EXCHANGE)`, elsewhere two renames). On any
failure the temporary directory is removed and `out/merged` is exactly as before; a write error
of the disk (ENOSPC, EDQUOT, EROFS, EACCES, EIO) becomes a `DiskError` saying so.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import re
import secrets
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

from mlxio.errors import DiskError

_DISK_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO, errno.EFBIG}
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _libc():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None


_LIBC = _libc()


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two existing paths (Linux renameat2); False where unsupported."""
    fn = getattr(_LIBC, "renameat2", None) if _LIBC is not None else None
    if fn is None:
        return False
    rc = fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP if hasattr(errno, "ENOTSUP") else errno.EINVAL):
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


_KINDS = ((stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"), (stat.S_ISFIFO, "FIFO"),
          (stat.S_ISSOCK, "socket"), (stat.S_ISDIR, "directory"))


def regular_target(path: str | os.PathLike) -> Path:
    """The file an atomic write of `path` replaces: `path` (or, through symlinks, the file it
    names) when that is a regular file or does not exist yet. Anything else (`/dev/null`,
    `/dev/full`, a FIFO, a socket, a directory) is a DiskError: renaming over it would
    replace the device node itself."""
    path = Path(path)
    real = Path(os.path.realpath(path)) if path.is_symlink() else path
    try:
        mode = os.stat(real).st_mode
    except FileNotFoundError:
        return real
    except OSError:  # unreadable: let the write itself report it
        return real
    if stat.S_ISREG(mode):
        return real
    kind = next((name for test, name in _KINDS if test(mode)), "special file")
    raise DiskError(f"{path} is a {kind}, not a regular file; an output is never written over one",
                    where=str(path), fix="pass the path of a regular file (or a new one)")


def replace_file(tmp: str | os.PathLike, path: str | os.PathLike) -> None:
    """`os.replace(tmp, path)` when `path` is a regular file or absent (`regular_target`);
    else `tmp` is removed and the DiskError raised."""
    try:
        target = regular_target(path)
    except DiskError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    os.replace(tmp, target)


# `.NAME.tmp-PID-HEX` / `.NAME.old-PID-HEX`: a temporary sibling of NAME written by process PID
_TEMP = re.compile(r"^\..+\.(?:tmp|old)-(\d+)-[0-9a-f]{8}$")


def temp_sibling(final: Path, kind: str = "tmp") -> Path:
    """A fresh temporary name beside `final` naming this process (`sweep_stale` knows it)."""
    return final.with_name(f".{final.name}.{kind}-{os.getpid()}-{secrets.token_hex(4)}")


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists (a lock or temp file's owner is still at work)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale(folder: Path) -> list[Path]:
    """Remove the temporary siblings (`temp_sibling`) in `folder` whose writer is gone (killed
    mid-export: a `.colbert.tmp-*` folder, a `.eval.json.tmp-*` file); returns them. Those of a
    live process, this one included, are left alone."""
    removed = []
    try:
        entries = list(Path(folder).iterdir())
    except OSError:
        return removed
    for entry in entries:
        found = _TEMP.match(entry.name)
        if not found or int(found.group(1)) == os.getpid() or pid_alive(int(found.group(1))):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                entry.unlink()
        removed.append(entry)
    return removed


def fsync_path(path: str | os.PathLike) -> None:
    """fsync a file or directory (a directory's fsync makes renames inside it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    for folder, _dirs, files in os.walk(root):
        for name in files:
            fsync_path(os.path.join(folder, name))
        fsync_path(folder)


def replace_dir(tmp: Path, final: Path) -> None:
    """Put the complete directory `tmp` at `final` (replacing any directory there)."""
    if final.exists() and not final.is_dir():
        raise DiskError(f"{final} is a file, not a directory", where=str(final),
                        fix="remove it or pick another output directory")
    if final.exists():
        if not _exchange(tmp, final):
            old = temp_sibling(final, "old")
            os.rename(final, old)
            os.rename(tmp, final)
            tmp = old
        shutil.rmtree(tmp, ignore_errors=True)  # now the previous contents
    else:
        os.rename(tmp, final)
    with contextlib.suppress(OSError):
        fd = os.open(final.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def atomic_dir(final: str | Path, what: str = "output") -> Iterator[Path]:
    """Yield a fresh temporary sibling of `final`; rename it into place when the block ends."""
    final = Path(final)
    if final.exists() and not final.is_dir():
        raise DiskError(f"cannot write the {what}: {final} is a file, not a directory", where=str(final),
                        fix="remove it or pick another output directory")
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        sweep_stale(final.parent)  # what an export killed earlier left
        tmp = temp_sibling(final)
        tmp.mkdir()
    except OSError as err:
        raise _disk_error(err, what, final) from None
    try:
        yield tmp
        _fsync_tree(tmp)
        replace_dir(tmp, final)
    except BaseException as err:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(err, OSError) and err.errno in _DISK_ERRNOS:
            raise _disk_error(err, what, final) from None
        if isinstance(err, RuntimeError) and _looks_like_disk(str(err)):
            previous = "the previous one is intact" if final.exists() else "nothing was written"
            raise DiskError(f"writing the {what} failed: {str(err)[:160]}{_free_space(final)} ({previous})",
                            where=str(final)) from None
        raise


def disk_error(err: BaseException, what: str, final: Path, previous: str | None = None) -> DiskError | None:
    """The DiskError for a failed write of `what` at `final` (an OSError of the disk: ENOSPC,
    EDQUOT, EROFS, EACCES, EIO, ...; or MLX's RuntimeError saying so), else None (a bug).
    `previous`: what is left of the earlier output (default: said from whether `final` exists)."""
    if previous is None:
        previous = "the previous one is intact" if final.exists() else "nothing was written"
    free = _free_space(final).replace("; ", ", ")  # no "; " before the fix: the contract line puts it last
    if isinstance(err, OSError) and err.errno in _DISK_ERRNOS:
        return DiskError(f"writing the {what} failed: {err.strerror or err} ({previous}{free})",
                         where=str(final), fix=_DISK_FIX.get(err.errno, "check free space and permissions of the output directory"))
    if isinstance(err, OSError) and err.errno in (errno.ENOENT, errno.ENOTDIR, errno.ENAMETOOLONG):
        return DiskError(f"writing the {what} failed: {err.strerror or err} ({previous})", where=str(final),
                         fix="keep the output directory in place while the run writes it")
    if isinstance(err, RuntimeError) and _looks_like_disk(str(err)):
        return DiskError(f"writing the {what} failed: {str(err)[:160]} ({previous}{free})",
                         where=str(final), fix="free disk space, then run again")
    return None


_DISK_FIX = {errno.ENOSPC: "free disk space, then run again", errno.EDQUOT: "free disk space (quota), then run again",
             errno.EROFS: "pick a writable output directory"}


def _free_space(path: Path) -> str:
    try:
        st = os.statvfs(path.parent)
    except OSError:
        return ""
    return f"; {st.f_bavail * st.f_frsize / 2**20:.1f} MiB free on that file system"


def _looks_like_disk(text: str) -> bool:  # MLX's writers raise RuntimeError("... No space left ...")
    text = text.lower()
    return any(s in text for s in ("no space left", "disk quota", "read-only file system", "permission denied",
                                   "input/output error", "file too large", "could not write", "failed to write", "unable to write",
                                   "cannot open file", "unable to open file"))


def _disk_error(err: OSError, what: str, final: Path) -> DiskError:
    previous = "the previous one is intact" if final.exists() else "nothing was written"
    return DiskError(f"writing the {what} failed: {err.strerror or err} ({previous})", where=str(final),
                     fix={errno.ENOSPC: "free disk space, then run again",
                          errno.EDQUOT: "free disk space (quota), then run again",
                          errno.EROFS: "pick a writable output directory"}.get(
                         err.errno, "check free space and permissions of the output directory"))
