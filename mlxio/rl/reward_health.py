"""Rewards that never arrive, counted per source: a run must not train on what is left when the
sandbox or the teacher stops answering, nor on nothing at all.

`MissingRewards` counts, over a run, each reward source's completions and how many of them had
no reward (NaN in `combine_rewards`' `per_reward`: a sandbox that broke, a teacher unreachable
or past its deadline, a review without a score), and the execution checks that timed out (a
verdict, 0, but when most checks time out the sandbox's limit is the likelier cause than the
candidates). `problem` says when a source's share so far is over `max_share`; the recipe then
stops with that one line, or, with `allow_missing`, goes on and says it at every step.
`no_update_reason` names why a step trained nothing.
"""

from __future__ import annotations

from collections import Counter

import attrs
import numpy as np

from mlxio.errors import RunError
from mlxio.run import distributed


@attrs.define
class MissingRewards:
    """Counts over a run: completions scored and missing per reward source (name), execution
    checks run and timed out."""

    completions: Counter = attrs.field(factory=Counter)
    missing: Counter = attrs.field(factory=Counter)
    checks: int = 0  # fresh execution verdicts (cached scores hold no status)
    timeouts: int = 0

    def add(self, per_reward: dict[str, np.ndarray], check_statuses: Counter | None = None,
            world: distributed.World = distributed.SINGLE) -> dict:
        """Count one step: `per_reward` name -> [n] scores of this rank (NaN = missing), the
        statuses of this rank's fresh execution checks; returns the step's metrics
        (`missing/<source>`, `missing_share/<source>` over the run so far, execution timeouts)."""
        record = {}
        for name, scores in per_reward.items():
            every = distributed.gather_np(np.asarray(scores, np.float32), world)
            lost = int(np.isnan(every).sum())
            self.completions[name] += len(every)
            self.missing[name] += lost
            record[f"missing/{name}"] = lost
            record[f"missing_share/{name}"] = self.missing[name] / max(self.completions[name], 1)
        statuses = check_statuses or Counter()
        counts = distributed.gather_np(np.array([[sum(statuses.values()), statuses["timeout"]]], np.int64),
                                       world).sum(0)
        self.checks += int(counts[0])
        self.timeouts += int(counts[1])
        if counts[0]:
            record["execution_timeouts"] = int(counts[1])
        return record

    def problem(self, max_share: float) -> str | None:
        """What is wrong when a source has been missing for more than `max_share` of its
        completions so far, or execution checks timed out that often; None when nothing is."""
        for name in sorted(self.completions):
            share = self.missing[name] / max(self.completions[name], 1)
            if share > max_share:
                return (f"the {name} reward was missing for {self.missing[name]} of {self.completions[name]} "
                        f"completions ({share:.0%}, over --rewards.max_missing_share {max_share:g}): "
                        + _CAUSES.get(name, "its scorer gave no score"))
        if self.checks and self.timeouts / self.checks > max_share:
            return (f"{self.timeouts} of {self.checks} execution checks timed out ({self.timeouts / self.checks:.0%}, "
                    f"over --rewards.max_missing_share {max_share:g}): the sandbox's limit "
                    "(--sandbox.timeout_s) is likely too short for this machine")
        return None

    def summary(self) -> dict:
        """The run's counts, for its results (eval.json): per source completions, missing and
        their share; execution checks and timeouts."""
        return {"missing": {name: {"completions": self.completions[name], "missing": self.missing[name],
                                   "share": self.missing[name] / max(self.completions[name], 1)}
                            for name in sorted(self.completions)},
                "execution_checks": self.checks, "execution_timeouts": self.timeouts}


_CAUSES = {
    "execution": "the sandbox gave no verdict (its log lines say why: e.g. --sandbox.timeout_s too short to start "
                 "a check on this machine, or tests that misbehave)",
    "ai_feedback": "the teacher was unreachable, too slow for --teacher.timeout_s, or wrote no score line",
}


def no_update_reason(row_stats: dict, completions: int, missing: int, mask_truncated: bool,
                     skip_equal_groups: bool) -> str:
    """Why a step's update had no row to train on, from `mlxio.rl.grpo.update_rows`' counts
    and the step's `completions` / `missing` (rewards absent)."""
    if missing >= completions:
        return f"none of its {completions} completions has a reward"
    if mask_truncated and row_stats.get("truncated", 0) >= completions - missing:
        return (f"all {row_stats['truncated']} completions with a reward hit max_new_tokens unfinished "
                "(--grpo.mask_truncated leaves them out)")
    if skip_equal_groups:
        return "every group's rewards are equal (--grpo.skip_equal_groups leaves them out)"
    return "no completion has a token to score"


def guard(counts: MissingRewards, max_share: float, allow_missing: bool, step: int, log) -> None:
    """After step `step`'s rewards: RunError (one line) when `counts.problem(max_share)` finds
    a source missing too often, or, with `allow_missing`, a warning line on `log` (every
    step it holds)."""
    found = counts.problem(max_share)
    if found is None:
        return
    if allow_missing:
        log.warning("step %d: %s; going on as --rewards.allow_missing asks", step, found)
        return
    raise RunError(f"step {step}: {found}", where="rewards",
                   fix="fix the sandbox or the teacher (the log says why each reward was missing), or pass "
                       "--rewards.allow_missing true to train on the rewards left")


def summary_line(summary: dict) -> str:
    """`MissingRewards.summary()` as one line for the log."""
    parts = [f"{name} {c['missing']} of {c['completions']} ({c['share']:.0%})" for name, c in summary["missing"].items()]
    if summary["execution_checks"]:
        parts.append(f"execution timeouts {summary['execution_timeouts']} of {summary['execution_checks']} checks")
    return ", ".join(parts) or "no rewards scored"
