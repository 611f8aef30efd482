"""Shared benchmark plumbing: machine/version info, timing with repeats, JSON results."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def versions(*packages: str) -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in ("mlx", "mlx-lm", "torch", "transformers", "numpy", *packages):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def machine() -> dict:
    info = {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count()}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    from mlxio import blas
    info["mlx_blas"] = blas.status
    return info


def time_repeats(fn: Callable[[], object], repeats: int, warmup: int = 1) -> list[float]:
    """Wall seconds of `fn()` per repeat after `warmup` calls; fn must block until done."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def median(values: list[float]) -> float:
    return statistics.median(values)


def write_result(name: str, payload: dict, machine_name: str = "cpu") -> Path:
    """Write benchmarks/results/<machine_name>/<name>.json with machine and version info."""
    out_dir = Path(os.environ.get("BENCH_RESULTS", RESULTS)) / machine_name
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    record = {"benchmark": name, "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "machine": machine(), "versions": versions(), **payload}
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path
