"""The rollout log: every judged completion as one JSONL line, the data a verdict judge trains on
(`recipes.rlaif_judge`). The reward cache keeps only hashed keys, so this log is where a
(problem, completion, verdict) triple can be read back.

    {"step": 3, "task_id": "proc/train/lists/...", "prompt": "def f(xs):\n ...",
     "completion": "```python\n...```", "passed": true, "rewards": {"execution": 1.0, "format": 1.0}}

`passed` is the sandbox's verdict (the execution reward: true / false), null where there is
none (the judge failed, or execution reward is off). The RLAIF recipe writes `rollouts.jsonl`
in its out_dir (rank 0: its own share of a step), and so does the judge recipe for the
rollouts it samples itself. Resume-safe as metrics.jsonl is (`mlxio.run.runlog.MetricsLog`):
a resumed run drops the lines of steps after its checkpoint first.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import attrs
import numpy as np

from mlxcore.digest import hashed_int
from mlxcore.rl.tasks import Problem
from mlxio.atomic import append_text
from mlxio.errors import DataError
from mlxio.run.runlog import MetricsLog

LOG_NAME = "rollouts.jsonl"
SPLITS = ("train", "heldout", "heldout_family")  # what `split_of` returns
HELDOUT_SETS = SPLITS[1:]  # the sets it holds out: a judge's evaluation sets
FIX = "fix or delete that line of the log"


@attrs.frozen(kw_only=True)
class Judged:
    """One judged completion: its problem's task id and code prompt, the completion, and the
    sandbox's verdict."""

    task_id: str
    prompt: str
    completion: str
    passed: bool


def records(step: int, problems: Sequence[Problem], completions: Sequence[str],
            per_reward: dict[str, np.ndarray]) -> list[dict]:
    """The log lines of one step: completion i answers problems[i]; per_reward: name -> [N]
    float (NaN = missing), as `mlxio.rl.rewards.combine_rewards` returns them."""
    if len(problems) != len(completions):
        raise ValueError(f"{len(problems)} problems but {len(completions)} completions")
    out = []
    for i, (problem, text) in enumerate(zip(problems, completions, strict=True)):
        scores = {name: None if np.isnan(v[i]) else float(v[i]) for name, v in per_reward.items()}
        execution = scores.get("execution")
        out.append({"step": step, "task_id": problem.task_id, "prompt": problem.prompt, "completion": text,
                    "passed": None if execution is None else execution == 1.0, "rewards": scores})
    return out


class RolloutLog(MetricsLog):
    """`out_dir/rollouts.jsonl`, continued after step `resume_step` (None: started afresh)."""

    def __init__(self, out_dir: Path, resume_step: int | None = None) -> None:
        super().__init__(Path(out_dir) / LOG_NAME, resume_step=resume_step, what="rollout log")

    def write_step(self, step: int, problems: Sequence[Problem], completions: Sequence[str],
                   per_reward: dict[str, np.ndarray]) -> None:
        """Append one step's lines in one write."""
        lines = "".join(json.dumps(r) + "\n" for r in records(step, problems, completions, per_reward))
        append_text(self.path, lines, self.what)


def log_path(path: str | Path) -> Path:
    """A log file, or the `rollouts.jsonl` inside a run folder (DataError naming it if absent)."""
    path = Path(path).expanduser()
    found = path / LOG_NAME if path.is_dir() else path
    if not found.is_file():
        raise DataError(f"no rollout log at {found}", fix=f"pass a {LOG_NAME} file or the out_dir of an RLAIF run "
                        "(python -m recipes.rlaif_qwen writes one)")
    return found


def _field(row: dict, name: str, kind: type, where: str):
    value = row.get(name)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise DataError(f"{name!r} must be a {kind.__name__}, got {type(value).__name__}", where=where, fix=FIX)
    return value


def read_rows(path: str | Path) -> list[dict]:
    """The JSON objects of a log, in order (a torn last line of a killed writer skipped);
    DataError naming file:line on a bad line."""
    path = log_path(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    out = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as err:
            if lineno == len(lines):  # the last line of a writer killed mid-write
                continue
            raise DataError(f"not JSON ({err})", where=f"{path}:{lineno}", fix=FIX) from None
        if not isinstance(row, dict):
            raise DataError(f"expected a JSON object, got {type(row).__name__}", where=f"{path}:{lineno}", fix=FIX)
        out.append({**row, "_where": f"{path}:{lineno}"})
    return out


def read_log(path: str | Path) -> list[Judged]:
    """The judged completions of one log, in order (lines without a verdict skipped)."""
    out = []
    for row in read_rows(path):
        if row.get("passed") is None:
            continue
        where = row["_where"]
        out.append(Judged(task_id=_field(row, "task_id", str, where), prompt=_field(row, "prompt", str, where),
                          completion=_field(row, "completion", str, where),
                          passed=_field(row, "passed", bool, where)))
    return out


def unique(judged: Sequence[Judged]) -> list[Judged]:
    """One entry per (prompt, completion), the first seen (a converged policy repeats itself)."""
    seen: dict[tuple[str, str], Judged] = {}
    for j in judged:
        seen.setdefault((j.prompt, j.completion), j)
    return list(seen.values())


def split_of(task_id: str, heldout_families: Sequence[str], fraction: float,
             salt: str = "rlaif-judge-v1") -> str:
    """Which set a judged completion joins: "heldout_family" (a procedural task of a family in
    `heldout_families`), "heldout" (a procedural held-out instance, `proc/heldout/...` or
    `proc/family/...`; any other task id whose salted hash falls below `fraction`) or "train".
    A function of the task id alone, so a problem's completions never straddle sets."""
    parts = task_id.split("/")
    if len(parts) == 6 and parts[0] == "proc":
        if parts[2] in heldout_families:
            return "heldout_family"
        return "heldout" if parts[1] in ("heldout", "family") else "train"
    return "heldout" if hashed_int(salt + task_id, 8) / 2**64 < fraction else "train"
