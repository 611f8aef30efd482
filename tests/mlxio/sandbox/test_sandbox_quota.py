"""Sandbox quotas: a total disk quota on the writable space of one check (bubblewrap's private
/tmp tmpfs has `--size`; a weaker backend's host work dir gets a tmpfs as root, else a polled
quota that kills the worker), a memory bound over all the worker's processes together (a memory
cgroup), and the RLAIF recipe's refusal to run untrusted code without bubblewrap unless asked."""

from __future__ import annotations

import attrs
import pytest

from mlxio.sandbox import backend, runner
from mlxio.sandbox.runner import SandboxError, SandboxLimits, require_isolation, run_check

LIMITS = SandboxLimits(timeout_s=20.0, memory_mb=256, max_processes=16, max_file_mb=4, disk_mb=8)

# The candidate fills its writable space with 1 MiB files (4 MiB is the per-file cap), in /tmp
# (bwrap) or its working directory (weaker backends); the test asserts the quota stopped it.
FILL = """
def fill(where):
    import os
    written = 0
    try:
        for i in range(64):
            with open(os.path.join(where, f"f{i}"), "wb") as h:
                h.write(b"x" * (1 << 20))
            written += 1
    except OSError as err:
        return ("stopped", written, err.errno)
    return ("not stopped", written, 0)
"""
FILL_TEST = """
def check(candidate):
    kind, written, errno_ = candidate(WHERE)
    assert kind == "stopped" and written <= 8 and errno_ == 28, (kind, written, errno_)
"""


@pytest.mark.skipif(runner.sandbox_backend() != "bwrap", reason="needs bubblewrap")
def test_bwrap_tmpfs_is_capped_at_disk_mb():
    verdict = run_check(FILL, FILL_TEST.replace("WHERE", "'/tmp'"), "fill", LIMITS)
    assert verdict.status == "passed", verdict
    bigger = run_check(FILL, FILL_TEST.replace("WHERE", "'/tmp'"), "fill", attrs.evolve(LIMITS, disk_mb=128))
    assert bigger.status == "failed"  # the same program with room: it writes all 64 MiB (the test can fail)


def test_weak_backend_work_dir_gets_a_tmpfs_quota(monkeypatch):
    if __import__("os").geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    monkeypatch.setattr(runner, "sandbox_backend", lambda: "none")
    verdict = run_check(FILL, FILL_TEST.replace("WHERE", "'.'"), "fill", LIMITS)
    assert verdict.status == "passed", verdict


def test_weak_backend_polled_quota_kills_the_worker(monkeypatch):
    monkeypatch.setattr(runner, "sandbox_backend", lambda: "none")
    monkeypatch.setattr(runner, "mount_quota", lambda path, mb: False)  # as a non-root user
    slow_fill = FILL.replace('h.write(b"x" * (1 << 20))', 'h.write(b"x" * (1 << 20)); __import__("time").sleep(0.2)')
    verdict = run_check(slow_fill, FILL_TEST.replace("WHERE", "'.'"), "fill", LIMITS)
    assert verdict.status == "error" and "disk quota" in verdict.detail, verdict


# Four children each hold 150 MiB at once (under RLIMIT_AS 256 MiB each): 600 MiB in all.
HOG = """
def hog():
    import os, time
    pids = []
    for _ in range(4):
        pid = os.fork()
        if pid == 0:
            block = bytearray(150 << 20)
            for i in range(0, len(block), 4096):
                block[i] = 1
            time.sleep(1.5)
            os._exit(0)
        pids.append(pid)
    return sum(os.waitpid(p, 0)[1] == 0 for p in pids)
"""
HOG_TEST = "def check(candidate):\n    assert candidate() == 4\n"


def _memory_cgroup_possible() -> bool:
    path = backend.make_memory_cgroup("probe-quota-test", 64)
    if path is not None:
        backend.sweep_cgroup(path)
        return True
    pids = backend.make_pids_cgroup("probe-quota-test", 8)
    ok = backend.limit_memory_v2(pids, 64)
    backend.sweep_cgroup(pids)
    return ok


@pytest.mark.skipif(runner.sandbox_backend() != "bwrap", reason="needs bubblewrap")
def test_memory_is_bounded_over_all_processes_of_a_check():
    if not _memory_cgroup_possible():
        pytest.skip("no memory cgroup can be made here (needs root and a memory controller)")
    bounded = run_check(HOG, HOG_TEST, "hog", attrs.evolve(LIMITS, memory_mb=256))
    assert bounded.status in ("failed", "error", "timeout"), bounded
    roomy = run_check(HOG, HOG_TEST, "hog", attrs.evolve(LIMITS, memory_mb=1024))
    assert roomy.status == "passed", roomy  # the same program under a larger bound: the test can fail


def test_rlaif_refuses_weak_isolation_unless_asked(monkeypatch, tmp_path):
    from mlxio.errors import cli_main
    from recipes import rlaif_qwen

    monkeypatch.setattr(runner, "sandbox_backend", lambda: "unshare")
    with pytest.raises(SandboxError, match="without file isolation.*--sandbox.allow_weak true"):
        require_isolation(False, "--sandbox.allow_weak true")
    assert require_isolation(True, "--sandbox.allow_weak true") == "unshare"
    loaded = []
    monkeypatch.setattr(rlaif_qwen, "open_session", lambda cfg, world: loaded.append(cfg))
    with pytest.raises(SystemExit) as exit_info:
        cli_main("rlaif_qwen", rlaif_qwen.main, ["--preset", "smoke", "--out_dir", str(tmp_path / "run")])
    assert exit_info.value.code == 1 and not loaded  # refused before the model loads
    monkeypatch.setattr(runner, "sandbox_backend", lambda: "bwrap")
    assert require_isolation(False, "x") == "bwrap"


