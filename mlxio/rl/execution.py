"""The one judge of code: does a completion pass its problem's tests? Rewards (the execution
reward) and the held-out evaluation (pass@1) both ask it, so a completion that fools one
fools neither.

It runs the extracted program against the tests in the two-process sandbox
(`mlxio.sandbox.runner.run_check`: the candidate in one process, the trusted tests in another that
reads only plain values back). When the tests' own code misbehaves after the candidate
answered (hangs with no call pending, floods its output, raises something that is neither an
assertion nor the candidate's exception), the sandbox cannot tell a broken test from one
tripped by a wrong answer (a `None` where a number belongs). The judge settles it by whether
the problem's tests can judge at all (`tests_can_judge`, cached per problem and limits): with
a reference solution, when it passes them; without one (the own-problems format), when they
treat trivially wrong candidates as wrong (`PROBES`: one returning None, one raising, one
returning a constant string): none of them passes, the raising one fails by its own exception
(the tests call the candidate before anything of their own breaks), and the tests' own error
differs between two wrong answers (it depends on the answer). Then the candidate's verdict
stands as a failure (reward 0, a fail in pass@k); otherwise the verdict is "infra": a missing
reward, never the candidate's 0. Tests that break only after a right answer passed every
assert cannot be told from a wrong answer without a reference: give such problems one.

`check_problem` runs the probes and the reference (when given) on a problem's tests up front:
the RLAIF recipe leaves out, with one line each, the problems of a `--data.problems` file
whose tests cannot judge.

`SandboxConfig` (the recipes' `sandbox.*`) holds the limits and parallelism of its checks.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from functools import partial

import attrs

from mlxcore.fields import bounded
from mlxcore.rl.tasks import Problem
from mlxio.rl.problems import extract_code, parses
from mlxio.rl.reference_time import ReferenceLimits
from mlxio.sandbox.pipes import Verdict
from mlxio.sandbox.runner import SandboxLimits, run_check

log = logging.getLogger(__name__)


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
    # check each completion as soon as its row ends, while the rest of the batch decodes
    # (mlxio.rl.reward_overlap; the same rewards as checking them all afterwards)
    overlap: bool = True
    # a problem with a reference solution gets N x the reference's run time as its rewards' time
    # limit (at least min_timeout_s, at most timeout_s; mlxio.rl.reference_time); 0: timeout_s
    reference_timeout: float = bounded(0.0, ge=0, le=1000)
    # the floor of a per-problem time limit (with reference_timeout), in seconds
    min_timeout_s: float = bounded(1.0, gt=0, le=3600)

    def limits(self) -> SandboxLimits:
        """The limits of one check under these settings."""
        return SandboxLimits(timeout_s=self.timeout_s, memory_mb=self.memory_mb, disk_mb=self.disk_mb)


def _prelude(problem: Problem) -> str:
    """The problem's prompt, run in the judge's process for its trusted helpers (HumanEval's
    `poly`), when it is Python."""
    return problem.prompt if parses(problem.prompt) else ""


def _problem_key(problem: Problem) -> tuple[str, str, str, str]:
    return problem.prompt, problem.test, problem.entry_point, problem.canonical_solution


CHECKS_VERSION = "tests-check-v1"  # of `check_problem`'s rule: stored results of another version are not read
# Trivially wrong candidates (`{name}`: the entry point), in the order they are tried: tests
# that can judge fail every one.
PROBES = {
    "raises": "def {name}(*args, **kwargs):\n    raise RuntimeError('a candidate that always raises')\n",
    "returns None": "def {name}(*args, **kwargs):\n    return None\n",
    "returns a constant string": "def {name}(*args, **kwargs):\n    return 'mlxio: a constant answer'\n",
}


@attrs.frozen(kw_only=True)
class Judgeability:
    """Whether a problem's tests can judge a candidate: `sound` True / False, or None when
    the sandbox itself failed (undecided: not cached); `why` says what was seen."""

    sound: bool | None
    why: str = ""


def _probe_verdict(name: str, v: Verdict) -> Judgeability | None:
    """What one probe's verdict decides on its own (None: nothing yet)."""
    if v.status == "passed":
        return Judgeability(sound=False, why=f"its tests pass a candidate that {name}")
    if v.problem_fault:
        return Judgeability(sound=False, why=f"its prompt or tests do not load: {v.detail}")
    if v.status == "infra" and not v.judge_fault:
        return Judgeability(sound=None, why=f"the sandbox failed: {v.detail}")
    if name == "raises" and v.judge_fault:
        return Judgeability(sound=False, why=f"its tests break in their own code (a candidate that raises is not "
                                           f"failed by its exception): {v.detail}")
    if name == "raises" and v.status != "failed":  # a timeout or load error of a one-line candidate: the box
        return Judgeability(sound=None, why=f"a candidate that raises got {v.status!r}: {v.detail}")
    return None


