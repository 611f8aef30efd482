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


def write_result(name: str, payload: dict, machine_name: str = "cpu", root: Path = RESULTS,
                 path: Path | None = None) -> Path:
    """Write <root>/<machine_name>/<name>.json (root: benchmarks/results, or dev/results for a
    study; $BENCH_RESULTS overrides both), or `path` alone when given, with machine and version
    info."""
    if path is None:
        path = Path(os.environ.get("BENCH_RESULTS", root)) / machine_name / f"{name}.json"
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"benchmark": name, "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "machine": machine(), "versions": versions(), **payload}
    path.write_text(json.dumps(record, indent=2) + "\n")
    return path


# Relative tolerances of the agreement check, per compute dtype: the first step's loss and
# pre-clip gradient norm (same weights, same batch), and the loss at the last checked step
# (after check_steps - 1 identical updates). float32 is measured at ~1e-6 on the CPU (tiny T5 /
# BERT, tests/benchmarks/test_bench_agreement.py); bf16 keeps 8 mantissa bits (2^-8 = 3.9e-3 per rounding).
TOLERANCE = {"float32": {"loss": 1e-4, "grad_norm": 1e-3, "loss_after": 1e-3},
             "bfloat16": {"loss": 2e-2, "grad_norm": 5e-2, "loss_after": 5e-2}}


def agreement(ref: dict, peer: dict, dtype: str) -> dict:
    """Does `peer` do the same work as `ref` (the MLX row)? Compares their pre-timing checks:
    each side's "check" is {"steps": N, "loss": [N], "grad_norm": [N]} from N identical steps
    taken from the same weights on the same batches (benchmarks/retriever.py, rlaif_step.py)."""
    tol = TOLERANCE[dtype]
    a, b = ref.get("check"), peer.get("check")
    if not a or not b or a["steps"] != b["steps"] or not a["steps"]:
        return {"ok": False, "reason": "no comparable pre-timing check on both sides", "tolerance": tol}
    rel = lambda x, y: abs(x - y) / max(abs(x), abs(y), 1e-12)  # noqa: E731
    diffs = {"loss": rel(a["loss"][0], b["loss"][0]), "grad_norm": rel(a["grad_norm"][0], b["grad_norm"][0]),
             "loss_after": rel(a["loss"][-1], b["loss"][-1])}
    bad = [k for k, v in diffs.items() if not v <= tol[k]]  # NaN fails too
    out = {"ok": not bad, "rel_diff": diffs, "tolerance": tol, "check_steps": a["steps"],
           "first": {"loss": [a["loss"][0], b["loss"][0]], "grad_norm": [a["grad_norm"][0], b["grad_norm"][0]]},
           "after": [a["loss"][-1], b["loss"][-1]]}
    if bad:
        out["reason"] = "outside tolerance: " + ", ".join(bad)
    if "last_loss" in ref and "last_loss" in peer and ref.get("total_steps") == peer.get("total_steps"):
        out["last_loss_rel_diff"] = rel(ref["last_loss"], peer["last_loss"])  # after the timed steps (info)
    return out


def load(machine: str, name: str) -> dict | None:
    path = RESULTS / machine / f"{name}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def fmt(x, digits=0) -> str:
    if x is None:
        return "-"
    return f"{x:,.{digits}f}"


def pct(x, digits=1) -> str:
    return "-" if x is None else f"{x * 100:.{digits}f}%"


def ci(pair) -> str:
    return f"[{pair[0]:.3f}, {pair[1]:.3f}]"


def times(ratio: float | None) -> str:
    """A ratio as "1.23x", or "-" when one side was not measured."""
    return "-" if ratio is None else f"{fmt(ratio, 2)}x"