# The problem's own test code forks as many processes as it can (trusted code, but it must not
# escape the limits the candidate has): the count it reaches is reported in its assertion.
FORK_TEST = """
def check(candidate):
    import os, time
    pids = []
    for _ in range(200):
        try:
            pid = os.fork()
        except OSError:
            break
        if pid == 0:
            time.sleep(5)
            os._exit(0)
        pids.append(pid)
    assert False, f"forked {len(pids)}"
"""


@pytest.mark.skipif(runner.sandbox_backend() != "bwrap", reason="needs bubblewrap")
def test_the_tests_own_code_has_the_process_limit():
    verdict = run_check("def f():\n    return 1\n", FORK_TEST, "f", attrs.evolve(LIMITS, timeout_s=10.0))
    forked = int(verdict.detail.rsplit("forked ", 1)[1].split()[0])
    assert forked <= LIMITS.max_processes, verdict.detail


@pytest.mark.skipif(runner.sandbox_backend() != "bwrap", reason="needs bubblewrap")
def test_the_sandbox_runs_unprivileged_with_its_writable_space_in_one_quota():
    probe = """
def f():
    import os
    found = {"uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(), "groups": os.getgroups()}
    with open("/proc/self/status") as h:
        found["caps"] = [ln.split()[1] for ln in h if ln.startswith(("CapEff", "CapPrm", "CapBnd"))]
    with open("/proc/self/status") as h:
        found["no_new_privs"] = [ln.split()[1] for ln in h if ln.startswith("NoNewPrivs")]
    with open("/proc/self/status") as h:
        found["seccomp"] = [ln.split()[1] for ln in h if ln.startswith("Seccomp:")]
    with open("/proc/self/mountinfo") as h:
        found["rw"] = sorted(ln.split()[4] for ln in h if ln.split()[5].startswith("rw") and ln.split()[4] not in
                             ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty", "/dev/pts"))
    return found
"""
    test = """
def check(candidate):
    found = candidate()
    assert 0 not in (found["uid"], found["euid"], found["gid"]) and found["groups"] in ([], [found["gid"]]), found
    assert found["caps"] == ["0000000000000000"] * 3, found
    assert found["no_new_privs"] == ["1"] and found["seccomp"] == ["2"], found
    assert found["rw"] == ["/dev/shm", "/tmp"], found
"""
    verdict = run_check(probe, test, "f", LIMITS)
    assert verdict.status == "passed", verdict.detail


@pytest.mark.parametrize("fake", ["/bin/true", "/bin/echo"])
def test_the_probe_does_not_trust_a_program_that_runs_nothing(monkeypatch, fake):
    """`MLXIO_BWRAP=/bin/true` exits 0 without running the interpreter: the probe asks for a
    known program's answer, so bubblewrap is not taken to work, and the recipe's check
    refuses the weaker backend it falls back to."""
    monkeypatch.setenv("MLXIO_BWRAP", fake)
    backend.sandbox_backend.cache_clear()
    try:
        assert backend.sandbox_backend() != "bwrap"
        with pytest.raises(SandboxError, match="no bubblewrap"):
            require_isolation(False, "--sandbox.allow_weak true")
    finally:
        monkeypatch.delenv("MLXIO_BWRAP")
        backend.sandbox_backend.cache_clear()


@pytest.mark.skipif(runner.sandbox_backend() != "bwrap", reason="needs bubblewrap")
def test_a_killed_trainer_leaves_nothing_after_the_next_start(tmp_path):
    """SIGKILL a process in the middle of a sandboxed check: its cgroups and work dir stay
    behind (no cleanup ran) until the next process's first check sweeps them."""
    import os
    import signal
    import subprocess
    import sys
    import tempfile
    import time
    from pathlib import Path

    code = ("import time\nfrom mlxio.sandbox.runner import SandboxLimits, run_check\n"
            "print('go', flush=True)\n"
            "run_check('import time\\ntime.sleep(30)\\ndef f():\\n    return 1\\n',"
            " 'def check(c):\\n    assert c() == 1\\n', 'f', SandboxLimits(timeout_s=60))\n")
    repo = Path(__file__).resolve().parents[3]
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, cwd=repo,
                             env={**os.environ, "PYTHONPATH": str(repo)})
    assert child.stdout.readline().strip() == b"go"
    tmp = Path(tempfile.gettempdir())

    def leftovers():
        dirs = [p for p in tmp.glob(f"mlxio-sandbox-{child.pid}-*")]
        groups = [p for root in ("/sys/fs/cgroup/pids", "/sys/fs/cgroup", "/sys/fs/cgroup/memory")
                  for p in Path(root).glob(f"mlxio-*{child.pid}-*")]
        return dirs + groups

    deadline = time.monotonic() + 20
    while not leftovers() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    assert leftovers(), "the check never started"
    child.send_signal(signal.SIGKILL)
    child.wait()
    backend.sweep_stale.cache_clear()
    try:
        assert backend.sweep_stale() >= 1
    finally:
        backend.sweep_stale.cache_clear()
    assert leftovers() == []
