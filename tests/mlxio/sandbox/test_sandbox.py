"""The sandbox against a corpus of hostile programs (tests/hostile/), plus infra failures."""

from __future__ import annotations

import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import attrs
import pytest

from mlxio.sandbox import runner
from mlxio.sandbox.runner import SandboxLimits, build_program, run_check, run_tests, split_program

HOSTILE = sorted((Path(__file__).resolve().parents[2] / "hostile").glob("*.py"))
REPO = Path(__file__).resolve().parents[3]
TEST = """
def check(candidate):
    assert candidate(2, 3) == 5
    assert candidate(-1, 1) == 0
    assert candidate(10, 5) == 15
"""
GOOD = "def add(a, b):\n    return a + b\n"
LIMITS = SandboxLimits(timeout_s=2.0, memory_mb=256, max_processes=16, max_file_mb=4,
                       max_output_bytes=200_000)

pytestmark = pytest.mark.skipif(runner.sandbox_backend() != "bwrap",
                                reason="hostile programs are only safe to run under bwrap")


def _survivors(run_id: str) -> list[int]:
    """Pids whose environment or command line carries this run's marker."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        for name in ("environ", "cmdline"):
            try:
                if run_id.encode() in Path("/proc", pid, name).read_bytes():
                    found.append(int(pid))
                    break
            except OSError:
                pass
    return found


@pytest.fixture(scope="module")
def hostile_runs(tmp_path_factory):
    """Runs every hostile program once (2 at a time); returns what each left behind."""
    home = tmp_path_factory.mktemp("home")
    (home / "sentinel.txt").write_text("untouched")
    secret_token = os.urandom(16).hex()
    secret = tmp_path_factory.mktemp("outside") / "secret.txt"
    secret.write_text(secret_token)
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    port = listener.getsockname()[1]

    def one(path: Path):
        code = (path.read_text().replace("__HOME__", str(home))
                .replace("__SECRET_FILE__", str(secret)).replace("__REPO__", str(REPO))
                .replace("__PORT__", str(port)))
        verdict = run_tests(build_program(code, TEST, "add"), LIMITS)
        time.sleep(1.0)  # "no process survives 1 s after its timeout"
        return path.name, verdict, _survivors(verdict.run_id)

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(one, HOSTILE))
    try:
        conn, _ = listener.accept()
        connected = True
        conn.close()
    except BlockingIOError:
        connected = False
    listener.close()
    return {"results": results, "home": home, "secret": secret_token, "connected": connected}


def test_corpus_is_big_enough():
    assert len(HOSTILE) >= 20


def test_no_hostile_program_passes(hostile_runs):
    from collections import Counter

    print("hostile statuses:", Counter(v.status for _, v, _ in hostile_runs["results"]))
    passed = [(n, v.detail) for n, v, _ in hostile_runs["results"] if v.status == "passed"]
    assert passed == []
    for name, verdict, _ in hostile_runs["results"]:
        assert verdict.status in ("failed", "timeout", "error"), (name, verdict)


def test_no_process_survives(hostile_runs):
    assert [(n, s) for n, _, s in hostile_runs["results"] if s] == []


def test_nothing_outside_changes_or_leaks(hostile_runs):
    home = hostile_runs["home"]
    assert sorted(p.name for p in home.iterdir()) == ["sentinel.txt"]
    assert (home / "sentinel.txt").read_text() == "untouched"
    assert not hostile_runs["connected"]
    for name, verdict, _ in hostile_runs["results"]:
        assert hostile_runs["secret"] not in verdict.stdout + verdict.stderr, name
        assert "[tool.ruff]" not in verdict.stdout, name  # the repo's pyproject.toml


def test_expected_kills(hostile_runs):
    status = {n: v.status for n, v, _ in hostile_runs["results"]}
    assert status["08_sigalrm_ignored_loop.py"] == "timeout"
    assert status["20_sleep_past_timeout.py"] == "timeout"
    assert status["09_gigabyte_output.py"] == "error"
    assert status["11_always_equal.py"] == "failed"


def test_correct_solution_passes_and_wrong_fails():
    good = run_tests(build_program(GOOD, TEST, "add"), LIMITS)
    assert good.status == "passed", good
    bad = run_tests(build_program("def add(a, b):\n    return a * b\n", TEST, "add"), LIMITS)
    assert bad.status == "failed"


def test_split_without_marker_keeps_candidate_out_of_judge():
    program = ("import math\ndef add(a, b):\n    return a + b\nX = print('side effect')\n"
               "METADATA = {'a': 1}\n\ndef check(candidate):\n    assert candidate(1, 1) == 2\n"
               "\ncheck(add)\n")
    code, test, entry = split_program(program)
    assert entry == "add"
    assert "print" in code and "print" not in test  # a call is never hoisted into the judge
    assert test.startswith("METADATA") and "def check" in test
    assert run_tests(program, LIMITS).status == "passed"
    assert run_tests("def add(a, b):\n    return a\n", LIMITS).status == "error"


def test_candidate_exceptions_reach_the_test_as_builtins():
    test = ("def check(candidate):\n    try:\n        candidate(-1)\n    except ValueError:\n"
            "        pass\n    else:\n        raise AssertionError('no ValueError')\n"
            "    assert candidate(4) == [2.0, (1, 'x'), {3: b'z'}, {1}, None, True, 1j]\n")
    code = ("def f(x):\n    if x < 0:\n        raise ValueError('neg')\n"
            "    return [x / 2, (1, 'x'), {3: b'z'}, {1}, None, True, 1j]\n")
    assert run_check(code, test, "f", LIMITS).status == "passed"


def test_prelude_helpers_are_trusted():
    # HumanEval/32 style: the test calls a helper from the prompt; the candidate's own
    # (cheating) version of that helper must not be the one the judge uses.
    prelude = "def poly(x):\n    return x - 3\n\ndef root():\n    '''doc'''\n"
    test = "def check(candidate):\n    assert abs(poly(candidate())) < 1e-9\n"
    honest = "def poly(x):\n    return x - 3\n\ndef root():\n    return 3.0\n"
    cheat = "def poly(x):\n    return 0\n\ndef root():\n    return 7.0\n"
    assert run_check(honest, test, "root", LIMITS, prelude=prelude).status == "passed"
    assert run_check(cheat, test, "root", LIMITS, prelude=prelude).status == "failed"


def test_missing_bwrap_is_infra(monkeypatch):
    monkeypatch.setattr(runner, "launcher_argv", lambda backend, workdir, **kw: ["/nonexistent/bwrap"])
    verdict = run_tests(build_program(GOOD, TEST, "add"), LIMITS)
    assert verdict.status == "infra" and ("cannot start" in verdict.detail or "no verdict" in verdict.detail)


@pytest.mark.parametrize("judge_src", [
    "import os\nos._exit(3)\n",  # the harness crashes before any verdict
    # a verdict without the right nonce (e.g. forged) is never believed
    "import json, os, sys\nargs = json.loads(sys.argv[2])\nif sys.argv[1] == 'judge':\n"
    "    os.write(args['res'], json.dumps({'nonce': 'x', 'status': 'passed'}).encode())\n",
])
def test_broken_harness_is_infra(monkeypatch, judge_src):
    monkeypatch.setattr(runner, "_CHILD_SOURCE", judge_src)
    verdict = run_tests(build_program(GOOD, TEST, "add"), attrs.evolve(LIMITS, timeout_s=5.0))
    assert verdict.status == "infra", verdict


def test_broken_problem_tests_are_infra():
    verdict = run_check(GOOD, "def check(candidate):\n    assert (\n", "add", LIMITS)
    assert verdict.status == "infra"


def test_builtin_subclasses_cross_as_plain_data():
    test = ("def check(candidate):\n    counts, point, r, sneaky = candidate()\n"
            "    assert counts == {'a': 2, 'b': 1} and type(counts) is dict\n"
            "    assert point == (1, 2) and r == range(3)\n    assert sneaky != 5\n")
    code = ("from collections import Counter, namedtuple\nP = namedtuple('P', 'x y')\n"
            "class Sneaky(int):\n    def __eq__(self, other):\n        return True\n"
            "    __ne__ = lambda self, other: False\n    __hash__ = int.__hash__\n"
            "def f():\n    return Counter('aab'), P(1, 2), range(3), Sneaky(0)\n")
    assert run_check(code, test, "f", LIMITS).status == "passed"


def test_unparsable_problem_tests_after_marker_are_infra():
    assert run_tests(build_program(GOOD, "def check(c)\n", "add"), LIMITS).status == "infra"
    assert run_tests(build_program("def add(a, b)\n", TEST, "add"), LIMITS).status == "error"
