"""The project's own error types, and the one error contract of every command-line entry point.

Every failure on bad input is an `MlxioError` whose message names the file, line, key or field
at fault. `cli_main(prog, fn)` runs an entry point so that a user error - config, data, path,
model, disk (ENOSPC, EROFS, EACCES, ...), network - prints exactly one line

    <prog>: error: <what> (<where>); <how to fix>

to stderr and exits 2 (usage / config: `ConfigError`, argparse errors) or 1 (anything else the
user can fix), and only a real bug (any other exception) prints a traceback.
"""

from __future__ import annotations

import argparse
import errno
import os
import re
import sys
from collections.abc import Callable
from typing import Any


class MlxioError(Exception):
    """Base of every error the project raises on bad input.

    `MlxioError(what, where=None, fix=None)`: `str()` is "what (where); fix"; a bare message
    (older call sites) gets the class's default `fix`."""

    exit_code = 1
    default_fix = ""

    def __init__(self, what: str = "", where: str | None = None, fix: str | None = None):
        super().__init__(what)
        self.what, self.where = what, where
        self.fix = self.default_fix if fix is None else fix

    def __str__(self) -> str:
        text = self.what + (f" ({self.where})" if self.where else "")
        if self.fix and self.fix not in text and "; " not in self.what:  # "; " in what: a fix is already there
            text += f"; {self.fix}"
        return text

    def contract_line(self) -> str:
        """'<what> (<where>); <how to fix>': as str(), with a leading 'path:line: ' of an older
        call site's message moved into the (where) part."""
        what, where = self.what, self.where
        if where is None:
            found = _LEADING_PLACE.match(what)
            if found:
                where, what = found.group(1), found.group(2)
        if where and "; " in what:  # the message carries its own fix: the place goes before it
            what, fix = what.split("; ", 1)
            return f"{what} ({where}); {fix}"
        text = what + (f" ({where})" if where else "")
        return text + (f"; {self.fix}" if self.fix and self.fix not in text else "")


_NAMED_LINE = re.compile(r"^\S[^\n]*?:\d+: ")  # "path/to/file.jsonl:12: ..."
# "/abs/path: ...", "./rel: ...", "name.ext:12: ..." (a file, optionally with a line); not "optim.lr: ..."
_LEADING_PLACE = re.compile(r"^((?:/|\.{1,2}/|~/)[^\s:]*(?::\d+)?|[^\s:/]+\.[A-Za-z0-9]+:\d+): (.+)$", re.S)


class ConfigError(MlxioError, ValueError):
    """A config key, value or override is wrong (the message names the key)."""

    exit_code = 2
    default_fix = "see --help for each option's meaning and default"


class DataError(MlxioError, ValueError):
    """A data file is malformed (the message names file:line and field). The default fix, "fix
    or remove that line", is given only to a message that names a line (`path:N: ...`); a reader
    with a lenient mode names it in its own fix."""

    default_fix = "fix or remove that line"

    def __init__(self, what: str = "", where: str | None = None, fix: str | None = None):
        names_a_line = bool(_NAMED_LINE.match(what)) or bool(where and _NAMED_LINE.match(where + ": "))
        super().__init__(what, where, fix if fix is not None or names_a_line else "")


class LoadError(MlxioError, ValueError):
    """A weights / model file is unreadable, corrupt or unsafe (the message names the file/key)."""

    default_fix = "pass a complete model directory, .gguf file or hub id (--model)"


class CheckpointError(MlxioError):
    """A checkpoint is corrupt, incomplete or from another run (the message names why)."""

    default_fix = "resume with the run's own settings, or start fresh in another --out_dir / --out"


class RunError(MlxioError):
    """A run that cannot produce a meaningful result (no step succeeded, loss never finite)."""

    default_fix = "lower the learning rate or raise the loss temperature, and check the data"


class DiskError(MlxioError):
    """Writing an output failed (disk full, read-only, no permission); earlier outputs are kept."""

    default_fix = "free space or pick a writable output directory, then run again"


class TrainingDiverged(RunError):
    """Too many optimizer steps in a row had a non-finite loss or gradient (the message says
    which step, how many, and what to try)."""

    default_fix = "lower --optim.lr, or check the data / rewards; --resume continues from the last good checkpoint"


