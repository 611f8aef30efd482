"""Run untrusted code (model completions) against a problem's tests, outside this process.

Threat model. The candidate code is adversarial: an RL policy is optimised to find anything
that yields reward, so it will, given time, print "passed", call `os._exit(0)`, return an
object whose `__eq__` is always True, patch `check`/`assert`/builtins, reload modules, use
ctypes, fork bomb, leave grandchildren behind, allocate or print without bound, read files it
should not (the dataset's answers, the repo, /etc/shadow), write outside its directory, open
network connections, or kill its parent. The tests and prompt (the dataset) are trusted.

Design, and what each layer stops:
1. Split trust across two processes (`mlxio/sandbox/child.py`). The *worker* executes only
   the candidate's code and answers calls over a pipe; the *judge* executes only the
   problem's prelude and test code, calls `check(stub)` where `stub` forwards each call to the
   worker, and decodes every reply itself into fresh builtin values (int, float, str, bool,
   None, list, tuple, dict, set, frozenset, bytes, complex, range; a builtin subclass such
   as a namedtuple or Counter arrives as its base type's data, anything else is refused).
   So the verdict is computed by trusted code from plain data. This stops: exit codes
   (`os._exit(0)`, `sys.exit(0)`, SystemExit in `__del__`: the worker's exit code never
   counts, a dead worker fails the call), always-equal / subclassed return values (refused,
   or reduced to their base type's data, at the boundary), patching `check`, `assert`, builtins, the harness, `importlib.reload`
   and ctypes tricks (they only change the worker), printing "passed" (stdout is not read
   for the verdict), and `StopIteration` smuggling (never re-raised as itself in the judge).
2. The judge writes `{nonce, status}` on its own result pipe; the nonce is a fresh random
   token this process sends on the judge's stdin. The worker never holds the nonce or that
   pipe (separate sandboxes: it cannot read the judge's memory or fds), so it cannot forge
   a verdict; a missing or wrong nonce is "infra" (the harness broke), never "passed".
3. Isolation per process (Linux): bubblewrap with new pid/ipc/uts/network (and, unless
   started as root, user) namespaces; the process runs as an unprivileged user (as root:
   setpriv drops to a fresh uid of its own, no groups, no capabilities, no new privileges;
   otherwise uid/gid 65534 in a user namespace mapped to this user), so the host's kernel
   treats it as nobody (sysctls, /proc, files); `/`, `/usr`, `/proc` (with `/proc/sys`) and
   `/dev` are read-only, the interpreter and its stdlib bound read-only (its site-packages
   hidden: no dataset files); a seccomp filter (`mlxio.sandbox.seccomp`) denies ptrace,
   mount, keyctl, bpf, perf, kexec, module loading, io_uring, new namespaces and every
   socket family but AF_UNIX; `--die-with-parent`, `--new-session`. This stops network
   access, reading the repo, HOME or /etc, writing anything outside the sandbox (the host's
   sysctls included), signalling or ptracing anything outside, and orphans: when the
   sandbox's pid 1 dies the kernel kills every process in its pid namespace. The backend
   probe runs a known program and checks its answer and uid before trusting bubblewrap.
   Fallbacks, with a logged warning and only when the user opts in: `unshare -n` (network
   only) or a plain subprocess, neither of which isolates files nor drops privileges; on
   macOS `sandbox-exec` with a deny-network / deny-file-write profile.
4. Limits, the same for the worker and the judge: `setrlimit` before any job code runs
   (RLIMIT_AS, NPROC, FSIZE, CPU as a backstop, CORE=0); as root a pids and a memory cgroup
   per process; the writable space (`/tmp` and `/dev/shm`, two tmpfs) adds up to `disk_mb`;
   a wall-clock deadline after which both process groups (and every pid in the cgroups) are
   SIGKILLed; stdout/stderr read with a cap (the worker exceeding it: status "error"; the
   judge: its own failure).
5. The judge's own failures are "infra", never the candidate's fail: it loads the problem's
   prelude and tests before it waits for the candidate, and marks its progress on the result
   pipe (loaded, candidate loaded, call pending, reply received), so a timeout is charged to
   whoever held the clock; tests that raise something other than an assertion or the
   candidate's own exception, flood their output or hang with no call pending are
   `judge_fault` verdicts, which `mlxio.rl.execution` settles with the problem's reference solution.
Known limits: the judge sees return values, not side effects (a test that checks in-place
mutation of an argument cannot pass), returned iterators/generators are refused, and
exceptions cross as builtin types by name; these only ever turn a pass into a fail. A kernel
exploit from inside bubblewrap is out of scope. `run_tests` on a program without the
`build_program` marker relies on a syntactic split (see `split_program`).
Statuses: "passed"; "failed" (a test failed or the candidate raised/died mid-test);
"timeout"; "error" (the candidate did not load, or exceeded the output limit); "infra" (the
sandbox or the problem's own test code broke: a missing reward, never a wrong answer).
"""

