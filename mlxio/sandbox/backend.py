"""Sandbox backends: how a sandboxed interpreter is launched here, and a pids cgroup.

`sandbox_backend()` probes once for the strongest isolation that works (bubblewrap, then
`unshare -n`, then none; `sandbox-exec` on macOS); `launcher_argv` gives the command prefix
that starts the base interpreter under it. See `mlxio.sandbox.runner` for the threat model.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from functools import cache
from pathlib import Path

from mlxio.sandbox import seccomp

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


SANDBOX_UID = 65534  # "nobody": the uid/gid inside bubblewrap when this process is not root
# As root, each sandboxed process gets its own unprivileged host uid from this range (never a
# real account): the host's kernel then treats it as nobody (sysctls, /proc, files) and
# RLIMIT_NPROC counts each sandbox's processes apart.
ROOT_UID_RANGE = (1 << 30, 1 << 20)  # (first, how many)
_ROOT_KEEP_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP")  # only for setpriv's own drop


def _dirs_to(path: str) -> list[str]:
    """bwrap ops that create every ancestor of `path` world-traversable (bwrap would make them
    0700, which an unprivileged sandbox uid cannot enter)."""
    argv, parts = [], Path(path).parts[1:-1]
    for i in range(1, len(parts) + 1):
        argv += ["--perms", "0755", "--dir", "/" + "/".join(parts[:i])]
    return argv


def _bwrap_argv(disk_mb: int, uid: int | None, seccomp_fd: int | None) -> list[str]:
    """bubblewrap argv that starts the base interpreter isolated, as an unprivileged user.

    Every namespace but (as root) the user one is new; `/usr`, the interpreter and its stdlib
    are read-only; `/`, `/proc` and `/dev` are remounted read-only; the only writable places
    are `/tmp` and `/dev/shm`, two tmpfs whose sizes add up to `disk_mb`. Not root: a user
    namespace maps the sandbox's uid/gid 65534 to this user. Root: bubblewrap keeps only the
    capabilities setpriv needs to become `uid` (an unprivileged host uid, no groups, no
    capabilities, no new privileges) before it runs the interpreter. `seccomp_fd`: a BPF
    program (`mlxio.sandbox.seccomp`) installed before the command runs."""
    exe, prefix = _python_paths()
    stdlib = Path(prefix, "lib", f"python{sys.version_info[0]}.{sys.version_info[1]}")
    as_root = os.geteuid() == 0
    if as_root:
        ns = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
        caps = ["--cap-drop", "ALL"] + [a for c in _ROOT_KEEP_CAPS for a in ("--cap-add", c)]
    else:
        ns = ["--unshare-all", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID)]
        caps = ["--cap-drop", "ALL"]
    argv = [bwrap_path() or "bwrap", *ns, "--die-with-parent", "--new-session", *caps,
            "--ro-bind", "/usr", "/usr", "--proc", "/proc", "--remount-ro", "/proc", "--dev", "/dev"]
    for name in ("bin", "lib", "lib64", "lib32", "sbin"):  # merged-/usr symlinks or real dirs
        p = Path("/", name)
        if p.is_symlink():
            argv += ["--symlink", os.readlink(p), str(p)]
        elif p.is_dir():
            argv += ["--ro-bind", str(p), str(p)]
    shm_mb = max(1, disk_mb // 4)  # /tmp and /dev/shm share the one quota
    argv += ["--perms", "1777", "--size", str(shm_mb << 20), "--tmpfs", "/dev/shm",
             "--perms", "1777", "--size", str(max(1, disk_mb - shm_mb) << 20), "--tmpfs", "/tmp"]
    if not prefix.startswith("/usr/"):  # /tmp first: an interpreter under /tmp is bound on top
        argv += _dirs_to(prefix) + ["--ro-bind", prefix, prefix]
    exe_dir = os.path.dirname(exe)
    if not exe_dir.startswith(("/usr/", prefix + "/")):  # e.g. a copied (not symlinked) venv binary
        argv += _dirs_to(exe_dir) + ["--ro-bind", exe_dir, exe_dir]
    if (stdlib / "site-packages").is_dir():  # hide installed packages (dataset files live there)
        site = str(stdlib / "site-packages")
        argv += ["--size", "4096", "--tmpfs", site, "--remount-ro", site]
    argv += ["--remount-ro", "/dev", "--remount-ro", "/"]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    argv += ["--chdir", "/tmp"]
    if as_root:
        argv += [_setpriv_path(), f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                 "--no-new-privs", "--inh-caps=-all", "--bounding-set=-all", "--"]
    return argv + [exe]


def _setpriv_path() -> str:
    """util-linux's setpriv (the sandbox sees the host's /usr): how a root-started sandbox
    becomes an unprivileged user."""
    found = shutil.which("setpriv", path="/usr/bin:/bin:/usr/sbin:/sbin")
    return os.path.realpath(found) if found else "/usr/bin/setpriv"


def sandbox_uid() -> int:
    """The host uid of one sandboxed process: a fresh one from ROOT_UID_RANGE as root, else
    this user's (seen as 65534 inside)."""
    if os.geteuid() != 0:
        return os.geteuid()
    first, count = ROOT_UID_RANGE
    return first + secrets.randbelow(count)


