"""The rollout log (rollouts.jsonl): its records, resume, reading back with one clear error per bad
line, de-duplication and the judge's split by task id."""

import json

import numpy as np
import pytest

from mlxcore.rl.tasks import Problem
from mlxio.errors import DataError
from mlxio.rl import rollout_log
from mlxio.rl.rollout_log import Judged, RolloutLog

P1 = Problem(task_id="proc/train/lists/first/d1/0", prompt="def f(xs):\n", entry_point="f", test="")
P2 = Problem(task_id="HumanEval/3", prompt="def g(x):\n", entry_point="g", test="")


def write_steps(log: RolloutLog, steps) -> None:
    for step in steps:
        log.write_step(step, [P1, P2, P1], [f"a{step}", f"b{step}", f"c{step}"],
                       {"execution": np.array([1.0, 0.0, np.nan]), "format": np.array([1.0, 0.5, 0.0])})


def test_records_hold_problem_completion_and_verdict(tmp_path):
    write_steps(RolloutLog(tmp_path), [1, 2])
    rows = [json.loads(line) for line in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 1, 1, 2, 2, 2]
    assert rows[0] == {"step": 1, "task_id": P1.task_id, "prompt": P1.prompt, "completion": "a1", "passed": True,
                       "rewards": {"execution": 1.0, "format": 1.0}}
    assert rows[1]["passed"] is False and rows[2]["passed"] is None  # missing verdict: null, never a fail
    assert rows[2]["rewards"]["execution"] is None
    # without an execution reward there is no verdict
    (row,) = rollout_log.records(1, [P1], ["x"], {"ai_feedback": np.array([0.7])})
    assert row["passed"] is None and row["rewards"] == {"ai_feedback": pytest.approx(0.7)}
    judged = rollout_log.read_log(tmp_path)  # the run folder or the file
    assert [j.completion for j in judged] == ["a1", "b1", "a2", "b2"]
    assert judged[0] == Judged(task_id=P1.task_id, prompt=P1.prompt, completion="a1", passed=True)


def test_resume_drops_steps_after_the_checkpoint_and_fresh_runs_start_empty(tmp_path):
    write_steps(RolloutLog(tmp_path), [1, 2, 3])
    write_steps(RolloutLog(tmp_path, resume_step=2), [3])  # killed after step 3, resumed from step 2
    steps = [r["step"] for r in rollout_log.read_rows(tmp_path)]
    assert steps == [1, 1, 1, 2, 2, 2, 3, 3, 3]
    RolloutLog(tmp_path)
    assert rollout_log.read_rows(tmp_path) == []


def test_bad_logs_fail_with_file_and_line(tmp_path):
    with pytest.raises(DataError, match="no rollout log at .*rollouts.jsonl"):
        rollout_log.log_path(tmp_path)
    path = tmp_path / "rollouts.jsonl"
    good = json.dumps({"task_id": "t", "prompt": "p", "completion": "c", "passed": True})
    path.write_text(good + "\n{not json\n" + good + "\n")
    with pytest.raises(DataError, match=r"not JSON .*rollouts.jsonl:2\); fix or delete that line"):
        rollout_log.read_log(path)
    path.write_text(good + "\n" + json.dumps({"task_id": 3, "prompt": "p", "completion": "c", "passed": False}) + "\n")
    with pytest.raises(DataError, match=r"'task_id' must be a str, got int \(.*rollouts.jsonl:2\)"):
        rollout_log.read_log(path)
    path.write_text(json.dumps({"task_id": "t", "prompt": "p", "completion": "c", "passed": 1}) + "\n")
    with pytest.raises(DataError, match=r"'passed' must be a bool, got int \(.*rollouts.jsonl:1\)"):
        rollout_log.read_log(path)
    path.write_text("[1, 2]\n")
    with pytest.raises(DataError, match=r"expected a JSON object, got list \(.*rollouts.jsonl:1\)"):
        rollout_log.read_log(path)
    path.write_text(good + '\n{"task_id": "t", "pro')  # a writer killed mid-line: its torn last line skipped
    assert len(rollout_log.read_log(path)) == 1


def test_unique_keeps_the_first_of_each_prompt_and_completion():
    a = Judged(task_id="t", prompt="p", completion="c", passed=True)
    b = Judged(task_id="t", prompt="p", completion="c", passed=False)
    c = Judged(task_id="t", prompt="p", completion="d", passed=False)
    assert rollout_log.unique([a, b, c]) == [a, c]


def test_split_by_task_id():
    split = rollout_log.split_of
    assert split("proc/train/lists/first/d1/0", ("parsing",), 0.2) == "train"
    assert split("proc/heldout/lists/first/d1/0", ("parsing",), 0.2) == "heldout"
    assert split("proc/family/parsing/kv/d1/0", ("parsing",), 0.2) == "heldout_family"
    assert split("proc/train/parsing/kv/d1/0", ("parsing",), 0.2) == "heldout_family"  # never trained on
    ids = [f"HumanEval/{i}" for i in range(400)]
    held = [split(t, (), 0.2) for t in ids]
    assert set(held) == {"train", "heldout"} and 0.12 < held.count("heldout") / 400 < 0.28
    assert held == [split(t, (), 0.2) for t in ids]  # a function of the id alone
