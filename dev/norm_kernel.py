"""The frozen-weight norm backward on the GPU: mlxcore.kernels.norm_cuda's kernel vs MLX's own vjp vs
PyTorch's, per call, on the retriever step's shapes (bf16 rows x D).

Per (kind, rows, D), in one process on one GPU:
- `mlx_fused_vjp`: the vjp of `mx.fast.layer_norm(x, w, b)` / `rms_norm(x, w)` for x only
  (what MLX computes without mlxcore.models.norm: x, w and b gradients together);
- `mlx_weight_free`: the weight-free norm's vjp applied to g * w (mlxcore.models.norm off CUDA);
- `ours`: `norm_cuda.norm_vjp` (one kernel);
- `torch`: `aten.native_layer_norm_backward` with output mask (x only) - layer norm only.
All four compute the same dx; each side's max |difference| from the float32 reference is
recorded and a side beyond bf16 rounding (2e-2 relative to max |dx|) is marked invalid.
Time per call = wall time of 50 back-to-back calls evaluated together / 50, best of 5.

    python -m dev.norm_kernel --machine h100
"""

from __future__ import annotations

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # first: MLX's CPU BLAS is chosen when mlx.core loads (mlxio.runtime)

import argparse
import json
import os
import time

SHAPES = ((32768, 384), (4096, 384), (32768, 768), (4096, 768))
CALLS, REPEATS, TOL = 50, 5, 2e-2


def _time(run, sync) -> float:
    best = float("inf")
    for _ in range(REPEATS + 1):  # the first is warm-up (kernel compilation)
        t = time.perf_counter()
        run()
        sync()
        best = min(best, time.perf_counter() - t)
    return best / CALLS


def measure(kind: str, rows: int, d: int, eps: float = 1e-12) -> dict:
    import mlx.core as mx
    import numpy as np

    from mlxcore.kernels import norm_cuda

    k = mx.random.split(mx.random.key(rows + d), 4)
    x = (mx.random.normal((rows, d), key=k[0]) * 2 + 0.5).astype(mx.bfloat16)
    w = mx.random.normal((d,), key=k[1]).astype(mx.bfloat16)
    b = mx.random.normal((d,), key=k[2]).astype(mx.bfloat16)
    g = mx.random.normal((rows, d), key=k[3]).astype(mx.bfloat16)
    layer = kind == "layer"
    fast = (lambda x, w: mx.fast.layer_norm(x, w, b, eps)) if layer else (lambda x, w: mx.fast.rms_norm(x, w, eps))
    free = (lambda x: mx.fast.layer_norm(x, None, None, eps)) if layer else (lambda x: mx.fast.rms_norm(x, None, eps))
    sides = {
        "mlx_fused_vjp": lambda: mx.vjp(lambda x: fast(x, w), [x], [g])[1][0],
        "mlx_weight_free": lambda: mx.vjp(free, [x], [g * w])[1][0],
        "ours": lambda: norm_cuda.norm_vjp(kind, x, w, g, eps),
    }
    xf, gf, wf = (a.astype(mx.float32) for a in (x, g, w))
    ref = np.array(mx.vjp(free, [xf], [gf * wf])[1][0])
    scale = float(np.abs(ref).max())
    out = {"kind": kind, "rows": rows, "d": d, "dtype": "bfloat16", "sides": {}}
    for name, f in sides.items():
        diff = float(np.abs(np.array(f().astype(mx.float32)) - ref).max())
        sec = _time(lambda f=f: mx.eval([f() for _ in range(CALLS)]), lambda: None)
        out["sides"][name] = {"us_per_call": sec * 1e6, "max_abs_diff": diff, "invalid": diff > TOL * scale}
    if layer:
        out["sides"]["torch"] = _torch_layer_norm(np.array(xf), np.array(wf), np.array(b.astype(mx.float32)),
                                                  np.array(gf), eps, ref, scale)
    mine = out["sides"]["ours"]["us_per_call"]
    out["speedup_vs"] = {n: s["us_per_call"] / mine for n, s in out["sides"].items() if n != "ours"}
    return out


def _torch_layer_norm(x, w, b, g, eps, ref, scale) -> dict:
    import numpy as np
    import torch

    dev = "cuda"
    xt, wt, bt, gt = (torch.tensor(a, device=dev, dtype=torch.bfloat16) for a in (x, w, b, g))
    d = xt.shape[-1]
    _, mean, rstd = torch.ops.aten.native_layer_norm(xt, (d,), wt, bt, eps)

    def one():
        return torch.ops.aten.native_layer_norm_backward(gt, xt, (d,), mean, rstd, wt, bt, [True, False, False])[0]

    diff = float(np.abs(one().float().cpu().numpy() - ref).max())
    sec = _time(lambda: [one() for _ in range(CALLS)], torch.cuda.synchronize)
    return {"us_per_call": sec * 1e6, "max_abs_diff": diff, "invalid": diff > TOL * scale}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--machine", default="h100")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    import mlx.core as mx

    from mlxcore.kernels import cuda_jit

    if not cuda_jit.available():
        ap.error("needs MLX's CUDA build on a GPU, with NVRTC")
    rows = [measure(kind, r, d) for kind in ("layer", "rms") for r, d in SHAPES]
    result = {"benchmark": "norm_kernel", "date": time.strftime("%Y-%m-%d"), "machine": args.machine,
              "mlx": mx.__version__, "calls": CALLS, "repeats": REPEATS, "tolerance": TOL, "rows": rows}
    path = args.out or f"dev/results/{args.machine}/norm_kernel.json"
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    for r in rows:
        print(r["kind"], r["rows"], r["d"], {n: round(s["us_per_call"], 1) for n, s in r["sides"].items()},
              "invalid:", [n for n, s in r["sides"].items() if s["invalid"]])
    return result


if __name__ == "__main__":
    main()