from __future__ import annotations

import ast
import json
import logging
import os
import secrets
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import attrs

from mlxio import pyparse
from mlxio.errors import MlxioError
from mlxio.sandbox import seccomp
from mlxio.sandbox.backend import (
    STRONG_BACKENDS,
    launcher_argv,
    limit_memory_v2,
    make_memory_cgroup,
    make_pids_cgroup,
    mount_quota,
    sandbox_backend,
    sandbox_env,
    sweep_cgroup,
    sweep_stale,
    unmount_quota,
)
from mlxio.sandbox.pipes import Verdict, _decide, _kill_group, _Outputs

log = logging.getLogger(__name__)

TEST_MARKER = "# --- mlxio: problem tests below (trusted) ---"
_CHILD_SOURCE = (Path(__file__).with_name("child.py")).read_text()


@attrs.frozen(kw_only=True)
class SandboxLimits:
    """Per-run limits: wall clock, memory, processes, file size, disk, captured output.

    `memory_mb` bounds each process's address space (RLIMIT_AS) and, where a memory cgroup
    can be made (root; v2 `memory.max` or v1 `memory.limit_in_bytes`), the resident memory of
    all the worker's processes together (its tmpfs files included). `disk_mb` is the total
    writable space: the size of bubblewrap's private /tmp tmpfs, or of a tmpfs mounted on the
    host work dir (root), else a polled quota that kills the worker when exceeded."""

    timeout_s: float = 5.0
    memory_mb: int = 512
    max_processes: int = 32
    max_file_mb: int = 16
    max_output_bytes: int = 1_000_000
    disk_mb: int = 64


class SandboxError(MlxioError):
    """Untrusted code would run without the isolation the user asked for."""

    default_fix = "install bubblewrap (apt-get install bubblewrap)"


def require_isolation(allow_weak: bool, flag: str) -> str:
    """The sandbox backend, if it isolates files and network (bubblewrap, sandbox-exec); a
    weaker one only when the user opted in by `flag`, else SandboxError."""
    backend = sandbox_backend()
    if backend in STRONG_BACKENDS:
        return backend
    if not allow_weak:
        raise SandboxError(f"no bubblewrap here: untrusted code would run under {backend!r} without file "
                           "isolation", where="sandbox",
                           fix=f"install bubblewrap (apt-get install bubblewrap), or pass {flag} to accept "
                               "the weaker backend")
    log.warning("untrusted code runs under the weaker %r backend (no file isolation), as %s asked",
                backend, flag)
    return backend


# ---------------------------------------------------------------- programs

def build_program(code: str, test: str, entry_point: str) -> str:
    """completion code + the problem's test code + `check(entry_point)`, as one program."""
    return f"{code}\n\n{TEST_MARKER}\n{test}\n\ncheck({entry_point})\n"


