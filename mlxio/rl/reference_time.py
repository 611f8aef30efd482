"""A time limit per problem from its own reference solution's run time, so a completion that
loops forever holds a sandbox (and the step that waits for its reward) for about what the
problem needs instead of the sandbox's whole limit.

A problem with a reference solution that passes its tests gets `factor` x the reference's
sandboxed run time (process start included), rounded up to a whole `GRAIN_S`, at least
`floor_s`, at most the sandbox's own limit; any other problem keeps the sandbox's limit. The
reference runs once per problem (under the full limits); the limit found is kept in `store`
(the run's reward cache: get / put / flush), so a resumed run, or another run sharing the
cache, judges with the same limit instead of one measured again under another load.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
from collections.abc import Callable

import attrs

from mlxcore.rl.tasks import Problem
from mlxio.sandbox.pipes import Verdict
from mlxio.sandbox.runner import SandboxLimits

GRAIN_S = 0.5
VERSION = "reference-limit-v1"


def limit_from(duration_s: float, factor: float, floor_s: float, cap_s: float) -> float:
    """`factor` x `duration_s` rounded up to a multiple of GRAIN_S, within [floor_s, cap_s]."""
    return min(cap_s, max(floor_s, math.ceil(factor * duration_s / GRAIN_S) * GRAIN_S))


@attrs.define(eq=False)
class ReferenceLimits:
    """Per-problem limits (see the module doc): `limits_for(problem, base, run_reference)`,
    `run_reference(problem, limits) -> Verdict` running the reference under `limits`."""

    factor: float
    floor_s: float
    store: object | None = None  # mlxio.rl.rewards.RewardCache (get / put / flush), or None
    _found: dict = attrs.field(factory=dict, init=False, repr=False)
    _lock: threading.Lock = attrs.field(factory=threading.Lock, init=False, repr=False)

    def key(self, problem: Problem, base: SandboxLimits) -> str:
        data = json.dumps([VERSION, self.factor, self.floor_s, attrs.asdict(base), problem.prompt, problem.test,
                           problem.entry_point, problem.canonical_solution])
        return hashlib.sha256(data.encode()).hexdigest()

    def limits_for(self, problem: Problem, base: SandboxLimits,
                   run_reference: Callable[[Problem, SandboxLimits], Verdict]) -> SandboxLimits:
        if not problem.canonical_solution.strip():
            return base
        key = self.key(problem, base)
        with self._lock:  # one measurement per problem, even with many checks of it at once
            if key not in self._found:
                stored = self.store.get(key) if self.store is not None else None
                if stored is None:
                    verdict = run_reference(problem, base)
                    if verdict.status == "infra":  # the sandbox broke: no limit learnt, try again later
                        return base
                    stored = (limit_from(verdict.duration_s, self.factor, self.floor_s, base.timeout_s)
                              if verdict.status == "passed" else base.timeout_s)
                    if self.store is not None:
                        self.store.put(key, stored)
                        self.store.flush()
                self._found[key] = stored
            timeout = self._found[key]
        return attrs.evolve(base, timeout_s=timeout)