def probe_tests(check: Callable[[str], Verdict]) -> Judgeability:
    """Whether tests can judge, from `check(probe name) -> Verdict` of the `PROBES` in turn
    (stopping at the first that decides): none passes, the raising one fails by its own
    exception, and the tests' own error (if any) differs between the two wrong answers."""
    seen = {}
    for name in PROBES:
        seen[name] = check(name)
        decided = _probe_verdict(name, seen[name])
        if decided is not None:
            return decided
    none, constant = seen["returns None"], seen["returns a constant string"]
    if none.judge_fault and constant.judge_fault and none.detail == constant.detail:
        return Judgeability(sound=False, why=f"its tests fail in their own code whatever the candidate answers: "
                                           f"{none.detail}")
    return Judgeability(sound=True, why="its tests fail trivially wrong candidates")


@attrs.define(eq=False)
class CodeJudge:
    """Verdicts of completions on their problems under `limits`, `workers` sandboxes at a
    time (threads: each sandbox is two processes)."""

    limits: SandboxLimits = SandboxLimits()
    workers: int = 2
    # a time limit per problem from its reference's run time (mlxio.rl.reference_time); None: `limits`
    per_problem: ReferenceLimits | None = None
    _sound: dict = attrs.field(factory=dict, init=False, repr=False)
    _lock: threading.Lock = attrs.field(factory=threading.Lock, init=False, repr=False)
    _statuses: Counter = attrs.field(factory=Counter, init=False, repr=False)

    def run(self, problem: Problem, code: str) -> Verdict:
        """The verdict of the program `code` (already extracted) on `problem`."""
        limits = (self.per_problem.limits_for(problem, self.limits, self._reference_run)
                  if self.per_problem is not None else self.limits)
        verdict = self._check(problem, code, limits)
        if verdict.judge_fault:
            check = self.tests_can_judge(problem)
            if check.sound:
                verdict = attrs.evolve(verdict, status=verdict.fault_status or "failed", judge_fault=False,
                                       detail=f"{verdict.detail} ({check.why})")
        with self._lock:
            self._statuses[verdict.status] += 1
        if verdict.status == "infra":
            log.warning("sandbox: no verdict on problem %r (%s); marked missing", problem.task_id,
                        " ".join(verdict.detail.split())[:300])
        return verdict

    def take_statuses(self) -> Counter:
        """How many verdicts of each status `run` gave since the last call (then reset)."""
        with self._lock:
            taken, self._statuses = self._statuses, Counter()
        return taken

    def _check(self, problem: Problem, code: str, limits: SandboxLimits | None = None) -> Verdict:
        return run_check(code, problem.test, problem.entry_point, limits or self.limits, prelude=_prelude(problem))

    def _reference_run(self, problem: Problem, limits: SandboxLimits) -> Verdict:
        return self._check(problem, extract_code(problem.canonical_solution, problem), limits)

    def verdict(self, problem: Problem, completion: str) -> Verdict:
        """The verdict of a raw model completion (its code extracted as for the rewards)."""
        return self.run(problem, extract_code(completion, problem))

    def verdicts(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[Verdict]:
        """One verdict per (problem, completion), in order."""
        if len(problems) != len(completions):
            raise ValueError(f"{len(problems)} problems but {len(completions)} completions")
        return self._map(self.verdict, problems, completions)

    def _map(self, fn, *args: Sequence, desc: str = "") -> list:
        """[fn(*a) for a in zip(*args)], `workers` at a time; with `desc`, a progress display."""
        from concurrent.futures import ThreadPoolExecutor

        from mlxio.run.reporting import progress

        def shown(results):
            return progress(results, total=len(args[0]), desc=desc, unit="problem") if desc else results

        if self.workers <= 1 or len(args[0]) <= 1:
            return list(shown(fn(*a) for a in zip(*args, strict=True)))
        with ThreadPoolExecutor(self.workers) as pool:
            return list(shown(pool.map(fn, *args)))

    def passed(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[bool | None]:
        """True / False per completion; None where the judge itself failed (missing)."""
        return [None if v.status == "infra" else v.passed for v in self.verdicts(problems, completions)]

    def tests_can_judge(self, problem: Problem) -> Judgeability:
        """Whether the problem's tests tell a wrong answer (so their own misbehaviour was the
        candidate's doing): its reference solution passes them, or, without one, they fail the
        trivially wrong candidates of `PROBES` (see the module doc). Cached per problem."""
        key = _problem_key(problem)
        with self._lock:
            if key in self._sound:
                return self._sound[key]
        if problem.canonical_solution.strip():
            found = self._reference_check(problem)
        else:
            found = probe_tests(partial(self._probe, problem))
        if found.sound is not None:
            with self._lock:
                self._sound[key] = found
        return found

    def check_problem(self, problem: Problem) -> Judgeability:
        """Whether `problem` can be judged, checked up front: its tests fail the trivially
        wrong candidates of `PROBES`, and its reference solution (when given) passes them."""
        probed = probe_tests(partial(self._probe, problem))
        if probed.sound is not True or not problem.canonical_solution.strip():
            return probed
        return self._reference_check(problem)

    def check_problems(self, problems: Sequence[Problem], known=None) -> list[Judgeability]:
        """`check_problem` of each problem, `workers` at a time. `known`: a persistent store
        (`mlxio.rl.rewards.RewardCache`'s get / put / flush) of the problems found sound under
        these limits before, which are not run again (a problem file is checked once, not at
        every run); only sound ones are stored, so a refusal always says why."""
        keys = [self._check_key(p) for p in problems]
        todo = [i for i, k in enumerate(keys) if known is None or known.get(k) != 1.0]
        found = dict(zip(todo, self._map(self.check_problem, [problems[i] for i in todo], desc="checking tests"),
                         strict=True))
        if known is not None:
            for i, check in found.items():
                if check.sound:
                    known.put(keys[i], 1.0)
            known.flush()
        return [found.get(i, Judgeability(sound=True, why="found sound before")) for i in range(len(problems))]

    def _check_key(self, problem: Problem) -> str:
        """What a stored `check_problem` result stands for: the probes, the limits, the problem."""
        data = json.dumps([CHECKS_VERSION, PROBES, attrs.asdict(self.limits), *_problem_key(problem)])
        return hashlib.sha256(data.encode()).hexdigest()

    def _probe(self, problem: Problem, name: str) -> Verdict:
        return self._check(problem, PROBES[name].format(name=problem.entry_point))

    def _reference_check(self, problem: Problem) -> Judgeability:
        verdict = self._check(problem, extract_code(problem.canonical_solution, problem))
        if verdict.status == "passed":
            return Judgeability(sound=True, why="the reference solution passes these tests")
        if verdict.status == "infra" and not (verdict.judge_fault or verdict.problem_fault):
            return Judgeability(sound=None, why=f"the sandbox failed: {verdict.detail}")
        return Judgeability(sound=False, why=f"its reference solution does not pass its tests "
                                           f"({verdict.status}: {verdict.detail})")
