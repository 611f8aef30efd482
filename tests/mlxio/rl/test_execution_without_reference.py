"""Problems without a reference solution (the own-problems format of docs/rlaif.md): the judge
tells tests that cannot judge from a wrong answer by how the tests treat trivially wrong
candidates, a wrong answer is a fail (reward 0, counted in pass@k) and never "missing", and a
problem file's tests are checked when it is loaded."""

from __future__ import annotations

import json
import logging

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlxcore.rl.tasks import Problem
from mlxio.errors import DataError
from mlxio.rl import evaluation
from mlxio.rl.execution import CodeJudge
from mlxio.rl.problems import read_problems_jsonl
from mlxio.rl.rewards import ExecutionReward
from mlxio.sandbox import runner
from mlxio.sandbox.runner import SandboxLimits

pytestmark = pytest.mark.skipif(runner.sandbox_backend() != "bwrap",
                                reason="untrusted programs only run under bwrap")

LIMITS = SandboxLimits(timeout_s=3.0, memory_mb=256, max_processes=16, max_output_bytes=100_000)
PROMPT = 'def mean_and_label(xs):\n    """(mean of xs, "high" if it is over 1 else "low")."""\n'
# tests as a user writes them: the tests' own code trips on a wrong answer's type
TEST = ("def check(candidate):\n    m, label = candidate([1, 2, 3])\n    assert abs(m - 2.0) < 1e-9\n"
        "    assert label.lower() == 'high'\n    assert candidate([0.5])[1].lower() == 'low'\n")
RIGHT = "```python\ndef mean_and_label(xs):\n    m = sum(xs) / len(xs)\n    return m, 'high' if m > 1 else 'low'\n```"
WRONG = [  # each makes the tests' own code raise (TypeError, AttributeError, ValueError), not an assert
    "```python\ndef mean_and_label(xs):\n    return None\n```",
    "```python\ndef mean_and_label(xs):\n    return sum(xs) / len(xs), None\n```",
    "```python\ndef mean_and_label(xs):\n    return [sum(xs)]\n```",
]


@pytest.fixture(scope="module")
def judge():
    return CodeJudge(LIMITS, workers=2)


def write_problems(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_one_right_answer_of_four_is_pass_at_1_a_quarter(tmp_path, monkeypatch, judge):
    """The issue's case: a problem file as documented (no reference), 1 answer of 4 right."""
    path = write_problems(tmp_path / "problems.jsonl", [
        {"task_id": "mean/0", "prompt": PROMPT, "entry_point": "mean_and_label", "test": TEST}])
    problems = evaluation.judgeable(read_problems_jsonl(path), str(path), judge)
    assert [p.task_id for p in problems] == ["mean/0"]
    texts = [RIGHT, *WRONG]
    monkeypatch.setattr(evaluation, "_decode", lambda policy, ps, cfg, n, *a: texts[: len(ps) * n])
    cfg = evaluation.EvalConfig(samples=4, greedy=False, resamples=100)
    out = evaluation.evaluate(None, problems, cfg, [], None, judge=judge, temperature=1.0)
    assert out["sampled"]["pass@1"] == pytest.approx(0.25)  # was 1.0: the 3 wrong ones were "missing"
    assert out["sampled"]["missing"] == 0 and out["per_problem"]["mean/0"] == {"passed": 1, "n": 4}
    assert ExecutionReward(LIMITS, workers=2).score(problems * 4, texts) == [1.0, 0.0, 0.0, 0.0]


_VALUES = st.one_of(st.none(), st.integers(), st.floats(allow_nan=False), st.text(max_size=8),
                    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
                    st.tuples(st.integers()), st.tuples(st.text(max_size=4), st.none()))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=_VALUES)
def test_any_wrong_answer_on_tests_that_can_judge_is_a_fail(judge, value):
    """Whatever wrong value a candidate returns (its type tripping the tests' own code or not),
    the verdict is a fail, never missing."""
    problem = Problem(task_id="mean", prompt=PROMPT, entry_point="mean_and_label", test=TEST)
    completion = f"```python\ndef mean_and_label(xs):\n    return {value!r}\n```"
    assert judge.passed([problem], [completion]) == [False]


_CALLS = "    assert candidate([1, 2, 3])[0] == 2.0\n"
UNJUDGEABLE = {
    "raise before the call": "def check(candidate):\n    raise RuntimeError('broken')\n" + _CALLS,
    "hang before the call": "def check(candidate):\n    while True:\n        pass\n" + _CALLS,
    "flood before the call": "def check(candidate):\n    while True:\n        print('x' * 10000)\n" + _CALLS,
    "a name error after the call": "def check(candidate):\n    candidate([1])\n    helper_not_defined()\n",
    "no assert": "def check(candidate):\n    candidate([1, 2, 3])\n",
    "swallows every error": "def check(candidate):\n    try:\n    " + _CALLS + "    except Exception:\n        pass\n",
    "does not load": "def check(candidate)\n" + _CALLS,
    "no check": "def test(candidate):\n" + _CALLS,
}


