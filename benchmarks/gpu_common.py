"""Helpers shared by the MLX-vs-PyTorch benchmarks: GPU name, load average, JSON output."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path


def gpu_name() -> str | None:
    """The first GPU's name from nvidia-smi, or None without one."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.splitlines()[0] if out else None


def gpu_count() -> int:
    name = gpu_name()
    if name is None:
        return 0
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout
    return len(out.strip().splitlines())


def write(name: str, payload: dict, machine: str, out: str | None = None, root: Path | None = None) -> Path:
    """benchmarks/results/<machine>/<name>.json (or <root>/<machine>/..., or
    $BENCH_RESULTS/<machine>/...), or `out` alone (the committed results stay as they are), with
    machine and version info (benchmarks.common) plus the load average and GPU."""
    from benchmarks.common import RESULTS, write_result

    payload = {"load_avg": os.getloadavg(), "gpu": gpu_name(), **payload}
    path = write_result(name, payload, machine, root or RESULTS, path=Path(out) if out else None)
    print(path)
    return path


def kernel_bench_args(doc: str, argv: list[str] | None = None, steps: int = 3):
    """--machine, --steps (profiled repeats) and --out of a kernel-time benchmark, parsed."""
    import argparse

    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--machine", default="h100")
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--out", default=None)
    return ap.parse_args(argv)


def dump(obj) -> str:
    return json.dumps(obj, indent=2)