_DISK_FIXES = {
    errno.ENOSPC: "disk full: free space or pick another output directory",
    errno.EDQUOT: "disk quota exceeded: free space or pick another output directory",
    errno.EROFS: "read-only file system: pick a writable output directory",
    errno.EACCES: "permission denied: pick a directory you can write, or fix its permissions",
    errno.EPERM: "operation not permitted: pick a directory you can write",
    errno.ENOENT: "no such file or directory: check the path",
    errno.ENOTDIR: "a path component is a file, not a directory: check the path",
    errno.EISDIR: "is a directory where a file was expected: check the path",
    errno.EEXIST: "already exists: remove it or pick another path",
    errno.ENAMETOOLONG: "file name too long: pick a shorter path",
    errno.EMFILE: "too many open files: raise `ulimit -n`",
}


def describe_os_error(err: OSError) -> str:
    """'<strerror> (<file>); <fix>' for an OSError."""
    where = " -> ".join(str(f) for f in (err.filename, err.filename2) if f is not None)
    what = err.strerror or type(err).__name__
    fix = _DISK_FIXES.get(err.errno, "check the path, free space and permissions")
    return f"{what} ({where}); {fix}" if where else f"{what}; {fix}"


def _network_error(err: BaseException) -> bool:
    import socket
    import urllib.error

    return isinstance(err, (urllib.error.URLError, ConnectionError, socket.timeout, TimeoutError))


def one_line(text: str, limit: int = 2000) -> str:
    """Collapse a message to one line (newlines would break the contract), at most `limit` chars:
    a long word (a deep path) is shortened in its middle first, then the message in its middle,
    so its end - the "; <how to fix>" - always survives. Credentials in it (a URL's `user:pass@`,
    `?api_key=`) are masked (`mlxio.redact`)."""
    from mlxio.redact import redact_text

    words = redact_text(str(text)).split()
    text = " ".join(words)
    if len(text) <= limit:
        return text
    text = " ".join(w if len(w) <= 160 else f"{w[:80]}...{w[-60:]}" for w in words)
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    return text[:head] + " ... " + text[-(limit - head - 5):]


def user_error(err: BaseException) -> tuple[str, int] | None:
    """(message, exit code) when `err` is a user error; None for a real bug."""
    if isinstance(err, MlxioError):
        return err.contract_line(), err.exit_code
    if isinstance(err, argparse.ArgumentError):
        return f"{err}; see --help", 2
    if _network_error(err):
        reason = getattr(err, "reason", None) or err
        return f"network: {reason}; check the URL and that the server is up", 1
    if isinstance(err, OSError) and err.errno is not None:
        return describe_os_error(err), 1
    if isinstance(err, MemoryError):
        return "out of memory; use a smaller batch, model or --preset smoke", 1
    return None


class StrictArgumentParser(argparse.ArgumentParser):
    """argparse without abbreviations whose usage errors raise ConfigError (one line, exit 2)
    instead of printing the usage block."""

    def __init__(self, *args: Any, **kwargs: Any):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # noqa: D401 - argparse's hook
        raise ConfigError(message, where="command line", fix=f"see {self.prog} --help")


def at_least_one(what: str = "an integer", at_most: int = 2**31 - 1) -> Callable[[str], int]:
    """An argparse `type`: the text as an int in 1..`at_most`, else a usage error "expected
    <what> >= 1" (0 or a negative count or step would do nothing, silently) or "<= at_most" (a
    length, batch or count that large would exhaust memory before it failed). The function
    carries its range as `bounds` (tests check every numeric flag has one)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what} >= 1, got {text!r}") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"expected {what} >= 1, got {value}")
        if value > at_most:
            raise argparse.ArgumentTypeError(f"expected {what} <= {at_most}, got {value}")
        return value
    parse.bounds = (1, at_most)
    return parse


def cli_main(prog: str, fn: Callable[[list[str]], Any], argv: list[str] | None = None) -> None:
    """Run `fn(argv)` under the error contract; never returns (exits 0, 1, 2 or 130)."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        fn(argv)
    except SystemExit as exit_:
        if isinstance(exit_.code, str):  # a message: give it the contract's shape
            print(f"{prog}: error: {one_line(exit_.code)}", file=sys.stderr)
            raise SystemExit(1) from None
        raise
    except KeyboardInterrupt:
        print(f"{prog}: error: interrupted; run again (with --resume to continue from the last checkpoint)",
              file=sys.stderr)
        raise SystemExit(130) from None
    except BaseException as err:  # noqa: BLE001 - sorted into user errors and bugs below
        found = user_error(err)
        if found is None or os.environ.get("MLXIO_TRACEBACK"):
            raise  # a real bug: the traceback is the report
        message, code = found
        print(f"{prog}: error: {one_line(message)}", file=sys.stderr)
        raise SystemExit(code) from None
    raise SystemExit(0)