def split_program(program: str) -> tuple[str, str, str]:
    """Program -> (candidate code, trusted test code, entry point).

    With TEST_MARKER (from `build_program`) the split is at its last occurrence, which the
    candidate cannot move (it comes before the tests). Without it: the last statement must be
    `check(NAME)`; the tests are the last top-level `def check` onwards, plus the literal
    assignments and imports just above it (e.g. HumanEval's METADATA), which are safe to run
    in the judge. Raises ValueError when no `check(NAME)` call ends the program.
    """
    head, marker, tail = program.rpartition(TEST_MARKER)
    body = pyparse.parse(tail).body if marker else pyparse.parse(program).body
    last = body[-1] if body else None
    if not (isinstance(last, ast.Expr) and isinstance(last.value, ast.Call)
            and isinstance(last.value.func, ast.Name) and last.value.func.id == "check"
            and len(last.value.args) == 1 and isinstance(last.value.args[0], ast.Name)):
        raise ValueError("program must end with check(<entry point name>)")
    entry_point = last.value.args[0].id
    lines = (tail if marker else program).splitlines(keepends=True)
    if marker:
        return head, "".join(lines[: last.lineno - 1]), entry_point
    defs = [i for i, s in enumerate(body) if isinstance(s, ast.FunctionDef) and s.name == "check"]
    if not defs:
        raise ValueError("program has no top-level `def check`")
    start = defs[-1]
    while start > 0 and _safe_in_judge(body[start - 1]):
        start -= 1
    stmt = body[start]
    first = min([stmt.lineno] + [d.lineno for d in getattr(stmt, "decorator_list", [])]) - 1
    return "".join(lines[:first]), "".join(lines[first: last.lineno - 1]), entry_point


def _safe_in_judge(stmt: ast.stmt) -> bool:
    if isinstance(stmt, ast.Import | ast.ImportFrom):
        return True
    if isinstance(stmt, ast.Assign) and all(isinstance(t, ast.Name) for t in stmt.targets):
        try:
            ast.literal_eval(stmt.value)
        except ValueError:
            return False
        return True
    return False


def run_tests(program: str, limits: SandboxLimits = SandboxLimits()) -> Verdict:
    """Run `program` (= code + tests + `check(entry_point)`, see `split_program`) sandboxed."""
    try:
        code, test, entry_point = split_program(program)
    except (SyntaxError, ValueError) as err:
        # after the marker only the problem's own tests are parsed: their fault, not the model's
        status = "infra" if TEST_MARKER in program else "error"
        return Verdict(status=status, detail=f"cannot split program into code and tests: {err}")
    return run_check(code, test, entry_point, limits)


# ---------------------------------------------------------------- running

def _spawn(backend: str, role: str, args: dict, fds: tuple[int, ...], workdir: str | None,
           run_id: str, cgroups: list[str], disk_mb: int) -> subprocess.Popen:
    seccomp_fd = seccomp.filter_fd() if backend == "bwrap" else None
    try:
        launcher = launcher_argv(backend, workdir, disk_mb=disk_mb, seccomp_fd=seccomp_fd)
        argv = launcher + ["-I", "-S", "-B", "-c", _CHILD_SOURCE, role, json.dumps(args)]
        if cgroups:  # the shell joins the cgroups, then becomes the sandbox: no window to escape them
            joins = " && ".join(f'echo $$ > "${i}/cgroup.procs"' for i in range(len(cgroups)))
            argv = ["/bin/sh", "-c", f'{joins} && shift {len(cgroups) - 1} && exec "$@"', *cgroups] + argv
        env = sandbox_env(run_id)
        if backend != "bwrap":
            env["HOME"] = workdir or tempfile.gettempdir()
        extra = (seccomp_fd,) if seccomp_fd is not None else ()
        return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, pass_fds=fds + extra, start_new_session=True,
                                env=env, cwd=workdir or tempfile.gettempdir())
    finally:
        if seccomp_fd is not None:
            os.close(seccomp_fd)


def _confine(name: str, limits: SandboxLimits) -> list[str]:
    """Cgroups bounding one sandboxed process and all it starts: pids (+3: bwrap, its init,
    the shell) and memory, where this user can make them."""
    cgroup = make_pids_cgroup(name, limits.max_processes + 3)
    memory_cgroup = None
    if not limit_memory_v2(cgroup, limits.memory_mb):
        memory_cgroup = make_memory_cgroup(name, limits.memory_mb)
    return [c for c in (cgroup, memory_cgroup) if c]