@pytest.mark.parametrize("name", list(UNJUDGEABLE))
def test_tests_that_cannot_judge_are_told_without_a_reference(judge, name):
    problem = Problem(task_id=name, prompt=PROMPT, entry_point="mean_and_label", test=UNJUDGEABLE[name])
    check = judge.check_problem(problem)
    assert check.sound is False and check.why
    assert judge.tests_can_judge(problem).sound is False
    # a right answer meets the same tests: their fault is missing (or, with no assert, any answer passes)
    assert judge.verdict(problem, RIGHT).status in ("infra", "passed")
    assert judge.check_problem(attrs.evolve(problem, test=TEST)).sound is True


def test_a_problem_file_is_checked_when_loaded(tmp_path, caplog, judge):
    good = {"task_id": "good", "prompt": PROMPT, "entry_point": "mean_and_label", "test": TEST}
    rows = [good, {**good, "task_id": "no assert", "test": UNJUDGEABLE["no assert"]},
            {**good, "task_id": "broken reference", "canonical_solution": "    return 0, 'low'\n"},
            {**good, "task_id": "good reference", "canonical_solution": "    m = sum(xs) / len(xs)\n"
                                                                         "    return m, 'high' if m > 1 else 'low'\n"}]
    path = write_problems(tmp_path / "mine.jsonl", rows)
    with caplog.at_level(logging.WARNING):
        kept = evaluation.judgeable(read_problems_jsonl(path), str(path), judge)
    assert [p.task_id for p in kept] == ["good", "good reference"]
    lines = [r.getMessage() for r in caplog.records if "cannot be judged" in r.getMessage()]
    assert len(lines) == 2 and all("\n" not in line for line in lines)
    assert lines[0].startswith(f"{path}:2: problem 'no assert' cannot be judged (its tests pass a candidate that")
    assert lines[1].startswith(f"{path}:3: problem 'broken reference' cannot be judged (its reference solution")
    none_left = write_problems(tmp_path / "none.jsonl", rows[1:3])
    with pytest.raises(DataError, match=r"no problem can be judged: .*none\.jsonl:1: problem 'no assert'"):
        evaluation.judgeable(read_problems_jsonl(none_left), str(none_left), judge)


def test_problems_found_sound_are_not_checked_again(tmp_path, monkeypatch):
    """A problem file is checked once: the sound problems are remembered (per limits and probe
    set), the others checked again so their refusal can say why."""
    from mlxio.rl.rewards import RewardCache

    good = Problem(task_id="good", prompt=PROMPT, entry_point="mean_and_label", test=TEST)
    bad = attrs.evolve(good, task_id="bad", test=UNJUDGEABLE["no assert"])
    counting = CodeJudge(LIMITS, workers=1)
    runs = []
    real = CodeJudge._check
    monkeypatch.setattr(CodeJudge, "_check", lambda self, problem, code: runs.append(problem.task_id)
                        or real(self, problem, code))
    first = counting.check_problems([good, bad], RewardCache(tmp_path / "known"))
    assert [c.sound for c in first] == [True, False] and runs.count("good") == 3
    runs.clear()
    again = counting.check_problems([good, bad], RewardCache(tmp_path / "known"))  # a new run, read from disk
    assert [c.sound for c in again] == [True, False] and "good" not in runs and "bad" in runs
    other_limits = CodeJudge(attrs.evolve(LIMITS, timeout_s=4.0), workers=1)
    assert other_limits._check_key(good) != counting._check_key(good)


def test_the_judge_counts_its_verdicts_by_status():
    """What a run's missing-reward guard reads: each verdict `run` gave, by status, since the
    last look (a check out of time is a timeout, counted)."""
    counting = CodeJudge(attrs.evolve(LIMITS, timeout_s=1.0), workers=1)
    problem = Problem(task_id="mean", prompt=PROMPT, entry_point="mean_and_label", test=TEST)
    loops = "```python\ndef mean_and_label(xs):\n    while True:\n        pass\n```"
    assert counting.passed([problem] * 3, [RIGHT, WRONG[0], loops]) == [True, False, False]
    assert counting.take_statuses() == {"passed": 1, "failed": 1, "timeout": 1}
    assert counting.take_statuses() == {}
