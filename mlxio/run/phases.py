"""Wall and CPU time per phase of a run (mining, evaluation, training, export, ...).

    clock = PhaseClock()
    ...                      # mine the corpus
    clock.lap("mining")      # the time since the previous lap (or the start) is "mining"

CPU time is user + system seconds of this process (all its threads) plus its waited-for
children (pip): on a shared machine it says what a phase costs when wall time says mostly how
busy the machine was. A name given twice accumulates.
"""

from __future__ import annotations

import logging
import resource
import time

log = logging.getLogger("mlxio.phases")


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and its terminated, waited-for children."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class PhaseClock:
    """Laps of wall (`time.perf_counter`) and CPU (`cpu_seconds`) time, by phase name."""

    def __init__(self) -> None:
        self._wall, self._cpu = time.perf_counter(), cpu_seconds()
        self.phases: dict[str, dict[str, float]] = {}

    def lap(self, name: str, figures: str = "") -> dict[str, float]:
        """Close the phase that just ended as `name` (its log line ends with `figures`, what
        the phase found or made); returns its (accumulated) times."""
        wall, cpu = time.perf_counter(), cpu_seconds()
        entry = self.phases.setdefault(name, {"wall_s": 0.0, "cpu_s": 0.0})
        entry["wall_s"] = round(entry["wall_s"] + wall - self._wall, 2)
        entry["cpu_s"] = round(entry["cpu_s"] + cpu - self._cpu, 2)
        log.info("phase %s: %.1f s wall, %.1f s CPU%s", name, wall - self._wall, cpu - self._cpu,
                 f": {figures}" if figures else "")
        self._wall, self._cpu = wall, cpu
        return entry

    def as_dict(self) -> dict[str, dict[str, float]]:
        """{phase: {"wall_s", "cpu_s"}} in the order the phases first ended, plus "total"."""
        total = {"wall_s": round(sum(p["wall_s"] for p in self.phases.values()), 2),
                 "cpu_s": round(sum(p["cpu_s"] for p in self.phases.values()), 2)}
        return {**self.phases, "total": total}
