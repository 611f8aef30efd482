"""Rewards that never arrive (`mlxio.rl.reward_health`): counted per source, a run stops on a
source missing too often (or goes on saying so), and a run that trained nothing fails."""

from __future__ import annotations

import logging
from collections import Counter

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mlxio.errors import RunError
from mlxio.rl.reward_health import MissingRewards, guard, no_update_reason, summary_line
from mlxio.run import outcome

NAN = np.nan


def test_counts_per_source_over_the_run():
    counts = MissingRewards()
    step = counts.add({"execution": np.array([1.0, 0.0, NAN, 0.0]), "ai_feedback": np.array([NAN] * 4)},
                      Counter(passed=1, failed=2, timeout=1))
    assert step == {"missing/execution": 1, "missing_share/execution": 0.25, "missing/ai_feedback": 4,
                    "missing_share/ai_feedback": 1.0, "execution_timeouts": 1}
    counts.add({"execution": np.array([1.0, 1.0, 1.0, 1.0]), "ai_feedback": np.array([0.5, 0.5, NAN, 0.5])})
    summary = counts.summary()
    assert summary["missing"]["execution"] == {"completions": 8, "missing": 1, "share": 0.125}
    assert summary["missing"]["ai_feedback"]["missing"] == 5
    assert summary["execution_checks"] == 4 and summary["execution_timeouts"] == 1
    assert summary_line(summary) == ("ai_feedback 5 of 8 (62%), execution 1 of 8 (12%), "
                                     "execution timeouts 1 of 4 checks")


@given(st.lists(st.lists(st.sampled_from([0.0, 1.0, NAN]), min_size=1, max_size=8), min_size=1, max_size=6),
       st.floats(0, 1))
def test_a_source_stops_the_run_exactly_when_its_share_is_over_the_bound(steps, bound):
    counts = MissingRewards()
    for scores in steps:
        counts.add({"execution": np.array(scores)})
    scores = np.concatenate([np.array(s) for s in steps])
    share = float(np.isnan(scores).mean())
    found = counts.problem(bound)
    assert (found is not None) == (share > bound)
    if found:
        assert found.startswith(f"the execution reward was missing for {int(np.isnan(scores).sum())} of "
                                f"{len(scores)} completions")


def test_every_check_timed_out_is_a_problem_too():
    counts = MissingRewards()
    counts.add({"execution": np.zeros(8)}, Counter(timeout=8))
    assert "8 of 8 execution checks timed out" in counts.problem(0.5)
    assert "--sandbox.timeout_s" in counts.problem(0.5)
    assert counts.problem(1.0) is None  # 1 never stops


def test_guard_stops_with_one_line_or_goes_on_saying_so(caplog):
    counts = MissingRewards()
    counts.add({"ai_feedback": np.array([NAN, NAN, 0.7, NAN])})
    with pytest.raises(RunError) as err:
        guard(counts, 0.5, False, 3, logging.getLogger("t"))
    assert str(err.value).startswith("step 3: the ai_feedback reward was missing for 3 of 4 completions (75%")
    assert "teacher was unreachable" in str(err.value) and "\n" not in str(err.value)
    with caplog.at_level(logging.WARNING):
        guard(counts, 0.5, True, 3, logging.getLogger("t"))
        guard(counts, 0.8, False, 4, logging.getLogger("t"))  # under the bound: nothing to say
    assert [r.getMessage()[:7] for r in caplog.records] == ["step 3:"]
    assert "going on as --rewards.allow_missing asks" in caplog.records[0].getMessage()


def test_no_update_reason_names_the_cause():
    assert "none of its 8 completions has a reward" in no_update_reason({"truncated": 0}, 8, 8, False, False)
    assert "all 8 completions with a reward hit max_new_tokens" in no_update_reason({"truncated": 8}, 8, 0, True, False)
    assert "every group's rewards are equal" in no_update_reason({"truncated": 1}, 8, 0, True, True)


def test_a_run_whose_every_update_trained_nothing_fails():
    state = {"skips": 0}
    with pytest.raises(RunError, match="none of the 4 updates had a completion to train on"):
        outcome.require_progress(state, 0, 4, "metrics.jsonl", empty=4)
    with pytest.raises(RunError, match="1 of 4 updates had a non-finite .* 3 had nothing to train on"):
        outcome.require_progress({"skips": 1}, 0, 4, "metrics.jsonl", empty=3)
    outcome.require_progress({"skips": 1}, 0, 4, "metrics.jsonl", empty=2)  # one update applied: a warning only
