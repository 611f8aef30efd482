# ruff: noqa: B023, E702  (a scratch script: each lambda runs within its own loop iteration)
"""Scratch script (session 13, kept for provenance of epilogue_variants.json): cuBLASLt's ReLU
epilogues against MLX GEMM + relu_cuda at t5-base b128's FFN shapes, kernel time per call.

Ran on the H100 at commit b7d11c2, whose mlxcore.cuda_ext still had `matmul_drelu` (dropped in
1b7287d: its DRELU epilogue ran as a separate ~640 us kernel after the GEMM). `err` is the max
difference to (g @ wo) * (x @ wi.T > 0) over the max of that reference: 0.20 at 32,768 rows comes
from 2 sign bits (of 100,663,296) where the pre-activation is ~3e-8 (cuBLASLt's bit is the
float32 accumulator's sign). Run as: PYTHONPATH=. OUT=<dir> python3 epilogue_variants.py
"""
import json
import os

import mlx.core as mx
import numpy as np

from benchmarks.kernel_profile import profile
from mlxcore.kernels import relu_cuda
from mlxio.gpu import cuda_ext
from mlxio.runtime import setup

setup()  # the kernel compiler of relu_cuda (MLX is already imported: no BLAS matters here)
ext = cuda_ext.load()
rng = np.random.default_rng(0)
res = {}
for m in (32768, 4096):
    x = mx.array(rng.normal(size=(m, 768)).astype(np.float32)).astype(mx.bfloat16)
    g = mx.array(rng.normal(size=(m, 768)).astype(np.float32)).astype(mx.bfloat16)
    wi = mx.array(rng.normal(size=(3072, 768)).astype(np.float32) / 28).astype(mx.bfloat16)
    wo = mx.array(rng.normal(size=(768, 3072)).astype(np.float32) / 55).astype(mx.bfloat16)
    woT = mx.contiguous(wo.T); mx.eval(woT)
    h, bits = ext.matmul_relu_aux(x, wi); mx.eval(h, bits)
    ref = (g @ wo) * (x @ wi.T > 0)
    cases = {
        "fwd_plain_gemm": lambda: x @ wi.T,
        "fwd_gemm_relu_bits": lambda: relu_cuda._relu(x @ wi.T),
        "fwd_relu_aux": lambda: ext.matmul_relu_aux(x, wi),
        "bwd_plain_gemm": lambda: g @ wo,
        "bwd_gemm_masked_grad": lambda: relu_cuda.masked_grad(g @ wo, bits),
        "bwd_drelu_N": lambda: ext.matmul_drelu(g, wo, bits),
        "bwd_drelu_T": lambda: ext.matmul_drelu(g, woT, bits, transposed=True),
    }
    for name, fn in cases.items():
        out = fn()
        if name.startswith("bwd_") and name != "bwd_plain_gemm":
            o = out if not isinstance(out, (list, tuple)) else out[0]
            err = float(mx.abs(o.astype(mx.float32) - ref.astype(mx.float32)).max() / mx.abs(ref.astype(mx.float32)).max())
        else:
            err = None
        p = profile(lambda fn=fn: [mx.eval(fn()) for _ in range(12)], 3, mx.synchronize)
        row = {"s": p["kernel_s_per_step"] / 12, "err": err, "kernels": [(t["name"][:70], round(t["us_per_call"], 1)) for t in p["top"][:3]]}
        res[f"{m}.{name}"] = row
        print(m, name, round(row["s"] * 1e6, 1), "us", err, row["kernels"], flush=True)
json.dump(res, open(os.environ["OUT"] + "/epilogue_variants.json", "w"), indent=1)
