"""Sandbox backends: how a sandboxed interpreter is launched here, and a pids cgroup.

`sandbox_backend()` probes once for the strongest isolation that works (bubblewrap, then
`unshare -n`, then none; `sandbox-exec` on macOS); `launcher_argv` gives the command prefix
that starts the base interpreter under it. See `mlxio.sandbox` for the threat model.
"""

from __future__ import annotations

import contextlib
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
_V2_ROOT = "/sys/fs/cgroup"
_V1_MEMORY_ROOT = "/sys/fs/cgroup/memory"
STRONG_BACKENDS = ("bwrap", "sandbox-exec")  # file and network isolation


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


def with_tmpfs_size(argv: list[str], size_mb: int) -> list[str]:
    """A bubblewrap argv whose private /tmp tmpfs is capped at `size_mb` (the sandbox's whole
    writable space); other argvs unchanged."""
    for i in range(len(argv) - 1):
        if argv[i] == "--tmpfs" and argv[i + 1] == "/tmp":
            return argv[:i] + ["--size", str(size_mb << 20)] + argv[i:]
    return argv


def mount_quota(path: str, size_mb: int) -> bool:
    """As root, mount a tmpfs of `size_mb` on `path` (a total disk quota for a host work dir
    of the weaker backends); False where that is not possible."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    try:
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode=0700", "tmpfs", path],
                              capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


def unmount_quota(path: str) -> None:
    try:
        subprocess.run(["umount", "-l", path], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        log.warning("could not unmount the sandbox work dir %s", path)


def dir_bytes(path: str) -> int:
    """Bytes of the files under `path` (the polled quota where no tmpfs could be mounted)."""
    total = 0
    for folder, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_blocks * 512
            except OSError:
                pass
    return total


def make_memory_cgroup(run_id: str, memory_mb: int) -> str | None:
    """A memory cgroup bounding every process of one check together (cgroup v2 `memory.max`,
    else v1 `memory.limit_in_bytes`, swap included where accounted); None where none can be made."""
    if os.geteuid() != 0:
        return None
    limit = str(memory_mb << 20)
    if os.path.exists(os.path.join(_V2_ROOT, "cgroup.controllers")):
        return None  # v2: one cgroup per process, so the limit goes into the pids cgroup (limit_memory_v2)
    if os.path.isdir(_V1_MEMORY_ROOT):
        root, files = _V1_MEMORY_ROOT, (("memory.limit_in_bytes", limit), ("memory.memsw.limit_in_bytes", limit))
    else:
        return None
    path = os.path.join(root, f"mlxio-mem-{run_id}")
    try:
        os.mkdir(path)
        Path(path, files[0][0]).write_text(files[0][1])
    except OSError:
        with contextlib.suppress(OSError):
            os.rmdir(path)
        return None
    for name, value in files[1:]:  # swap accounting is optional
        with contextlib.suppress(OSError):
            Path(path, name).write_text(value)
    return path


def limit_memory_v2(cgroup: str | None, memory_mb: int) -> bool:
    """Add a memory bound to a cgroup v2 directory (the pids cgroup); False where it has no
    memory controller."""
    if cgroup is None or not os.path.exists(os.path.join(cgroup, "memory.max")):
        return False
    try:
        Path(cgroup, "memory.max").write_text(str(memory_mb << 20))
    except OSError:
        return False
    try:
        Path(cgroup, "memory.swap.max").write_text("0")
    except OSError:
        pass
    return True


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
            with contextlib.suppress(OSError):
                os.rmdir(path)
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
