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
import hashlib
import json
import os
import re
import secrets
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


def _what_is(path: Path, st: os.stat_result, hard_links: bool) -> str | None:
    """None when `st` (an lstat) is a file a run may write at `path`; else what it is instead."""
    if stat.S_ISLNK(st.st_mode):
        try:
            return f"a symbolic link (to {os.readlink(path)})"
        except OSError:
            return "a symbolic link"
    if not stat.S_ISREG(st.st_mode):
        return "a " + next((name for test, name in _KINDS if test(st.st_mode)), "special file")
    if hard_links and st.st_nlink > 1:
        return f"a file with {st.st_nlink} hard links (writing it would change the other names too)"
    return None


def _slot_error(path: Path, what: str, found: str) -> DiskError:
    fix = ("remove the link (a run never writes through one), or pick another folder" if "link" in found
           else "pass the path of a regular file (or a new one)")
    kind = "" if "hard links" in found else ", not a regular file"
    return DiskError(f"cannot write the {what}: its path is {found}{kind}", where=str(path), fix=fix)


def check_slot(path: str | os.PathLike, what: str = "output", *, hard_links: bool = False) -> Path:
    """`path` when a run may put its file there: absent, or a regular file (with no other hard
    link when `hard_links`: the file is written in place). A symlink (dangling or not), a FIFO,
    a device, a socket or a directory is a DiskError naming it; nothing is followed."""
    path = Path(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return path
    except OSError:  # unreadable: the write itself reports it
        return path
    found = _what_is(path, st, hard_links)
    if found:
        raise _slot_error(path, what, found)
    return path


def run_dir(path: str | os.PathLike, what: str = "run folder") -> Path:
    """`path` as a directory a run writes into, created with its missing parents. A symlink
    there (a folder the run names inside the user's, such as `checkpoints/`, moved elsewhere by
    a link) or anything else but a directory is a DiskError; nothing is followed."""
    path = Path(path)
    try:
        os.mkdir(path)
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        return run_dir(path, what)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        found = _what_is(path, st, False) or "a file"
        raise DiskError(f"cannot write the {what}: its path is {found}, not a directory", where=str(path),
                        fix="remove it (a run never writes through a link), or pick another folder")
    return path


def private_dir(path: str | os.PathLike) -> Path:
    """A new directory only this user can enter (mode 0700, as `mkdtemp`), so nobody else can
    plant a link among the files written into it before `publish_dir` opens it up."""
    os.mkdir(path, 0o700)
    return Path(path)


def publish_dir(path: str | os.PathLike) -> None:
    """Give a `private_dir` the mode an ordinary `mkdir` would (0777 less the umask)."""
    os.chmod(path, 0o777 & ~_UMASK)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = _umask()


def open_new(path: str | os.PathLike, what: str = "output", mode: int = 0o666) -> int:
    """A descriptor of a new file at `path`, for writing (O_CREAT | O_EXCL | O_NOFOLLOW: a link
    or any file already there is a DiskError naming it, never opened)."""
    path = Path(path)
    try:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, mode)
    except FileExistsError:
        check_slot(path, what, hard_links=True)
        raise _slot_error(path, what, "a file that is already there") from None


def open_in_place(path: str | os.PathLike, what: str = "output", *, append: bool = False, read: bool = False) -> int:
    """A descriptor of the regular file at `path` (created when absent) to write in place
    (appended to when `append`, readable too when `read`): opened without following a link and
    without blocking on a FIFO, then refused (DiskError naming it) unless it is a regular file
    with no other hard link - so a link planted where a run's log or lock belongs never gets
    another file truncated, appended to or created elsewhere."""
    path = check_slot(path, what, hard_links=True)  # a device is never opened (opening some has effects)
    flags = (os.O_RDWR if read else os.O_WRONLY) | os.O_CREAT | _NOFOLLOW | _NONBLOCK | _CLOEXEC
    flags |= os.O_APPEND if append else 0
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.EMLINK, errno.ENXIO, errno.EISDIR, errno.EWOULDBLOCK):
            check_slot(path, what, hard_links=True)
            raise _slot_error(path, what, "not a plain file") from None
        raise
    st = os.fstat(fd)
    found = _what_is(path, st, hard_links=True)
    if found:
        os.close(fd)
        raise _slot_error(path, what, found)
    if _NONBLOCK:
        import fcntl

        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~_NONBLOCK)
    return fd


