"""Data-parallel scaling of the retriever step on 1 and N GPUs (mx.distributed, NCCL backend).

Each rank runs the recipe's compiled step (`make_train_step(contrastive_loss_fn(...),
reduce_grads=mlx.nn.average_gradients)`) on its own per-GPU batch (weak scaling: the global
batch is per-GPU batch x GPUs); gradients are averaged with an NCCL all-reduce before clipping
and AdamW, so every rank holds the same weights. Ranks are started here the way `mlx.launch
--backend nccl` starts them on one host (MLX_RANK, MLX_WORLD_SIZE, NCCL_HOST_IP, NCCL_PORT,
CUDA_VISIBLE_DEVICES per rank). Throughput = GPUs x per-GPU batch / median step time.

    python -m benchmarks.scaling --machine h200x2 --gpus 1 2 --batch 64
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def rank_main(args) -> None:
    # isort: off
    import mlxio  # noqa: F401  (first: fast BLAS for MLX's CPU build)
    # isort: on
    import mlx.core as mx
    import mlx.nn as nn

    from benchmarks import retriever_models as rm
    from mlxcore import lora
    from mlxcore.optim import OptimConfig, make_optimizer
    from mlxcore.retriever import LossConfig, contrastive_loss_fn
    from mlxcore.step import init_state, make_train_step
    from mlxcore.tree import combine, map_leaves

    world = int(os.environ.get("MLX_WORLD_SIZE", "1"))
    group = mx.distributed.init(backend="nccl", strict=True) if world > 1 else None
    rank = group.rank() if group else 0
    model, projection, _ = rm.torch_model(args.model)  # same seed on every rank: same weights
    base = rm.mlx_params(model, projection)
    adapters = lora.init(mx.random.key(0), lora.target_dims(base, rm.TARGETS[args.model]), rm.LORA_RANK)
    params = map_leaves(lambda x: x.astype(mx.bfloat16), combine(base, adapters))
    opt = make_optimizer(OptimConfig(lr=2e-4, warmup_steps=10, total_steps=1000, weight_decay=0.0))
    reduce = (lambda g: nn.average_gradients(g, group=group)) if group else None
    loss_fn = contrastive_loss_fn(rm.encoder_spec(model), LossConfig())
    data = rm.pair_batches(args.batch * world * 2)
    batches = [{k: mx.array(v[(s * world + rank) * args.batch:(s * world + rank + 1) * args.batch][None])
                for k, v in data.items()} for s in range(2)]
    compiled = True
    step = make_train_step(loss_fn, opt, reduce_grads=reduce)
    state = init_state(opt, params)
    try:
        out = step(params, state, batches[0], mx.array(0))
        mx.eval(out)
    except Exception as err:  # all_sum inside mx.compile not supported: fall back to eager
        print(f"rank {rank}: compiled step failed ({err!r}); running it uncompiled", flush=True)
        compiled = False
        step = make_train_step(loss_fn, opt, reduce_grads=reduce, jit=False)
    times = []
    for n in range(args.warmup + args.steps):
        start = time.perf_counter()
        params, state, metrics = step(params, state, batches[n % 2], mx.array(n))
        mx.eval(params, state, metrics)
        times.append(time.perf_counter() - start)
    # the weights must agree across ranks after the averaged updates
    check = mx.distributed.all_sum(metrics["loss"], group=group).item() / world if group else metrics["loss"].item()
    if rank == 0:
        print("RESULT " + json.dumps({"world": world, "compiled": compiled, "step_s": times[args.warmup:],
                                      "loss_mean_over_ranks": check, "device": str(mx.default_device())}),
              flush=True)


def launch(world: int, args) -> dict:
    procs = []
    port = str(29500 + world)
    for rank in range(world):
        env = dict(os.environ, MLX_RANK=str(rank), MLX_WORLD_SIZE=str(world), NCCL_HOST_IP="127.0.0.1",
                   NCCL_PORT=port, CUDA_VISIBLE_DEVICES=str(rank), NCCL_NVLS_ENABLE="0",
                   TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
        cmd = [sys.executable, "-m", "benchmarks.scaling", "--rank-run", "--model", args.model,
               "--batch", str(args.batch), "--steps", str(args.steps), "--warmup", str(args.warmup)]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        outs = [p.communicate(timeout=args.timeout) for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        return {"world": world, "error": f"timeout {args.timeout}s (first-call kernel JIT included)"}
    lines = [x for x in outs[0][0].splitlines() if x.startswith("RESULT ")]
    if any(p.returncode for p in procs) or not lines:
        return {"world": world, "error": "\n".join(o[1][-1500:] for o in outs)}
    res = json.loads(lines[-1][7:])
    res["notes"] = [x for o in outs for x in o[0].splitlines() if not x.startswith("RESULT ")]
    sec = statistics.median(res["step_s"])
    res.update(median_step_s=sec, per_gpu_batch=args.batch, global_batch=args.batch * world,
               samples_per_s=args.batch * world / sec)
    return res


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--machine", default="h200x2")
    ap.add_argument("--model", default="t5-base")
    ap.add_argument("--gpus", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--batch", type=int, default=64, help="per-GPU pairs")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--timeout", type=int, default=400)
    ap.add_argument("--rank-run", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.rank_run:
        rank_main(args)
        return {}
    from benchmarks.gpu_common import write

    runs = [launch(w, args) for w in args.gpus]
    for r in runs:
        print({k: v for k, v in r.items() if k not in ("step_s", "notes")}, flush=True)
    ok = {r["world"]: r for r in runs if "samples_per_s" in r}
    payload = {"settings": {"model": args.model, "dtype": "bfloat16", "per_gpu_batch": args.batch,
                            "query_len": 32, "doc_len": 256, "steps": args.steps, "warmup": args.warmup,
                            "backend": "nccl", "reduce": "mlx.nn.average_gradients"},
               "runs": runs, "target_speedup_2gpu": 1.8}
    if 1 in ok:
        payload["speedup"] = {str(w): r["samples_per_s"] / ok[1]["samples_per_s"] for w, r in ok.items()}
        payload["efficiency"] = {str(w): r["samples_per_s"] / ok[1]["samples_per_s"] / w for w, r in ok.items()}
    write("scaling", payload, args.machine)
    return payload


if __name__ == "__main__":
    main()
