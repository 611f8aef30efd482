"""Rewards that run while the rollout still decodes: a completion's sandbox check (or judge
call) starts as soon as its row ends, on a thread pool, so the step waits only for the checks
of the last rows to end instead of every check.

`Prefetch(fns, problem_of_row, cache, workers)` is handed to the rollout as its `on_row_end(row,
text)` callback; `prefetch.fns` are the same rewards, each scoring from the finished checks
where there is one (the same `score` of the same (problem, completion): the same value) and
computing the rest as before, so `combine_rewards(prefetch.fns, ...)` gives what
`combine_rewards(fns, ...)` gives, cache counts included. Only rewards whose score of a
completion depends on that completion alone are started early (`PER_COMPLETION`); a check
whose value the cache already holds is not started.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import attrs

from mlxcore.rl.tasks import Problem
from mlxio.rl.rewards import AIFeedbackReward, ExecutionReward, RewardCache, RewardFn, _problem_text

PER_COMPLETION = (ExecutionReward, AIFeedbackReward)  # score(pairs)[i] depends on pair i alone


@attrs.frozen
class _Prefetched:
    """`fn` scoring from `futures` ({cache key: Future of [score]}) where they hold a completion."""

    fn: RewardFn
    futures: dict = attrs.field(eq=False, repr=False)

    @property
    def name(self) -> str:
        return self.fn.name

    def config_key(self) -> str:
        return self.fn.config_key()

    def score(self, problems: Sequence[Problem], completions: Sequence[str]) -> list[float | None]:
        ck = self.fn.config_key()
        keys = [RewardCache.key(self.fn.name, ck, _problem_text(p), c) for p, c in zip(problems, completions, strict=True)]
        started = {i: self.futures.get(k) for i, k in enumerate(keys)}
        rest = [i for i, f in started.items() if f is None]
        computed = dict(zip(rest, self.fn.score([problems[i] for i in rest], [completions[i] for i in rest]) if rest
                            else [], strict=True))
        return [computed[i] if f is None else f.result()[0] for i, f in started.items()]


class Prefetch:
    """Starts the per-completion rewards of `fns` ([(reward, weight)]) for each row that ends
    (`on_row_end(row, text)`: row `row` answers `problem_of_row(row)`), `workers` at a time;
    `fns` the same [(reward, weight)] that use them. `close()` waits for every check.
    `enabled` False: nothing starts early (`fns` score as the originals)."""

    def __init__(self, fns: Sequence[tuple[RewardFn, float]], problem_of_row: Callable[[int], Problem],
                 cache: RewardCache | None, workers: int, enabled: bool = True) -> None:
        self._early = [fn for fn, _ in fns if isinstance(fn, PER_COMPLETION)] if enabled else []
        self._futures: dict[str, Future] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max(1, workers)) if self._early else None
        self._problem_of_row, self._cache = problem_of_row, cache
        self.fns = [(_Prefetched(fn, self._futures) if fn in self._early else fn, w) for fn, w in fns]

    def on_row_end(self, row: int, text: str) -> None:
        problem = self._problem_of_row(row)
        for fn in self._early:
            key = RewardCache.key(fn.name, fn.config_key(), _problem_text(problem), text)
            with self._lock:
                if key in self._futures or (self._cache is not None and self._cache.holds(key)):
                    continue
                self._futures[key] = self._pool.submit(fn.score, [problem], [text])

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    def __enter__(self) -> Prefetch:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
