"""How fast the t5-base b128 training step could be with the vendor's kernels: its GEMMs and its
attention timed alone, MLX and PyTorch side by side, on the GPU.

The step (`benchmarks.retriever`, LoRA on frozen t5-base, 128 queries x 32 tokens + 128 documents
x 256 tokens) is, in counted FLOPs, 92% the frozen linears' GEMMs (forward, and the activation
gradients: no weight gradients) and 7% attention. This script runs exactly those GEMMs (every
shape and layout, as many per step as the step has) and the attention forward + backward at the
step's shapes, once through MLX (cuBLASLt, cuDNN) and once through PyTorch (cuBLAS; cuDNN, flash
and memory-efficient attention), checks that both sides compute the same values, and reads their
kernels' device time from CUPTI (`benchmarks.kernel_profile`). The sum of the fastest GEMMs and
the fastest attention that computes the step's masked attention is a floor for the whole step:
norms, ReLU, LoRA, MaxSim, the optimizer and the host's gaps only add to it.

    python -m dev.step_floor --machine h100   # -> dev/results/h100/step_floor.json
"""

from __future__ import annotations

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # first: MLX's CPU BLAS is chosen when mlx.core loads (mlxio.runtime)

import math

from benchmarks import retriever_models as rm
from benchmarks.gpu_common import kernel_bench_args
from dev import RESULTS

# t5-base's encoder
LAYERS, D_MODEL, HEADS, D_KV, D_FF = 12, 768, 12, 64, 3072
NEG_INF = -1e9  # mlxcore.models.t5's finite padding bias


def step_gemms(batch: int = 128, query_len: int = rm.QUERY_LEN, doc_len: int = rm.DOC_LEN) -> list[dict]:
    """The frozen linears' GEMMs of one training step, grouped by shape: dicts with name, m, k, n,
    layout ("nt": x [m, k] @ w[n, k]^T, the forward; "nn": dy [m, k] @ w [k, n], the activation
    gradient) and count (calls per step). q, k and v share one GEMM (`lora.shared_input_linears`);
    the projection head (768 -> 128) is omitted (0.1% of the FLOPs)."""
    out = []
    for side, tokens in (("doc", batch * doc_len), ("query", batch * query_len)):
        for name, d_in, d_out in (("qkv", D_MODEL, 3 * HEADS * D_KV), ("o", HEADS * D_KV, D_MODEL),
                                  ("wi", D_MODEL, D_FF), ("wo", D_FF, D_MODEL)):
            out.append({"name": f"{side}.{name}.fwd", "m": tokens, "k": d_in, "n": d_out, "layout": "nt",
                        "count": LAYERS})
            out.append({"name": f"{side}.{name}.dx", "m": tokens, "k": d_out, "n": d_in, "layout": "nn",
                        "count": LAYERS})
    return out


def gemm_flops(gemms: list[dict]) -> float:
    """2 m k n per call, summed over calls."""
    return sum(2 * g["m"] * g["k"] * g["n"] * g["count"] for g in gemms)


