"""T5's ReLU feed-forward, forward + input gradient, with the ReLU in the wi GEMM's cuBLASLt
epilogue (`mlxcore.kernels.ffn_cuda`) against the path it replaces (MLX's GEMMs + `relu_cuda`'s bit-mask
ReLU; both share that backward), at the t5-base b128 step's shapes, on MLX's CUDA build with the
compiled `mlxio.gpu.cuda_ext`.

Both sides compute the same function of the same bfloat16 inputs (their agreement is recorded
before timing); the time is the kernels' device time per step (12 layers, `kernel_profile`).

    python -m dev.ffn_epilogue --machine h100   # -> dev/results/h100/ffn_epilogue.json
"""

from __future__ import annotations

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # first: MLX's CPU BLAS is chosen when mlx.core loads (mlxio.runtime)

from benchmarks.gpu_common import kernel_bench_args
from dev import RESULTS

LAYERS, D_MODEL, D_FF = 12, 768, 3072


def run(steps: int) -> list[dict]:
    import mlx.core as mx
    import numpy as np

    from benchmarks.kernel_profile import profile
    from mlxcore.kernels import ffn_cuda
    from mlxcore.models import t5
    from mlxcore.train import lora
    from mlxio.gpu import cuda_ext

    if cuda_ext.load() is None:
        raise SystemExit("ffn_epilogue: build mlxio.gpu.cuda_ext first (python -m mlxio.gpu.cuda_ext)")
    rng = np.random.default_rng(0)
    wi = mx.array((rng.normal(size=(D_FF, D_MODEL)) / np.sqrt(D_MODEL)).astype(np.float32)).astype(mx.bfloat16)
    wo = mx.array((rng.normal(size=(D_MODEL, D_FF)) / np.sqrt(D_FF)).astype(np.float32)).astype(mx.bfloat16)

    def composed(x, residual):
        return lora.linear({"weight": wo}, t5.relu(lora.linear({"weight": wi}, x)), residual=residual)

    def fused(x, residual):
        return ffn_cuda.relu_ffn(x, wi, wo, residual)

    rows = []
    for name, tokens in (("doc", 128 * 256), ("query", 128 * 32)):
        x, residual, g = (mx.array(rng.normal(size=(tokens, D_MODEL)).astype(np.float32)).astype(mx.bfloat16)
                          for _ in range(3))

        def step(fn, x=x, residual=residual, g=g):
            out, grads = mx.vjp(fn, [x, residual], [g])
            return out + grads

        outs = {side: step(fn) for side, fn in (("fused", fused), ("composed", composed))}
        agreement = max(float(np.abs(np.array((a - b).astype(mx.float32))).max()
                              / max(np.abs(np.array(b.astype(mx.float32))).max(), 1e-6))
                        for a, b in zip(outs["fused"], outs["composed"], strict=True))
        row = {"name": name, "tokens": tokens, "agreement": agreement}
        for side, fn in (("fused", fused), ("composed", composed)):
            p = profile(lambda fn=fn: [mx.eval(step(fn)) for _ in range(LAYERS)], steps, mx.synchronize)
            row[f"{side}_s"] = p["kernel_s_per_step"]
            row[f"{side}_wall_s"] = p["wall_s_per_step"]
            row[f"{side}_kernels"] = [(t["name"][:60], round(t["us_per_call"], 1)) for t in p["top"][:6]]
        row["speedup"] = row["composed_s"] / row["fused_s"]
        print({k: row[k] for k in ("name", "agreement", "fused_s", "composed_s", "speedup")}, flush=True)
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> None:
    args = kernel_bench_args(__doc__, argv)
    from benchmarks.gpu_common import write

    write("ffn_epilogue", {"rows": run(args.steps)}, args.machine, args.out, RESULTS)


if __name__ == "__main__":
    main()
