"""The one judge of code: does a completion pass its problem's tests? Rewards (the execution
reward) and the held-out evaluation (pass@1) both ask it, so a completion that fools one
fools neither.

It runs the extracted program against the tests in the two-process sandbox
(`mlxio.sandbox.run_check`: the candidate in one process, the trusted tests in another that
reads only plain values back). When the tests' own code misbehaves after the candidate
answered (hangs with no call pending, floods its output, raises something that is neither an
assertion nor the candidate's exception), the sandbox cannot tell a broken test from one
tripped by a wrong answer (a `None` where a number belongs). The judge then runs the problem's
reference solution once (cached per problem and limits): if it passes, the tests are sound
and the candidate's verdict stands as a failure; if it does not (or the problem has no
reference), the verdict is "infra": a missing reward, never the candidate's 0.

`SandboxConfig` (the recipes' `sandbox.*`) holds the limits and parallelism of its checks.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import attrs

from mlxcore.fields import bounded
from mlxcore.tasks import Problem
from mlxio.rl.problems import extract_code, parses
from mlxio.sandbox import SandboxLimits, Verdict, run_check


@attrs.frozen(kw_only=True)
class SandboxConfig:
    """Limits and parallelism of the sandboxed checks (the recipes' `sandbox.*`)."""

    timeout_s: float = bounded(5.0, gt=0, le=3600)
    memory_mb: int = bounded(512, ge=32, le=1 << 20)
    workers: int = bounded(2, ge=1, le=256)
    disk_mb: int = bounded(64, ge=1, le=1 << 20)  # total writable space of one check (its tmpfs)
    # without bubblewrap (or macOS sandbox-exec) untrusted code would run without file isolation:
    # refused unless this is true
    allow_weak: bool = False


def _prelude(problem: Problem) -> str:
    """The problem's prompt, run in the judge's process for its trusted helpers (HumanEval's
    `poly`), when it is Python."""
    return problem.prompt if parses(problem.prompt) else ""


def _problem_key(problem: Problem) -> tuple[str, str, str, str]:
    return problem.prompt, problem.test, problem.entry_point, problem.canonical_solution


@attrs.define(eq=False)
class CodeJudge:
    """Verdicts of completions on their problems under `limits`, `workers` sandboxes at a
    time (threads: each sandbox is two processes)."""

    limits: SandboxLimits = SandboxLimits()
    workers: int = 2
    _sound: dict = attrs.field(factory=dict, init=False, repr=False)
    _lock: threading.Lock = attrs.field(factory=threading.Lock, init=False, repr=False)

    def run(self, problem: Problem, code: str) -> Verdict:
        """The verdict of the program `code` (already extracted) on `problem`."""
        verdict = run_check(code, problem.test, problem.entry_point, self.limits,
                            prelude=_prelude(problem))
        if verdict.judge_fault and self.tests_sound(problem):
            return attrs.evolve(verdict, status=verdict.fault_status or "failed", judge_fault=False,
                                detail=f"{verdict.detail} (the reference solution passes these tests)")
        return verdict

    def verdict(self, problem: Problem, completion: str) -> Verdict:
        """The verdict of a raw model completion (its code extracted as for the rewards)."""
        return self.run(problem, extract_code(completion, problem))

    def verdicts(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[Verdict]:
        """One verdict per (problem, completion), in order."""
        if len(problems) != len(completions):
            raise ValueError(f"{len(problems)} problems but {len(completions)} completions")
        if self.workers <= 1 or len(problems) <= 1:
            return [self.verdict(p, c) for p, c in zip(problems, completions, strict=True)]
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(self.workers) as pool:
            return list(pool.map(self.verdict, problems, completions))

    def passed(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[bool | None]:
        """True / False per completion; None where the judge itself failed (missing)."""
        return [None if v.status == "infra" else v.passed for v in self.verdicts(problems, completions)]

    def tests_sound(self, problem: Problem) -> bool:
        """Whether the problem's reference solution passes its tests under these limits (so
        the tests' own misbehaviour was the candidate's doing); False without a reference."""
        if not problem.canonical_solution.strip():
            return False
        key = _problem_key(problem)
        with self._lock:
            if key in self._sound:
                return self._sound[key]
        code = extract_code(problem.canonical_solution, problem)
        verdict = run_check(code, problem.test, problem.entry_point, self.limits,
                            prelude=_prelude(problem))
        sound = verdict.status == "passed"
        if verdict.status != "infra" or verdict.judge_fault:  # not a sandbox that failed to start
            with self._lock:
                self._sound[key] = sound
        return sound