def run_check(code: str, test: str, entry_point: str, limits: SandboxLimits = SandboxLimits(),
              *, prelude: str = "") -> Verdict:
    """Run the problem's `check(entry_point)` against the candidate `code`, sandboxed.

    `code` (untrusted) runs in the worker; `prelude` (e.g. the problem's prompt, for helpers
    such as HumanEval's `poly`) and `test` (trusted) run in the judge. Both processes get the
    same limits. See the module docstring.
    """
    backend = sandbox_backend()
    run_id, nonce = secrets.token_hex(8), secrets.token_hex(16)
    start = time.monotonic()
    sweep_stale()
    workdir = tempfile.mkdtemp(prefix=f"mlxio-sandbox-{os.getpid()}-{run_id}-")
    # disk: bwrap's tmpfs have --size; a weaker backend's host work dir gets a tmpfs (root)
    # or a polled quota
    mounted = backend != "bwrap" and mount_quota(workdir, limits.disk_mb)
    polled_quota = None if backend == "bwrap" or mounted else limits.disk_mb << 20
    worker_cgroups = _confine(f"{run_id}-worker", limits)
    judge_cgroups = _confine(f"{run_id}-judge", limits)
    cgroups = worker_cgroups + judge_cgroups
    req_r, req_w = os.pipe()  # judge -> worker calls
    rep_r, rep_w = os.pipe()  # worker -> judge replies
    res_r, res_w = os.pipe()  # judge -> us: its progress, then the verdict
    lim = attrs.asdict(limits)
    procs: list[subprocess.Popen] = []
    try:  # run_id in argv too: lets tests find strays by /proc/*/cmdline or environ
        procs.append(_spawn(backend, "worker", {"req": req_r, "rep": rep_w, "limits": lim,
                                                 "run_id": run_id},
                            (req_r, rep_w), workdir, run_id, worker_cgroups, limits.disk_mb))
        procs.append(_spawn(backend, "judge", {"req": req_w, "rep": rep_r, "res": res_w,
                                                "limits": lim, "run_id": run_id},
                            (req_w, rep_r, res_w), None, run_id, judge_cgroups, limits.disk_mb))
    except BaseException as err:  # nothing left behind, whatever broke
        for p in procs:
            _kill_group(p)
            p.wait()
        for fd in (req_r, req_w, rep_r, rep_w, res_r, res_w):
            os.close(fd)
        for c in cgroups:
            sweep_cgroup(c)
        if mounted:
            unmount_quota(workdir)
        shutil.rmtree(workdir, ignore_errors=True)
        if not isinstance(err, OSError | seccomp.SeccompUnavailable):
            raise
        return Verdict(status="infra", detail=f"cannot start sandbox ({backend}): {err}",
                       run_id=run_id, backend=backend, duration_s=time.monotonic() - start)
    for fd in (req_r, req_w, rep_r, rep_w, res_w):
        os.close(fd)
    worker, judge = procs
    job = {"nonce": nonce, "prelude": prelude, "test": test, "entry_point": entry_point}
    out = _Outputs(worker, judge, res_r, code.encode(), json.dumps(job).encode())
    if polled_quota is not None:
        out.quota = (workdir, polled_quota)
    try:
        timed_out = out.pump(start + limits.timeout_s, limits.max_output_bytes, worker, judge)
    finally:
        for p in reversed(procs):  # the judge first: it must not judge the killed worker
            _kill_group(p)
        for c in cgroups:
            sweep_cgroup(c)
        for p in procs:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                log.warning("sandbox process %d did not exit after SIGKILL", p.pid)
        out.pump(time.monotonic() + 0.5, limits.max_output_bytes, None, None)  # drain after kill
        out.close()
        if mounted:
            unmount_quota(workdir)
        shutil.rmtree(workdir, ignore_errors=True)
    return _decide(out, nonce, timed_out, worker, run_id=run_id, backend=backend,
                   duration_s=time.monotonic() - start)
