"""Sandbox backends: how a sandboxed interpreter is launched here, and a pids cgroup.

`sandbox_backend()` probes once for the strongest isolation that works (bubblewrap, then
`unshare -n`, then none; `sandbox-exec` on macOS); `launcher_argv` gives the command prefix
that starts the base interpreter under it. See `mlxio.sandbox` for the threat model.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from functools import cache
from pathlib import Path

log = logging.getLogger("mlxio.sandbox")

_PIDS_CGROUP_ROOTS = ("/sys/fs/cgroup/pids", "/sys/fs/cgroup")


def _python_paths() -> tuple[str, str]:
    """(interpreter binary, stdlib install prefix) of the base interpreter (not a venv)."""
    exe = os.path.realpath(sys.executable)
    return exe, os.path.realpath(sys.base_prefix)


def bwrap_path() -> str | None:
    """Absolute path of bubblewrap: $MLXIO_BWRAP, else `bwrap` on this process's PATH. The
    sandbox's own PATH is cleaned (/usr/bin:/bin), so the launcher is always named absolutely:
    a bwrap unpacked elsewhere (e.g. from its .deb on a machine without a package manager)
    is used too."""
    explicit = os.environ.get("MLXIO_BWRAP")
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    return shutil.which("bwrap")


def _bwrap_argv(writable: str | None) -> list[str]:
    exe, prefix = _python_paths()
    stdlib = Path(prefix, "lib", f"python{sys.version_info[0]}.{sys.version_info[1]}")
    argv = [bwrap_path() or "bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
            "--ro-bind", "/usr", "/usr", "--proc", "/proc", "--dev", "/dev"]
    for name in ("bin", "lib", "lib64", "lib32", "sbin"):  # merged-/usr symlinks or real dirs
        p = Path("/", name)
        if p.is_symlink():
            argv += ["--symlink", os.readlink(p), str(p)]
        elif p.is_dir():
            argv += ["--ro-bind", str(p), str(p)]
    # /tmp first: an interpreter installed under /tmp is then bound on top of it, not hidden
    argv += ["--bind", writable, "/tmp"] if writable else ["--tmpfs", "/tmp"]
    if not prefix.startswith("/usr/"):
        argv += ["--ro-bind", prefix, prefix]
    exe_dir = os.path.dirname(exe)
    if not exe_dir.startswith(("/usr/", prefix + "/")):  # e.g. a copied (not symlinked) venv binary
        argv += ["--ro-bind", exe_dir, exe_dir]
    if (stdlib / "site-packages").is_dir():  # hide installed packages (dataset files live there)
        argv += ["--tmpfs", str(stdlib / "site-packages")]
    return argv + ["--chdir", "/tmp", exe]


def _macos_argv(writable: str) -> list[str]:
    profile = ("(version 1)(allow default)(deny network*)"
               f'(deny file-write* (require-not (subpath "{os.path.realpath(writable)}")))')
    return ["sandbox-exec", "-p", profile, os.path.realpath(sys.executable)]


@cache
def sandbox_backend() -> str:
    """"bwrap" | "sandbox-exec" | "unshare" | "none": the strongest isolation that works here
    (probed once by running the interpreter under it)."""
    if sys.platform == "darwin" and shutil.which("sandbox-exec"):
        return "sandbox-exec"
    candidates = []
    if bwrap_path():
        candidates.append(("bwrap", _bwrap_argv(None)))
    if shutil.which("unshare"):
        candidates.append(("unshare", ["unshare", "-n", os.path.realpath(sys.executable)]))
    for name, argv in candidates:
        try:
            proc = subprocess.run(argv + ["-I", "-S", "-c", "pass"], capture_output=True,
                                  timeout=30, env=sandbox_env("probe"))
        except (OSError, subprocess.TimeoutExpired) as err:
            log.info("sandbox backend %s unusable: %s", name, err)
            continue
        if proc.returncode != 0:
            log.info("sandbox backend %s unusable: %s", name,
                     proc.stderr.decode(errors="replace"))
            continue
        if name == "unshare":
            log.warning("bwrap unusable here: candidate code runs under `unshare -n` (no "
                        "network) with resource limits, WITHOUT file isolation")
        return name
    log.warning("no sandbox backend works here (bwrap, unshare -n): candidate code runs in a "
                "plain subprocess with resource limits only, WITHOUT file or network isolation")
    return "none"


def sandbox_env(run_id: str) -> dict[str, str]:
    return {"MLXIO_SANDBOX": run_id, "PATH": "/usr/bin:/bin", "HOME": "/tmp",
            "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}


def launcher_argv(backend: str, writable: str | None) -> list[str]:
    if backend == "bwrap":
        return _bwrap_argv(writable)
    if backend == "sandbox-exec":
        return _macos_argv(writable or tempfile.gettempdir())
    if backend == "unshare":
        return ["unshare", "-n", os.path.realpath(sys.executable)]
    return [os.path.realpath(sys.executable)]


def make_pids_cgroup(run_id: str, max_pids: int) -> str | None:
    """A pids cgroup capping the worker's process count (RLIMIT_NPROC does not bind root)."""
    if os.geteuid() != 0:
        return None
    for root in _PIDS_CGROUP_ROOTS:
        path = os.path.join(root, f"mlxio-{run_id}")
        try:
            if not os.path.exists(os.path.join(root, "cgroup.procs")):
                continue
            os.mkdir(path)
            Path(path, "pids.max").write_text(str(max_pids))
            return path
        except OSError:
            try:
                os.rmdir(path)
            except OSError:
                pass
    return None


def sweep_cgroup(path: str | None) -> None:
    """SIGKILL every process left in the cgroup, then remove it."""
    if path is None:
        return
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        try:
            pids = [int(p) for p in Path(path, "cgroup.procs").read_text().split()]
        except OSError:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.rmdir(path)
            return
        except OSError:
            time.sleep(0.005)  # processes still exiting
    log.warning("could not remove sandbox cgroup %s", path)
