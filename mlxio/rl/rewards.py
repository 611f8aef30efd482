"""Rewards for RLAIF on code: reward functions, their options (`RewardConfig`, `TeacherConfig`:
the recipe's `rewards.*` and `teacher.*`; `from_config`) and a persistent cache (the problems
and the code extraction they score live in `mlxio.rl.problems`).

A reward function has `name`, `config_key()` (a stable string of the settings that change its
scores; part of every cache key) and `score(problems, completions) -> list[float | None]`,
where None means *missing* (the sandbox or the judge broke): missing is never scored as 0;
`combine_rewards` renormalises the weights over the rewards that are present.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from time import time_ns
from typing import ClassVar, Protocol

import attrs
import numpy as np

from mlxcore.fields import bounded
from mlxcore.rl.tasks import Problem
from mlxio.atomic import open_new, replace_file, run_dir
from mlxio.errors import ConfigError, DataError
from mlxio.inputs import MAX_DATA_BYTES, read_regular
from mlxio.rl.execution import CodeJudge, SandboxConfig
from mlxio.rl.problems import defines, fenced_blocks, parses
from mlxio.rl.reference_time import ReferenceLimits
from mlxio.sandbox.pipes import Verdict
from mlxio.sandbox.runner import SandboxLimits

# ---------------------------------------------------------------- reward functions

class RewardFn(Protocol):
    name: str

    def config_key(self) -> str: ...

    def score(self, problems: Sequence[Problem], completions: Sequence[str]
              ) -> list[float | None]: ...


def _check_lengths(problems: Sequence, completions: Sequence) -> None:
    if len(problems) != len(completions):
        raise ValueError(f"{len(problems)} problems but {len(completions)} completions")


def _per_completion(problems: Sequence, completions: Sequence, one: Callable, workers: int | None = None) -> list:
    """`one(problem, completion)` of each pair, in order: in this thread, or `workers` threads at
    a time when given (sandbox runs and judge calls wait on other processes)."""
    _check_lengths(problems, completions)
    if workers is None:
        return [one(p, c) for p, c in zip(problems, completions, strict=True)]
    with ThreadPoolExecutor(max(1, workers)) as pool:
        return list(pool.map(one, problems, completions))


@attrs.frozen
class _OfEachCompletion:
    """A reward computed from each (problem, completion) alone by `one`, a pure function; its
    cache key is `KEY` (a new version whenever `one` changes)."""

    KEY: ClassVar[str] = ""

    def config_key(self) -> str:
        return self.KEY

    def score(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[float | None]:
        return _per_completion(problems, completions, self.one)


@attrs.frozen
class ExecutionReward:
    """1.0 when the extracted code passes the problem's tests in the sandbox, 0.0 when it
    fails / times out / errors, None when the judge itself failed (`mlxio.rl.execution`: the
    sandbox broke, or the problem's own tests misbehaved and its reference does not pass)."""

    limits: SandboxLimits = SandboxLimits()
    workers: int = 2
    name: str = "execution"
    # (reference_timeout, min_timeout_s) of `SandboxConfig`: a limit per problem; (0, _): `limits`
    per_problem: tuple[float, float] = (0.0, 1.0)
    judge: CodeJudge = attrs.field(eq=False, repr=False, default=attrs.Factory(
        lambda s: CodeJudge(s.limits, s.workers, ReferenceLimits(*s.per_problem) if s.per_problem[0] else None),
        takes_self=True))

    def config_key(self) -> str:
        # v2: the judge tells its own failures (missing) from the candidate's (0.0)
        key = "exec-v2:" + json.dumps(attrs.asdict(self.limits), sort_keys=True)
        return key + (f"|reference x{self.per_problem[0]:g} >= {self.per_problem[1]:g}s" if self.per_problem[0] else "")

    def verdicts(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[Verdict]:
        """One sandbox Verdict per completion, `workers` sandboxes at a time."""
        return self.judge.verdicts(problems, completions)

    def score(self, problems: Sequence[Problem], completions: Sequence[str]
              ) -> list[float | None]:
        return [None if v.status == "infra" else float(v.passed)
                for v in self.verdicts(problems, completions)]


@attrs.frozen
class FormatReward(_OfEachCompletion):
    """Rewards answering in a fenced python block that defines the requested function.

    1.0: a fenced python (or untagged) block parses and defines `entry_point` at top level.
    0.5: a fenced block that defines it but does not parse, or that parses without defining
         it; or no fence but the raw completion defines it and parses.
    0.0: anything else.
    """

    KEY: ClassVar[str] = "format-v1"
    name: str = "format"

    @staticmethod
    def one(problem: Problem, completion: str) -> float:
        entry_point = problem.entry_point
        blocks = [b for tag, b in fenced_blocks(completion)
                  if tag in ("", "python", "py", "python3")]
        if any(parses(b) and defines(b, entry_point) for b in blocks):
            return 1.0
        if any(parses(b) or defines(b, entry_point) for b in blocks):
            return 0.5
        if not blocks and parses(completion) and defines(completion, entry_point):
            return 0.5
        return 0.0


@attrs.frozen
class PrintableReward(_OfEachCompletion):
    """Share of a completion's characters that are printable ASCII or whitespace (the
    alphabet of source code); 0.0 for an empty completion. A shaping reward for a model that
    emits arbitrary bytes (the smoke preset's tiny random byte-level llama, whose completions
    never define a function): it varies across a group's samples, so the update has a signal
    and the exported adapters differ from the base. A trained code model scores ~1.0."""

    KEY: ClassVar[str] = "printable-v1"
    name: str = "printable"

    @staticmethod
    def one(_problem: Problem, completion: str) -> float:
        return (sum(ch.isascii() and (ch.isprintable() or ch in "\t\n\r") for ch in completion) / len(completion)
                if completion else 0.0)


@attrs.frozen
class AIFeedbackReward:
    """A judge's rubric score (0-10) mapped to [0, 1]; None when the judge call failed.

    `judge` has `judge(prompt, completion) -> float | None` and `config_key() -> str`
    (`mlxio.rl.teacher.HttpJudge`, `mlxio.rl.local_teacher.LocalJudge`)."""

    judge: object
    workers: int = 4
    name: str = "ai_feedback"

    def config_key(self) -> str:
        return "aif-v3:" + self.judge.config_key()  # v3: the written score grammar (mlxio.rl.review_score)

    def score(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[float | None]:
        def one(problem: Problem, completion: str) -> float | None:
            s = self.judge.judge(problem.prompt, completion)
            return None if s is None else min(max(float(s), 0.0), 10.0) / 10.0

        return _per_completion(problems, completions, one, self.workers)


# ---------------------------------------------------------------- cache and combination

class RewardCache:
    """Persistent reward cache: key -> float, in a directory of append-only JSONL segments.

    Each `flush()` writes the new entries as one segment (temp file, fsync, rename, fsync of
    the directory), so a crash leaves either the whole segment or none of it, and processes
    sharing a directory never write the same file. Opening reads every segment; more than
    `max_segments` are compacted into one. Missing rewards (None) are never stored: they are
    retried next time. `hits` / `misses` count `get` calls.
    """

    def __init__(self, path: str | os.PathLike, max_segments: int = 64) -> None:
        self.path = run_dir(path, "reward cache folder")
        self.hits = self.misses = 0
        self._data: dict[str, float] = {}
        self._pending: dict[str, float] = {}
        self._lock = threading.Lock()
        segments = sorted(self.path.glob("seg-*.jsonl"))
        for seg in segments:
            self._read_segment(seg)
        if len(segments) > max_segments:
            self._write_segment(dict(self._data))
            for seg in segments:
                seg.unlink(missing_ok=True)

    @staticmethod
    def key(reward_name: str, config_key: str, prompt: str, completion: str) -> str:
        """sha256 over the four strings, unambiguously joined (JSON list)."""
        data = json.dumps([reward_name, config_key, prompt, completion], ensure_ascii=False)
        return hashlib.sha256(data.encode()).hexdigest()

    def get(self, key: str) -> float | None:
        with self._lock:
            value = self._pending.get(key, self._data.get(key))
            if value is None:
                self.misses += 1
            else:
                self.hits += 1
            return value

    def holds(self, key: str) -> bool:
        """Whether `key` has a value (not counted as a hit or a miss)."""
        with self._lock:
            return key in self._pending or key in self._data

    def put(self, key: str, value: float) -> None:
        if not np.isfinite(value):
            raise ValueError(f"reward cache values must be finite, got {value!r}")
        with self._lock:
            self._pending[key] = float(value)

    def flush(self) -> None:
        """Make every `put` so far durable (one new segment)."""
        with self._lock:
            pending, self._pending = self._pending, {}
            if pending:
                self._write_segment(pending)
                self._data.update(pending)

    def __len__(self) -> int:
        with self._lock:
            return len(self._data.keys() | self._pending.keys())

    def _read_segment(self, seg: Path) -> None:
        if not os.path.lexists(seg):  # compacted away by another process meanwhile
            return
        raw = read_regular(seg, what="reward cache segment", max_bytes=MAX_DATA_BYTES,  # a FIFO never blocks here
                           fix="delete the file to drop it")
        lines = raw.decode("utf-8", "replace").splitlines()
        for lineno, line in enumerate(lines, 1):
            try:
                key, value = json.loads(line)
                self._data[str(key)] = float(value)
            except (ValueError, TypeError) as err:
                raise DataError(f"{seg}:{lineno}: corrupt reward cache entry ({err}); "
                                "delete the file to drop it") from None

    def _write_segment(self, entries: dict[str, float]) -> None:
        name = f"seg-{time_ns():020d}-{os.getpid()}-{os.urandom(4).hex()}.jsonl"
        tmp = self.path / f".tmp-{name}"
        with os.fdopen(open_new(tmp, "reward cache"), "w", encoding="utf-8") as f:
            f.writelines(json.dumps([k, v]) + "\n" for k, v in entries.items())
            f.flush()
            os.fsync(f.fileno())
        replace_file(tmp, self.path / name, "reward cache")
        dir_fd = os.open(self.path, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def _problem_text(p: Problem) -> str:
    """What identifies a problem in cache keys: prompt, tests and entry point (not task_id)."""
    return f"{p.prompt}\n\0{p.test}\n\0{p.entry_point}"


@attrs.frozen(kw_only=True)
class RewardResult:
    """Combined rewards for N completions.

    total:      [N] float32, weighted mean over the rewards present for each completion
                (weights renormalised over those); NaN where `missing`.
    per_reward: name -> [N] float32, NaN where that reward is missing.
    missing:    [N] bool, True where no reward is present (leave these out of the update).
    """

    total: np.ndarray
    per_reward: dict[str, np.ndarray]
    missing: np.ndarray
    cache_hits: int = 0
    cache_misses: int = 0


def combine_rewards(rewards: Sequence[tuple[RewardFn, float]], problems: Sequence[Problem],
                    completions: Sequence[str], cache: RewardCache | None = None
                    ) -> RewardResult:
    """Score every completion with every reward (cache first; identical (problem, completion)
    pairs scored once) and combine them by weight. Weights must be finite and > 0."""
    _check_lengths(problems, completions)
    names = [fn.name for fn, _ in rewards]
    if len(set(names)) != len(names):
        raise ConfigError(f"reward names must be unique, got {names}")
    weights = np.array([w for _, w in rewards], np.float64)
    if not rewards or not np.all(np.isfinite(weights)) or np.any(weights <= 0):
        raise ConfigError(f"reward weights must be finite and > 0, got {weights.tolist()}")
    n = len(completions)
    texts = [_problem_text(p) for p in problems]
    per_reward, hits, misses = {}, 0, 0
    for fn, _ in rewards:
        ck = fn.config_key()
        keys = [RewardCache.key(fn.name, ck, texts[i], completions[i]) for i in range(n)]
        known: dict[str, float | None] = {}
        for k in dict.fromkeys(keys):
            if cache is not None and (v := cache.get(k)) is not None:
                known[k], hits = v, hits + 1
            elif cache is not None:
                misses += 1
        todo = {k: i for i, k in enumerate(keys) if k not in known}  # first index per key
        if todo:
            idx = list(todo.values())
            scores = fn.score([problems[i] for i in idx], [completions[i] for i in idx])
            if len(scores) != len(idx):
                raise ValueError(f"reward {fn.name!r} returned {len(scores)} scores "
                                 f"for {len(idx)} completions")
            for k, s in zip(todo, scores, strict=True):
                ok = s is not None and np.isfinite(s)
                known[k] = float(s) if ok else None
                if ok and cache is not None:
                    cache.put(k, float(s))
        per_reward[fn.name] = np.array([np.nan if known[k] is None else known[k] for k in keys],
                                       np.float32)
    if cache is not None:
        cache.flush()
    values = np.stack([per_reward[name] for name in names])  # [R, N]
    present = ~np.isnan(values)
    wsum = (weights[:, None] * present).sum(0)  # [N]
    weighted = np.where(present, values * weights[:, None], 0.0).sum(0)
    missing = wsum == 0
    total = np.where(missing, np.nan, weighted / np.where(missing, 1.0, wsum)).astype(np.float32)
    return RewardResult(total=total, per_reward=per_reward, missing=missing,
                        cache_hits=hits, cache_misses=misses)


@attrs.frozen(kw_only=True)
class RewardConfig:
    """The rewards' weights and cache (the RLAIF recipe's `rewards.*`; `from_config`)."""

    execution: float = bounded(1.0, ge=0, le=1000)  # passes the tests in the sandbox
    format: float = bounded(0.2, ge=0, le=1000)  # answers in a python block defining the function
    printable: float = bounded(0.0, ge=0, le=1000)  # share of printable-ASCII characters (a shaping reward; smoke)
    ai_feedback: float | None = bounded(None, ge=0, le=1000)  # None: 0.5 when a teacher is configured, else off
    cache: bool = True  # persistent cache in out_dir/reward_cache
    # a run stops (one line) once a reward source has been missing for more than this share of
    # its completions so far (the sandbox broken, the teacher unreachable), or execution checks
    # timed out that often (mlxio.rl.reward_health); 1 never stops
    max_missing_share: float = bounded(0.5, ge=0, le=1)
    allow_missing: bool = False  # go on past max_missing_share anyway, saying so at every step


@attrs.frozen(kw_only=True)
class TeacherConfig:
    """The AI-feedback teacher (the RLAIF recipe's `teacher.*`; `from_config`)."""

    url: str | None = bounded(None, nonempty=True)  # OpenAI-compatible endpoint, e.g. http://localhost:8080/v1
    model: str = bounded("default", nonempty=True)  # mlx_lm.server: "default_model" (the --model it serves)
    local: str | None = bounded(None, nonempty=True)  # or an mlx-lm model dir / GGUF judged locally
    # or a verdict judge run in the training process, every completion of a step in a few batched
    # passes (mlxio.rl.verdict_reward): recipes.rlaif_judge's adapters/ folder, or "untrained"
    judge: str | None = bounded(None, nonempty=True)
    # one deadline per judge call: connect, headers, body, retries and back-off (HTTP), or the
    # wait for the model plus generation (local); a call past it is a missing reward
    timeout_s: float = bounded(30.0, gt=0, le=3600)
    retries: int = bounded(4, ge=0, le=100)  # HTTP: retries of 429 / 5xx / connection errors within the deadline
    # "text": the teacher writes a review ending `Score: N/10`; "verdict": 10 * P(yes) from the
    # log-probs of a one-token Yes/No answer (a small teacher, e.g. SmolLM2 on mlx_lm.server)
    scoring: str = "text"


def from_config(rewards: RewardConfig, teacher: TeacherConfig, sandbox: SandboxConfig,
                dequantize: bool = True, verdict_judge: RewardFn | None = None) -> list[tuple[RewardFn, float]]:
    """[(reward, weight)] of the reward options (zero weights left out; a judge only if
    `teacher` configures one; `dequantize`: a local teacher's base, as the policy's;
    `verdict_judge`: the reward that `teacher.judge` names, built by the caller, e.g.
    `mlxio.rl.verdict_reward.VerdictJudgeReward`)."""
    limits = SandboxLimits(timeout_s=sandbox.timeout_s, memory_mb=sandbox.memory_mb, disk_mb=sandbox.disk_mb)
    fns = [(ExecutionReward(limits, sandbox.workers, per_problem=(sandbox.reference_timeout, sandbox.min_timeout_s)),
            rewards.execution),
           (FormatReward(), rewards.format), (PrintableReward(), rewards.printable)]
    if sum(x is not None for x in (teacher.url, teacher.local, teacher.judge)) > 1:
        raise ConfigError("teacher: set one of --teacher.url, --teacher.local and --teacher.judge")
    judge = None
    if teacher.judge:
        if verdict_judge is None:
            raise ConfigError("teacher.judge: this program builds no in-process judge", fix="use --teacher.url")
        weight = 0.5 if rewards.ai_feedback is None else rewards.ai_feedback
        return [(fn, w) for fn, w in [*fns, (verdict_judge, weight)] if w > 0]
    if teacher.url:
        from mlxio.rl.teacher import HttpJudge
        judge = HttpJudge(teacher.url, teacher.model, timeout_s=teacher.timeout_s,
                          max_retries=teacher.retries, scoring=teacher.scoring)
    elif teacher.local:
        from mlxio.rl.local_teacher import LocalJudge
        judge = LocalJudge(teacher.local, timeout_s=teacher.timeout_s,
                           scoring=teacher.scoring, dequantize=dequantize)
    weight = rewards.ai_feedback
    weight = (0.5 if judge else 0.0) if weight is None else weight
    if weight > 0:
        if judge is None:
            raise ConfigError("rewards.ai_feedback > 0 needs --teacher.url, --teacher.local or --teacher.judge")
        fns.append((AIFeedbackReward(judge), weight))
    return [(fn, w) for fn, w in fns if w > 0]