def append_text(path: str | os.PathLike, text: str, what: str = "log") -> None:
    """Append `text` to the log at `path` in one write (`open_in_place`)."""
    fd = open_in_place(path, what, append=True)
    with os.fdopen(fd, "ab") as handle:
        handle.write(text.encode("utf-8"))


def write_bytes_atomic(path: str | os.PathLike, data: bytes, what: str = "output") -> None:
    """Write `data` to a new temp file beside `path` (`open_new`), fsync, then rename it over
    `path`; on any failure (disk full, ...) the temp file is removed and `path` keeps its old
    contents. Anything at `path` but a regular file (a link, device, FIFO, socket, folder) is a
    DiskError naming it, left as it was."""
    path = check_slot(path, what)
    path.parent.mkdir(parents=True, exist_ok=True)
    sweep_stale(path.parent)  # temp files of writers killed before their rename
    tmp = temp_sibling(path)
    fd = open_new(tmp, what)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        replace_file(tmp, path, what)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def replace_file(tmp: str | os.PathLike, path: str | os.PathLike, what: str = "output") -> None:
    """`os.replace(tmp, path)` when `path` is a regular file or absent (`check_slot`: a rename
    never follows a link, and one is refused rather than replaced); else `tmp` is removed and
    the DiskError raised."""
    try:
        check_slot(path, what)
    except DiskError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    os.replace(tmp, path)


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


def check_dir_slot(final: Path, what: str) -> None:
    """A DiskError unless `final` is absent or a directory (not a link to one)."""
    try:
        st = os.lstat(final)
    except OSError:
        return
    if not stat.S_ISDIR(st.st_mode):
        found = _what_is(final, st, False) or "a file"
        raise DiskError(f"cannot write the {what}: its path is {found}, not a directory", where=str(final),
                        fix="remove it (a run never writes through a link), or pick another output directory")


def replace_dir(tmp: Path, final: Path, what: str = "output") -> None:
    """Put the complete directory `tmp` at `final` (replacing any directory there; a link or a
    file there is a DiskError)."""
    check_dir_slot(final, what)
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
    check_dir_slot(final, what)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        sweep_stale(final.parent)  # what an export killed earlier left
        tmp = private_dir(temp_sibling(final))
    except OSError as err:
        raise _disk_error(err, what, final) from None
    try:
        yield tmp
        _fsync_tree(tmp)
        publish_dir(tmp)
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


def write_text_atomic(path: Path, text: str, what: str = "output") -> None:
    """`text` written atomically at `path` (`write_bytes_atomic`: a temp file beside it,
    fsync, rename; a link, device, FIFO or folder at `path` is a DiskError, left as it was)."""
    write_bytes_atomic(path, text.encode("utf-8"), what)


def write_json_atomic(path: Path, data: Any, what: str = "output") -> None:
    """Write JSON to a temp file beside `path`, fsync, then rename over it (`write_text_atomic`)."""
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=True, default=float) + "\n", what)


def file_digest(path: Path, quick: bool = False) -> tuple[str, int]:
    """(SHA-256 hex, size) of a file read in 1 MiB chunks; `quick`: of its size + first and
    last MiB only (a cheap change check for large files, e.g. the search index's)."""
    h = hashlib.sha256()
    size = Path(path).stat().st_size
    with open(path, "rb") as f:
        if quick:
            h.update(str(size).encode())
            h.update(f.read(1 << 20))
            f.seek(max(size - (1 << 20), 0))
            h.update(f.read(1 << 20))
            return h.hexdigest(), size
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest(), size
