"""Reading a user's input files with bounds: regular files only, at most so many bytes.

A path a user names (a config, queries, problems or data file, a model folder's JSON, a source
file found in a folder) may be a FIFO (reading blocks forever), a character device such as
`/dev/zero` (reading never ends) or a symlink to one, or a file far larger than any real input.
`read_regular(path, what=..., max_bytes=...)` opens it without blocking (`O_NONBLOCK`), checks
the opened file is a regular file (`fstat`: no race between the check and the read), reads at
most `max_bytes` and raises the caller's error class with one line naming the path otherwise.
`regular_kind(path)` says what a path is, for folder walks that skip and count the rest;
`gunzip_bounded` decompresses at most so many bytes (a gzip bomb is an error, not a memory
exhaustion).
"""

from __future__ import annotations

import os
import stat
import zlib
from pathlib import Path

from mlxio.errors import DataError, MlxioError

MiB = 1 << 20
# byte caps on what a user points the commands at (a real input is far smaller)
MAX_DATA_BYTES = 4096 * MiB      # a training data JSONL (pairs), read whole
MAX_QUERIES_BYTES = 256 * MiB    # a queries JSONL (code_search), a corpus JSONL
MAX_PROBLEMS_BYTES = 512 * MiB   # a problems JSONL, after decompression when .gz
MAX_SOURCE_BYTES = 16 * MiB      # one .py file of an indexed or mined folder (larger: skipped, counted)
MAX_MODEL_JSON_BYTES = 256 * MiB  # config.json, tokenizer.json, ... of a model folder
KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
         (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def size_text(n: int) -> str:
    """'64 MiB', '10 bytes': a byte count for a message."""
    return f"{n // MiB} MiB" if n >= MiB and n % MiB == 0 else f"{n} bytes"


def kind_of(mode: int) -> str:
    """'a FIFO (named pipe)', 'a character device', ... of a stat mode ('a regular file')."""
    if stat.S_ISREG(mode):
        return "a regular file"
    return next((name for test, name in KINDS if test(mode)), "not a regular file")


def regular_kind(path: str | os.PathLike) -> str | None:
    """None when `path` (symlinks followed) is a regular file, else what it is ('a FIFO (named
    pipe)', 'a character device', 'missing', 'a dangling symlink', ...)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "a dangling symlink" if os.path.islink(path) else "missing"
    except OSError as err:
        return f"unreadable ({err.strerror})"
    return None if stat.S_ISREG(mode) else kind_of(mode)


def read_regular(path: str | os.PathLike, *, what: str, max_bytes: int, error: type[MlxioError] = DataError,
                 fix: str | None = None) -> bytes:
    """The bytes of the regular file at `path` (symlinks followed), at most `max_bytes`; else
    `error` naming `path`: missing or unreadable, not a regular file (FIFO, device, directory,
    socket), or larger than `max_bytes`. Never blocks on a FIFO, never reads a device."""
    path = Path(path)
    noun = what if what.endswith(("file", "log", "pointer", "manifest", "meta")) else f"{what} file"
    fix = fix or f"pass a regular {noun}"
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except OSError as err:
        raise error(f"cannot read the {what}: {err.strerror}", where=str(path), fix=fix) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise error(f"the {what} is {kind_of(st.st_mode)}, not a regular file", where=str(path), fix=fix)
        if st.st_size > max_bytes:
            raise error(f"the {what} is {st.st_size} bytes, more than the {size_text(max_bytes)} allowed",
                        where=str(path), fix=f"pass a smaller {noun} (at most {size_text(max_bytes)})")
        os.set_blocking(fd, True)
        chunks, total = [], 0
        while chunk := os.read(fd, min(MiB, max_bytes + 1 - total)):
            chunks.append(chunk)
            total += len(chunk)
            if total > max_bytes:  # it grew while being read
                raise error(f"the {what} is more than the {size_text(max_bytes)} allowed", where=str(path),
                            fix=f"pass a smaller {noun} (at most {size_text(max_bytes)})")
        return b"".join(chunks)
    except OSError as err:
        raise error(f"cannot read the {what}: {err.strerror}", where=str(path), fix=fix) from None
    finally:
        os.close(fd)


def gunzip_bounded(data: bytes, *, max_bytes: int, where: str, what: str = "file",
                   error: type[MlxioError] = DataError) -> bytes:
    """gzip-decompressed `data` (concatenated members too), at most `max_bytes` of output: a
    bomb (a few KiB that inflate to gigabytes) is an `error` naming `where`, found after at most
    `max_bytes` of output."""
    out, total = [], 0
    rest = data
    try:
        while rest:
            d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            while rest:
                chunk = d.decompress(rest, max_bytes + 1 - total)
                out.append(chunk)
                total += len(chunk)
                if total > max_bytes:
                    raise error(f"the {what} decompresses to more than {size_text(max_bytes)} (a gzip bomb?)",
                                where=where, fix=f"pass a {what} of at most {size_text(max_bytes)} uncompressed")
                rest = d.unconsumed_tail
                if d.eof:
                    break
            if not d.eof:
                raise error(f"the {what} is a truncated gzip stream", where=where, fix=f"pass a complete {what}")
            rest = d.unused_data.lstrip(b"\x00")  # another member may follow
    except zlib.error as err:
        raise error(f"the {what} is not valid gzip ({err})", where=where, fix=f"pass a complete {what}") from None
    return b"".join(out)