def _macos_argv(writable: str) -> list[str]:
    profile = ("(version 1)(allow default)(deny network*)"
               f'(deny file-write* (require-not (subpath "{os.path.realpath(writable)}")))')
    return ["sandbox-exec", "-p", profile, os.path.realpath(sys.executable)]


def _probe(name: str) -> str | None:
    """None when backend `name` runs a known program and returns its answer (and, under
    bubblewrap, runs it as the unprivileged uid it was given); else why not. A launcher that
    exits 0 without running anything (`MLXIO_BWRAP=/bin/true`) does not pass."""
    a, b = secrets.randbelow(1 << 30) + 2, secrets.randbelow(1 << 30) + 2
    uid = sandbox_uid()
    seccomp_fd = None
    try:
        if name == "bwrap":
            seccomp_fd = seccomp.filter_fd()
        argv = launcher_argv(name, None, disk_mb=8, uid=uid, seccomp_fd=seccomp_fd)
        code = f"import os; print({a} * {b}, os.getuid(), os.geteuid())"
        proc = subprocess.run(argv + ["-I", "-S", "-c", code], capture_output=True, timeout=30,
                              env=sandbox_env("probe"), pass_fds=(seccomp_fd,) if seccomp_fd else ())
    except (OSError, subprocess.TimeoutExpired, seccomp.SeccompUnavailable) as err:
        return str(err)
    finally:
        if seccomp_fd is not None:
            os.close(seccomp_fd)
    words = proc.stdout.decode(errors="replace").split()
    if proc.returncode != 0 or not words or words[0] != str(a * b):
        return (f"it did not run the probe program (exit {proc.returncode}, stdout "
                f"{proc.stdout[-200:]!r}, stderr {proc.stderr.decode(errors='replace')[-300:]!r})")
    if name == "bwrap":
        inside = SANDBOX_UID if os.geteuid() != 0 else uid
        if words[1:] != [str(inside), str(inside)]:
            return f"the probe ran as uid {words[1:]} instead of {inside}"
    return None


@cache
def sandbox_backend() -> str:
    """"bwrap" | "sandbox-exec" | "unshare" | "none": the strongest isolation that works here
    (probed once by running a known program under it and checking its answer)."""
    if sys.platform == "darwin" and shutil.which("sandbox-exec"):
        return "sandbox-exec"
    candidates = (["bwrap"] if bwrap_path() else []) + (["unshare"] if shutil.which("unshare") else [])
    for name in candidates:
        why = _probe(name)
        if why is not None:
            log.warning("sandbox backend %s unusable: %s", name, why)
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


def launcher_argv(backend: str, workdir: str | None, *, disk_mb: int = 64, uid: int | None = None,
                  seccomp_fd: int | None = None) -> list[str]:
    """The command prefix that starts the base interpreter under `backend`. bwrap: see
    `_bwrap_argv` (`workdir` unused: its writable space is its own tmpfs). The weaker backends
    run in `workdir` on the host, as this user."""
    if backend == "bwrap":
        return _bwrap_argv(disk_mb, sandbox_uid() if uid is None else uid, seccomp_fd)
    if backend == "sandbox-exec":
        return _macos_argv(workdir or tempfile.gettempdir())
    if backend == "unshare":
        return ["unshare", "-n", os.path.realpath(sys.executable)]
    return [os.path.realpath(sys.executable)]


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
    path = os.path.join(root, f"mlxio-mem-{os.getpid()}-{run_id}")
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
        path = os.path.join(root, f"mlxio-{os.getpid()}-{run_id}")
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


def _owner_gone(name: str, prefix: str) -> bool:
    """Whether the process whose pid follows `prefix` in `name` no longer exists."""
    pid = name[len(prefix):].split("-", 1)[0]
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


@cache
def sweep_stale() -> int:
    """Once per process: remove what sandboxes of dead processes left (a trainer killed with
    SIGKILL never ran its cleanup): their cgroups (killing anything still in them) and work
    dirs (unmounting a quota tmpfs first). Returns how many were removed."""
    removed = 0
    for root in (*_PIDS_CGROUP_ROOTS, _V1_MEMORY_ROOT):
        try:
            names = os.listdir(root)
        except OSError:
            continue
        for name in names:
            for prefix in ("mlxio-mem-", "mlxio-"):
                if name.startswith(prefix) and _owner_gone(name, prefix):
                    sweep_cgroup(os.path.join(root, name))
                    removed += 1
                    break
    tmp = tempfile.gettempdir()
    try:
        names = os.listdir(tmp)
    except OSError:
        names = []
    for name in names:
        if name.startswith("mlxio-sandbox-") and _owner_gone(name, "mlxio-sandbox-"):
            path = os.path.join(tmp, name)
            if os.path.ismount(path):
                unmount_quota(path)
            shutil.rmtree(path, ignore_errors=True)
            removed += 1
    if removed:
        log.info("removed %d sandbox leftovers of processes that no longer run", removed)
    return removed
