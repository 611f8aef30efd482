"""MLX CPU speed with and without the OpenBLAS fix, in one run.

Each variant runs in a fresh subprocess (the BLAS must be chosen before `mlx.core` loads):
`MLXIO_BLAS=off` keeps MLX's bundled reference BLAS, the default loads the system OpenBLAS.
Measures a 1024^3 float32 matmul (GFLOP/s) and a small transformer encoder's
forward + backward (tokens/s). Writes benchmarks/results/cpu/cpu_blas.json.

    python -m benchmarks.cpu_blas [--repeats 5]
"""

from __future__ import annotations

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # first: MLX's CPU BLAS is chosen when mlx.core loads (mlxio.runtime)

import argparse
import json
import os
import subprocess
import sys

from benchmarks.common import load, median, write_result

CHILD = r"""
import json, sys, time
from mlxio import blas
from mlxio.runtime import setup
setup()
import mlx.core as mx, mlx.nn as nn
from benchmarks.common import time_repeats
repeats = int(sys.argv[1])
n = 1024
a, b = mx.random.normal((n, n)), mx.random.normal((n, n))
mx.eval(a, b)
mm = time_repeats(lambda: mx.eval(a @ b), repeats)
# small encoder: 4 layers, d=256, 4 heads, ffn 1024; batch 8 x 128 tokens
model = nn.TransformerEncoder(num_layers=4, dims=256, num_heads=4, mlp_dims=1024)
x = mx.random.normal((8, 128, 256))
loss_and_grad = nn.value_and_grad(model, lambda m, x: mx.mean(m(x, None) ** 2))
enc = time_repeats(lambda: mx.eval(loss_and_grad(model, x)), repeats)
print(json.dumps({"blas": blas.status, "matmul_s": mm, "encoder_s": enc}))
"""


def run_variant(blas: str, repeats: int) -> dict:
    env = {**os.environ, "MLXIO_BLAS": blas}
    out = subprocess.run([sys.executable, "-c", CHILD, str(repeats)], capture_output=True, text=True,
                         env=env, check=True)
    raw = json.loads(out.stdout.strip().splitlines()[-1])
    flops = 2 * 1024**3
    return {
        "blas": raw["blas"],
        "matmul_gflops": [flops / t / 1e9 for t in raw["matmul_s"]],
        "matmul_gflops_median": flops / median(raw["matmul_s"]) / 1e9,
        "encoder_tokens_per_s": [8 * 128 / t for t in raw["encoder_s"]],
        "encoder_tokens_per_s_median": 8 * 128 / median(raw["encoder_s"]),
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    reference = run_variant("off", args.repeats)
    fixed = run_variant("auto", args.repeats)
    result = {
        "settings": {"matmul": "1024x1024x1024 float32",
                     "encoder": "nn.TransformerEncoder 4 layers d=256 heads=4 mlp=1024, batch 8x128, fwd+bwd",
                     "repeats": args.repeats},
        "reference_blas": reference,
        "with_fix": fixed,
        "matmul_speedup": fixed["matmul_gflops_median"] / reference["matmul_gflops_median"],
        "encoder_speedup": fixed["encoder_tokens_per_s_median"] / reference["encoder_tokens_per_s_median"],
    }
    path = write_result("cpu_blas", result)
    print(f"matmul: {reference['matmul_gflops_median']:.1f} -> {fixed['matmul_gflops_median']:.1f} GFLOP/s "
          f"({result['matmul_speedup']:.1f}x); encoder fwd+bwd: {reference['encoder_tokens_per_s_median']:.0f} -> "
          f"{fixed['encoder_tokens_per_s_median']:.0f} tokens/s ({result['encoder_speedup']:.1f}x); wrote {path}")
    return result


def results_section() -> list[str]:
    b = load("cpu", "cpu_blas")
    if not b:
        return []
    ref, fix = b["reference_blas"], b["with_fix"]
    return [f"### Linux CPU: MLX with its bundled reference BLAS vs the system OpenBLAS (cpu, "
            f"{b['machine']['cpu_count']} cores; benchmarks/cpu_blas.py)", "",
            "| | reference BLAS | OpenBLAS | speed-up |", "|---|---|---|---|",
            f"| {b['settings']['matmul']} matmul, GFLOP/s | {ref['matmul_gflops_median']:.1f} "
            f"| {fix['matmul_gflops_median']:.1f} | {b['matmul_speedup']:.1f}x |",
            f"| encoder fwd+bwd ({b['settings']['encoder']}), tokens/s | {ref['encoder_tokens_per_s_median']:,.0f} "
            f"| {fix['encoder_tokens_per_s_median']:,.0f} | {b['encoder_speedup']:.1f}x |", ""]


if __name__ == "__main__":
    main()
