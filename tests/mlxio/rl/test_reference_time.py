"""A time limit per problem from its reference solution's run time (mlxio.rl.reference_time): the
rounding and bounds, one measurement per problem (kept in a store, so a resumed run uses the
same limit), the sandbox's limit where no reference passes, and the execution reward's checks
running under it in the real sandbox."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from mlxcore.rl.tasks import Problem
from mlxio.rl import execution
from mlxio.rl.execution import CodeJudge
from mlxio.rl.reference_time import GRAIN_S, ReferenceLimits, limit_from
from mlxio.rl.rewards import ExecutionReward, RewardCache
from mlxio.sandbox import runner
from mlxio.sandbox.pipes import Verdict
from mlxio.sandbox.runner import SandboxLimits

BASE = SandboxLimits(timeout_s=5.0, memory_mb=256, max_processes=16)
ADD = Problem(task_id="add", prompt='def add(a, b):\n    """a + b"""\n', entry_point="add",
              test="def check(candidate):\n    assert candidate(2, 3) == 5\n", canonical_solution="    return a + b\n")


@pytest.mark.parametrize("duration,want", [(0.01, 1.0), (0.12, 1.5), (0.2, 2.0), (0.21, 2.5), (3.0, 5.0)])
def test_limit_is_factor_times_duration_rounded_up_within_bounds(duration, want):
    assert limit_from(duration, 10.0, 1.0, 5.0) == want
    assert (want / GRAIN_S).is_integer()


class FakeReference:
    """run_reference stand-in: a verdict of `status` taking `duration_s`, counting its calls."""

    def __init__(self, status="passed", duration_s=0.16):
        self.calls, self.status, self.duration_s, self.lock = 0, status, duration_s, threading.Lock()

    def __call__(self, problem, limits):
        with self.lock:
            self.calls += 1
        assert limits == BASE  # the reference runs under the sandbox's full limits
        return Verdict(status=self.status, duration_s=self.duration_s)


def test_one_measurement_per_problem_kept_for_a_resume(tmp_path):
    ref = FakeReference()
    limits = ReferenceLimits(10.0, 1.0, store=RewardCache(tmp_path))
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda _: limits.limits_for(ADD, BASE, ref), range(16)))
    assert ref.calls == 1 and {g.timeout_s for g in got} == {2.0}
    assert all(g.memory_mb == BASE.memory_mb for g in got)
    # a resumed run: a new judge reads the stored limit, whatever the reference would take now
    slower = FakeReference(duration_s=0.4)
    again = ReferenceLimits(10.0, 1.0, store=RewardCache(tmp_path)).limits_for(ADD, BASE, slower)
    assert again.timeout_s == 2.0 and slower.calls == 0
    # other settings are another key
    assert ReferenceLimits(20.0, 1.0, store=RewardCache(tmp_path)).limits_for(ADD, BASE, slower).timeout_s == 5.0


def test_without_a_passing_reference_the_sandbox_limit_stays():
    no_ref = Problem(task_id="x", prompt=ADD.prompt, entry_point="add", test=ADD.test)
    ref = FakeReference()
    assert ReferenceLimits(10.0, 1.0).limits_for(no_ref, BASE, ref) is BASE and ref.calls == 0
    failing = FakeReference(status="failed")
    assert ReferenceLimits(10.0, 1.0).limits_for(ADD, BASE, failing).timeout_s == BASE.timeout_s
    broken, limits = FakeReference(status="infra"), ReferenceLimits(10.0, 1.0)
    assert limits.limits_for(ADD, BASE, broken) is BASE and limits.limits_for(ADD, BASE, broken) is BASE
    assert broken.calls == 2  # a sandbox failure is not remembered


def test_the_reward_key_names_the_setting():
    off, on = ExecutionReward(BASE), ExecutionReward(BASE, per_problem=(10.0, 1.0))
    assert off.judge.per_problem is None and on.judge.per_problem.factor == 10.0
    assert off.config_key() != on.config_key() and on.config_key().startswith(off.config_key())


@pytest.mark.skipif(runner.sandbox_backend() != "bwrap", reason="untrusted programs only run under bwrap")
def test_a_looping_candidate_times_out_at_the_problems_limit(monkeypatch):
    seen = []
    real = execution.run_check

    def spy(code, test, entry_point, limits, **kw):
        seen.append(limits.timeout_s)
        return real(code, test, entry_point, limits, **kw)

    monkeypatch.setattr(execution, "run_check", spy)
    judge = CodeJudge(BASE, 1, ReferenceLimits(1e-3, 1.0))  # any reference: the floor, 1 s
    loop = judge.verdict(ADD, "```python\ndef add(a, b):\n    while True:\n        pass\n```")
    right = judge.verdict(ADD, "```python\ndef add(a, b):\n    return a + b\n```")
    assert loop.status == "timeout" and right.passed
    assert seen == [BASE.timeout_s, 1.0, 1.0]  # the reference once under 5 s, then each candidate under 1 s
