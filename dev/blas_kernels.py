"""Numeric tests under each of OpenBLAS's x86 kernel sets: numpy's OpenBLAS and the one MLX's
CPU backend is given (`mlxio.blas`) both pick their kernels by CPU, or by `OPENBLAS_CORETYPE`
when it is set, and the kernels sum a product in different orders. A tolerance that holds on one
set and not another is a test that passes on one machine and fails on the next; this runs the
tests that compare floating-point results under the CPU's default, Sandybridge, Haswell, Zen
and SkylakeX (AVX-512 kernels: a CPU without AVX-512 cannot run them, and `kernels_in_use`
records what OpenBLAS chose instead) and records, per set, the kernels each library reported
and the outcome.

    PYTHONPATH=. python -m dev.blas_kernels dev/results/cpu/blas_kernels.json [pytest args...]

The tests themselves never set the variable; this script sets it for each child pytest only.
"""

from __future__ import annotations

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # as every entry point: the children set their kernels themselves

import json
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

KERNELS = ("Sandybridge", "Haswell", "Zen", "SkylakeX")
# the tests that compare products computed in different shapes (batched and alone, chunked and
# whole, T and T - 1 rows) or against float64 references; pass others as arguments
# (all of tests/mlxcore took over 100 minutes a kernel set on the shared 2-core machine)
NUMERIC_TESTS = ["tests/mlxio/search", "tests/mlxcore/retrieval", "tests/mlxcore/rl/test_policy_purity.py",
                 "tests/mlxcore/rl/test_logprobs.py", "tests/mlxcore/train/test_core.py",
                 "tests/mlxcore/train/test_lora_linear.py", "tests/mlxcore/train/test_grad_cache.py"]
REPORT_KERNELS = """
import json, threadpoolctl
from mlxio.runtime import setup
setup()
import mlx.core as mx, numpy as np
mx.eval(mx.ones((64, 64)) @ mx.ones((64, 64))); np.ones((64, 64)) @ np.ones((64, 64))
print(json.dumps([{"library": i["filepath"], "kernels": i.get("architecture")}
                  for i in threadpoolctl.threadpool_info() if i["internal_api"] == "openblas"]))
"""


def cpu_has_avx512() -> bool:
    try:
        return "avx512f" in Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False


def kernels_in_use(env: dict[str, str]) -> list[dict]:
    """[{library, kernels}] that OpenBLAS reports under `env` (numpy's and MLX's)."""
    out = subprocess.run([sys.executable, "-c", REPORT_KERNELS], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_tests(env: dict[str, str], pytest_args: list[str]) -> dict:
    """{passed, failed, skipped, failures: [test ids], wall_s} of one pytest run under `env`."""
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "junit.xml"
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}",
                        *pytest_args], env=env, check=False)
        wall = time.perf_counter() - start
        cases = ET.parse(junit).getroot().iter("testcase")
        counts, failures = {"passed": 0, "failed": 0, "skipped": 0}, []
        for case in cases:
            kinds = {child.tag for child in case}
            if kinds & {"failure", "error"}:
                counts["failed"] += 1
                failures.append(f"{case.get('classname')}::{case.get('name')}")
            elif "skipped" in kinds:
                counts["skipped"] += 1
            else:
                counts["passed"] += 1
    return {**counts, "failures": failures, "wall_s": round(wall, 1)}


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else Path("dev/results/cpu/blas_kernels.json")
    pytest_args = argv[1:] or [*NUMERIC_TESTS, "-m", "not slow"]
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=False).stdout.strip()
    result = {"commit": commit, "cpu_avx512": cpu_has_avx512(), "pytest_args": pytest_args, "load_avg_start": os.getloadavg()[0],
              "runs": {}}
    for kernel in ("default", *KERNELS):
        env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
        if kernel != "default":
            env["OPENBLAS_CORETYPE"] = kernel
        run = {"kernels_in_use": kernels_in_use(env), **run_tests(env, pytest_args)}
        result["runs"][kernel] = run
        print(kernel, json.dumps({k: v for k, v in run.items() if k != "failures"}), run["failures"], flush=True)
    result["all_passed"] = all(run["failed"] == 0 for run in result["runs"].values())
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    return 0 if result["all_passed"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