def attention_shapes(batch: int = 128, query_len: int = rm.QUERY_LEN, doc_len: int = rm.DOC_LEN) -> list[dict]:
    """Attention calls of one step, [rows, heads, length, d_kv] each: the documents as they are,
    the queries packed 128 / 32 to a row (`mlxcore.models.t5.pack_sequences` on CUDA)."""
    pack = 128 // query_len if 128 % query_len == 0 and batch % (128 // query_len) == 0 else 1
    return [{"name": "doc", "rows": batch, "length": doc_len, "pack": 1, "count": LAYERS},
            {"name": "query", "rows": batch // pack, "length": query_len * pack, "pack": pack, "count": LAYERS}]


def floor_seconds(gemm_s: dict[str, float], attention_s: dict[str, float]) -> float:
    """The step's floor: each GEMM group's fastest side plus each attention call's fastest
    variant that computes the step's attention (seconds per step; inputs are per step too)."""
    return sum(gemm_s.values()) + sum(attention_s.values())


# ---------------------------------------------------------------------------- the device side


def _mlx_gemm(g: dict, mx):
    a = (mx.random.normal((g["m"], g["k"])) * 0.5).astype(mx.bfloat16)
    w = (mx.random.normal((g["n"], g["k"]) if g["layout"] == "nt" else (g["k"], g["n"])) * 0.03).astype(mx.bfloat16)
    mx.eval(a, w)
    wt = w.T if g["layout"] == "nt" else w
    # one eval per GEMM: calls queued together run as parallel branches of MLX's CUDA graph, and
    # overlapping kernels' durations would add up to more than the GPU spent
    return a, w, (lambda: [mx.eval(a @ wt) for _ in range(g["count"])])


def _torch_gemm(a_np, w_np, g: dict, torch):
    a = torch.from_numpy(a_np).cuda().bfloat16()
    w = torch.from_numpy(w_np).cuda().bfloat16()
    if g["layout"] == "nt":
        return lambda: [torch.nn.functional.linear(a, w) for _ in range(g["count"])], (lambda: torch.nn.functional.linear(a, w))
    return lambda: [a @ w for _ in range(g["count"])], (lambda: a @ w)


def _bias(rows: int, length: int, pack: int, rng):
    """The step's additive attention bias [rows, H, L, L] (float32 numpy): T5-like relative
    positions per head, NEG_INF on padded keys (each sequence 25%-100% real) and, for packed
    rows, off each sequence's own diagonal block."""
    import numpy as np

    seq = length // pack
    rel = np.arange(seq)[None, :] - np.arange(seq)[:, None]
    pos = (rng.standard_normal((HEADS, 1, 1)) * np.sign(rel) * np.log1p(np.abs(rel)) / 3).astype(np.float32)
    bias = np.full((rows, HEADS, length, length), NEG_INF, np.float32)
    for r in range(rows):
        for p in range(pack):
            real = rng.integers(seq // 4, seq + 1)
            block = pos.copy()
            block[..., real:] = NEG_INF
            s = slice(p * seq, (p + 1) * seq)
            bias[r, :, s, s] = block
    return bias


def _agree(x, y) -> float:
    """max |x - y| / max |y| (float32 numpy arrays)."""
    import numpy as np

    return float(np.abs(x - y).max() / max(np.abs(y).max(), 1e-30))


def run(steps: int) -> dict:
    """Every GEMM group of `step_gemms` (MLX and PyTorch, with their agreement) and every
    attention variant of `_attention_rows`, timed by their kernels' device seconds per step."""
    import mlx.core as mx
    import numpy as np
    import torch

    res: dict = {"gemms": [], "attention": []}
    for g in step_gemms():
        a, w, mfn = _mlx_gemm(g, mx)
        tfn, tone = _torch_gemm(np.array(a.astype(mx.float32)), np.array(w.astype(mx.float32)), g, torch)
        wt = w.T if g["layout"] == "nt" else w
        row = {**g, "flops": gemm_flops([g]),
               "agreement": _agree(np.array((a @ wt).astype(mx.float32)), tone().float().cpu().numpy())}
        for side, fn, sync in (("mlx", mfn, mx.synchronize), ("torch", tfn, torch.cuda.synchronize)):
            timed = {"flops": row["flops"]}
            _time(timed, fn, sync, steps)
            row.update({f"{side}_s": timed["s"], f"{side}_tflops": timed["tflops"], f"{side}_kernels": timed["kernels"]})
        print(row["name"], {k: row[k] for k in ("mlx_s", "torch_s", "agreement")}, flush=True)
        res["gemms"].append(row)
        del a, w, mfn, tfn, tone
    rng = np.random.default_rng(0)
    for shape in attention_shapes():
        res["attention"] += _attention_rows(shape, rng, steps)
    return res


def _attention_rows(shape: dict, rng, steps: int) -> list[dict]:
    """Attention forward + backward at one of the step's shapes (`count` calls a step): MLX with
    the step's full bias, with one bias for all rows and with no mask; PyTorch's cuDNN and
    memory-efficient kernels with the full bias, its cuDNN and flash kernels with none. Rows that
    compute the step's masked attention carry computes_step; torch's its agreement with MLX's."""
    import mlx.core as mx
    import numpy as np
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    rows, length, count = shape["rows"], shape["length"], shape["count"]
    dims = (rows, HEADS, length, D_KV)
    arrays = [rng.standard_normal(dims).astype(np.float32) * s for s in (0.3, 0.3, 1.0, 1.0)]
    bias = _bias(rows, length, shape["pack"], rng)
    flops = 4 * rows * HEADS * length * length * D_KV * 3 * count  # forward + backward (2x)
    base = {"name": shape["name"], "shape": list(dims), "flops": flops}
    mq, mk, mv, mg = (mx.array(x).astype(mx.bfloat16) for x in arrays)
    tq, tk, tv, tg = (torch.from_numpy(x).cuda().bfloat16().requires_grad_(True) for x in arrays)
    tbias = torch.from_numpy(bias).cuda().bfloat16()

    def mlx_step(mask):
        fwd = lambda q, k, v: mx.fast.scaled_dot_product_attention(q, k, v, scale=1.0, mask=mask)  # noqa: E731
        outs, grads = mx.vjp(fwd, [mq, mk, mv], [mg])
        return outs + grads

    def torch_step(backend, mask):
        with sdpa_kernel(backend):
            out = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=mask, scale=1.0)
            return [out, *torch.autograd.grad(out, (tq, tk, tv), tg)]

    out, ref = [], None
    for variant, mask in (("bias_full", mx.array(bias).astype(mx.bfloat16)),
                          ("bias_heads", mx.array(bias[:1]).astype(mx.bfloat16)), ("none", None)):
        row = {**base, "framework": "mlx", "variant": variant, "computes_step": variant == "bias_full"}
        try:
            if variant == "bias_full":
                ref = [np.array(x.astype(mx.float32)) for x in mlx_step(mask)]
            _time(row, lambda mask=mask: [mx.eval(mlx_step(mask)) for _ in range(count)], mx.synchronize, steps)
        except Exception as e:  # noqa: BLE001 - a variant MLX cannot run is recorded, not fatal
            row["error"] = f"{type(e).__name__}: {e}"[:300]
        print(row["name"], variant, row.get("s"), row.get("error", ""), flush=True)
        out.append(row)
    for backend, with_bias in ((SDPBackend.CUDNN_ATTENTION, True), (SDPBackend.EFFICIENT_ATTENTION, True),
                               (SDPBackend.CUDNN_ATTENTION, False), (SDPBackend.FLASH_ATTENTION, False)):
        mask = tbias if with_bias else None
        row = {**base, "framework": "torch", "variant": backend.name.lower() + ("+bias_full" if with_bias else ""),
               "computes_step": with_bias}
        try:
            if with_bias and ref is not None:
                got = [x.detach().float().cpu().numpy() for x in torch_step(backend, mask)]
                row["agreement"] = max(_agree(g, r) for g, r in zip(got, ref, strict=True))
            _time(row, lambda b=backend, m=mask: [torch_step(b, m) for _ in range(count)],
                  torch.cuda.synchronize, steps)
        except Exception as e:  # noqa: BLE001 - a backend that rejects the inputs is recorded
            row["error"] = f"{type(e).__name__}: {e}"[:300]
        print(row["name"], row["variant"], row.get("s"), row.get("agreement"), row.get("error", ""), flush=True)
        out.append(row)
    return out


def _time(row: dict, fn, sync, steps: int) -> None:
    """Adds fn's kernel seconds per call (s), its TFLOP/s and top kernels to row."""
    from benchmarks.kernel_profile import profile

    p = profile(fn, steps, sync)
    row.update(s=p["kernel_s_per_step"], tflops=row["flops"] / p["kernel_s_per_step"] / 1e12,
               kernels=[t["name"][:70] for t in p["top"][:4]])


def summarise(res: dict, step_flops: float, peak: float) -> dict:
    """Per-side GEMM totals, the fastest masked attention per call, the floor and what it means
    for MFU (counted step FLOPs / floor / peak)."""
    gemm = {side: sum(r[f"{side}_s"] for r in res["gemms"]) for side in ("mlx", "torch")}
    best_gemm = {r["name"]: min(r["mlx_s"], r["torch_s"]) for r in res["gemms"]}
    attn: dict[str, float] = {}
    for r in res["attention"]:
        if r.get("computes_step") and "s" in r and (r.get("agreement") is None or r["agreement"] < 0.05):
            attn[r["name"]] = min(attn.get(r["name"], math.inf), r["s"])
    floor = floor_seconds(best_gemm, attn)
    return {"gemm_s": gemm, "gemm_flops": gemm_flops(res["gemms"]), "attention_best_s": attn,
            "floor_s": floor, "step_flops": step_flops, "floor_mfu": step_flops / floor / peak,
            "step_s_at_45pct": step_flops / (0.45 * peak)}


def main(argv: list[str] | None = None) -> None:
    args = kernel_bench_args(__doc__, argv)
    from benchmarks.gpu_common import gpu_name, write
    from benchmarks.retriever import PEAK_BF16

    name = gpu_name() or ""
    peak = next((v for k, v in PEAK_BF16.items() if k in name), None)
    if peak is None:
        raise SystemExit(f"step_floor: needs an H100 or H200 (found {name or 'no GPU'})")
    cfg = rm.shape_config("t5-base")
    res = run(args.steps)
    res["summary"] = summarise(res, rm.step_flops(cfg, 128), peak)
    print(res["summary"])
    write("step_floor", res, args.machine, args.out, RESULTS)


if __name__ == "__main__":
    main()
