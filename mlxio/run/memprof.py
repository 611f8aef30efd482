"""Memory profiling for training loops: MLX active / peak / cache memory and process RSS per
step, regions, leak detection as a trend, a JSON report and a PNG plot.

    prof = MemoryProfiler()
    for step in ...:
        with prof.region("step"):          # optional: peak inside a region
            ...
        prof.record(step)                  # per step: active, peak since last record, cache, RSS
    prof.write(out_dir)                    # memory.json + memory.png

Peak memory is MLX's high-water mark, reset after each record so each step gets its own; the
run's overall peak is kept separately. A leak shows as active memory that keeps rising from
step to step after warm-up: `leak_trend` fits a least-squares slope over the last `window`
steps and flags it when the slope exceeds a threshold and most step-to-step changes are rises
(a one-off jump, say a new compiled shape, is not a trend).
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import sys
import time
from pathlib import Path

import mlx.core as mx
import numpy as np

from mlxio.atomic import write_json_atomic
from mlxio.run.runlog import save_figure

log = logging.getLogger(__name__)
MB = 1024 * 1024


def rss_bytes() -> int:
    """Resident set size of this process now (Linux /proc), else its peak (getrusage)."""
    try:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024  # macOS bytes, Linux KiB


def snapshot() -> dict:
    """{"active_mb", "peak_mb", "cache_mb", "rss_mb"} now (peak: MLX's since its last reset)."""
    return {"active_mb": mx.get_active_memory() / MB, "peak_mb": mx.get_peak_memory() / MB,
            "cache_mb": mx.get_cache_memory() / MB, "rss_mb": rss_bytes() / MB}


def slope(xs, ys) -> float:
    """Least-squares slope of ys over xs (0.0 for fewer than two distinct xs)."""
    x, y = np.asarray(xs, np.float64), np.asarray(ys, np.float64)
    if x.size < 2 or np.ptp(x) == 0:
        return 0.0
    return float(np.polyfit(x, y, 1)[0])


def leak_trend(steps, active_mb, window: int = 20, threshold_mb_per_step: float = 0.5,
               rising_share: float = 0.6) -> dict:
    """Trend of active memory over the last `window` records.

    Returns {"slope_mb_per_step", "rising_share", "window", "leak"}; leak is True when the
    slope exceeds `threshold_mb_per_step` and at least `rising_share` of the step-to-step
    changes are increases - memory that keeps rising, not a single jump.
    """
    s, a = list(steps)[-window:], list(active_mb)[-window:]
    diffs = np.diff(np.asarray(a, np.float64))
    share = float(np.mean(diffs > 0)) if diffs.size else 0.0
    fitted = slope(s, a)
    leak = len(s) >= min(window, 5) and fitted > threshold_mb_per_step and share >= rising_share
    return {"slope_mb_per_step": fitted, "rising_share": share, "window": len(s), "leak": bool(leak)}


class MemoryProfiler:
    """Per-step memory records, named regions and a leak warning (see the module docstring)."""

    def __init__(self, window: int = 20, threshold_mb_per_step: float = 0.5, warmup: int = 3):
        self.window, self.threshold, self.warmup = window, threshold_mb_per_step, warmup
        self.records: list[dict] = []
        self.regions: dict[str, dict] = {}
        self.overall_peak_mb = mx.get_peak_memory() / MB
        self.leak_warned = False
        self._pending_peak = 0  # bytes: peaks that regions reset away since the last record
        self._start = time.perf_counter()
        mx.reset_peak_memory()

    def record(self, step: int, **extra) -> dict:
        """Record memory after `step`; resets MLX's peak so the next record is per step."""
        snap = {"step": int(step), "t_s": time.perf_counter() - self._start, **snapshot(), **extra}
        snap["peak_mb"] = max(snap["peak_mb"], self._pending_peak / MB)
        self._pending_peak = 0
        self.overall_peak_mb = max(self.overall_peak_mb, snap["peak_mb"])
        self.records.append(snap)
        mx.reset_peak_memory()
        trend = self.trend()
        if trend["leak"] and not self.leak_warned:
            log.warning("active memory keeps rising: %.2f MB/step over the last %d steps (%.0f%% of "
                        "steps rose) - a leak?", trend["slope_mb_per_step"], trend["window"],
                        100 * trend["rising_share"])
            self.leak_warned = True
        return snap

    @contextlib.contextmanager
    def region(self, name: str):
        """Profile a block: calls, total seconds, active before/after and the peak inside it."""
        before = mx.get_active_memory()
        self._pending_peak = max(self._pending_peak, mx.get_peak_memory())
        mx.reset_peak_memory()
        tic = time.perf_counter()
        try:
            yield
        finally:
            peak = mx.get_peak_memory()
            stats = self.regions.setdefault(name, {"calls": 0, "seconds": 0.0, "peak_mb": 0.0,
                                                   "active_delta_mb": 0.0})
            stats["calls"] += 1
            stats["seconds"] += time.perf_counter() - tic
            stats["peak_mb"] = max(stats["peak_mb"], peak / MB)
            stats["active_delta_mb"] = (mx.get_active_memory() - before) / MB
            self._pending_peak = max(self._pending_peak, peak)

    def trend(self) -> dict:
        """`leak_trend` over the records after warm-up."""
        recs = self.records[self.warmup:]
        return leak_trend([r["step"] for r in recs], [r["active_mb"] for r in recs], self.window,
                          self.threshold)

    def report(self) -> dict:
        """Summary + every record: what `write` puts in memory.json."""
        recs = self.records
        summary = {}
        if recs:
            for key in ("active_mb", "peak_mb", "cache_mb", "rss_mb"):
                values = [r[key] for r in recs]
                summary[key] = {"first": values[0], "last": values[-1], "max": max(values)}
        return {"overall_peak_mb": self.overall_peak_mb, "summary": summary, "trend": self.trend(),
                "regions": self.regions, "records": recs}

    def write(self, out_dir: str | os.PathLike, name: str = "memory", title: str = "memory") -> tuple[Path, Path | None]:
        """Write `{name}.json` and `{name}.png` under out_dir; returns their paths."""
        out = Path(out_dir)
        json_path = out / f"{name}.json"
        write_json_atomic(json_path, self.report())
        return json_path, plot(self.records, out / f"{name}.png", title)


def plot(records: list[dict], path: Path, title: str) -> Path | None:
    """Active, peak and cache MB (MLX) and RSS MB against step, one axis; None if no records."""
    if not records:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in records]
    fig, ax = plt.subplots(figsize=(7, 3.2))
    for key in ("peak_mb", "active_mb", "cache_mb", "rss_mb"):
        ax.plot(steps, [r[key] for r in records], label=key.replace("_mb", ""),
                marker="o" if len(steps) < 30 else None)
    ax.set_xlabel("step")
    ax.set_ylabel("MB")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title)
    fig.tight_layout()
    save_figure(fig, path)
    return path
