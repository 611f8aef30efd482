"""Data-parallel scaling of the retriever step, MLX beside PyTorch DDP, on 1, 2, 4 ... devices.

Both sides run the recipe's step (LoRA r=16 on the attention projections, MaxSim InfoNCE +
margin loss, gradients averaged over ranks, clip 1.0, AdamW) on a fixed per-rank batch (weak
scaling: the global batch is per-rank batch x ranks), with the recipe's global in-batch
negatives: each rank's queries are scored against every rank's documents. MLX gathers them
with `mlxio.run.distributed.document_gather` (as `recipes.xtr_lora` does), PyTorch with the
differentiable `torch.distributed.nn.functional.all_gather`, inside DistributedDataParallel.
So both compute the same global loss from the same weights on the same batches; the
agreement check compares their first steps' loss (mean over ranks) and gradient norm before
any timing, as `benchmarks/retriever.py` does, and a side that disagrees is left out of the
ratios. Ranks start the way users start them: `mlx.launch` (NCCL on GPUs, ring on a CPU) and
`torch.distributed.run` (NCCL, gloo).

    python -m benchmarks.scaling --machine h100x4 --gpus 1 2 4 --model t5-base --batch 64
    python -m benchmarks.scaling --machine cpu --gpus 1 2 --model t5-tiny --batch 8 --cpu
"""

from __future__ import annotations

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # first: MLX's CPU BLAS is chosen when mlx.core loads (mlxio.runtime)

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import fmt, load

CHECK_STEPS = 2


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _global_batches(args, world: int) -> list[dict]:
    """Two distinct global batches ([batch x world] pairs each, NumPy)."""
    from benchmarks import retriever_models as rm

    vocab = rm.shape_config(args.model).vocab_size
    data = rm.synthetic_pairs(2 * args.batch * world, vocab, rm.QUERY_LEN, rm.DOC_LEN, seed=0)
    n = args.batch * world
    return [{k: v[i * n:(i + 1) * n] for k, v in data.items()} for i in range(2)]


def _report(rank: int, times: list[float], check: dict, args, extra: dict) -> None:
    if rank == 0:
        print("RESULT " + json.dumps({"step_s": times[args.warmup:], "check": check, **extra}), flush=True)


# ------------------------------------------------------------------------------------ MLX rank

def mlx_rank(args) -> None:
    import mlx.core as mx

    from benchmarks import retriever_models as rm
    from mlxcore.retrieval.objective import LossConfig, contrastive_loss_fn
    from mlxcore.train import lora
    from mlxcore.train.optim import make_optimizer
    from mlxcore.train.step import init_state, make_train_step
    from mlxcore.train.tree import combine, map_leaves
    from mlxio.run import distributed

    world = distributed.init()
    model, projection, _ = rm.torch_model(args.model)  # same seed on every rank: same weights
    base = rm.mlx_params(model, projection)
    adapters = lora.init(mx.random.key(0), lora.target_dims(base, rm.TARGETS[args.model]), rm.LORA_RANK)
    dtype = getattr(mx, args.dtype)
    params = map_leaves(lambda x: x.astype(dtype), combine(base, adapters))
    opt = make_optimizer(rm.optim_config())
    loss_fn = contrastive_loss_fn(rm.encoder_spec(model), LossConfig(), distributed.document_gather(world))
    step = make_train_step(loss_fn, opt, reduce_grads=distributed.grad_reducer(world))
    share = slice(world.rank * args.batch, (world.rank + 1) * args.batch)
    batches = [{k: mx.array(v[share][None]) for k, v in b.items()} for b in _global_batches(args, world.size)]
    state = init_state(opt, params)
    check = {"steps": CHECK_STEPS, "loss": [], "grad_norm": []}
    times = []
    for n in range(CHECK_STEPS + args.warmup + args.steps):
        start = time.perf_counter()
        params, state, metrics = step(params, state, batches[n % 2], mx.array(n))
        mx.eval(params, state, metrics)
        times.append(time.perf_counter() - start)
        if n < CHECK_STEPS:
            loss = metrics["loss"]
            if world.size > 1:
                loss = mx.distributed.all_sum(loss, group=world.group) / world.size
            check["loss"].append(loss.item())
            check["grad_norm"].append(metrics["grad_norm"].item())
    _report(world.rank, times[CHECK_STEPS:], check, args,
            {"world": world.size, "device": str(mx.default_device()),
             "peak_bytes": mx.get_peak_memory()})


# ---------------------------------------------------------------------------------- torch rank

def _gather_rows(x, rank: int, world: int):
    """Every rank's rows of `x` (concatenated in rank order) with the backward the recipe's
    `gather_rows` has: each rank gets the sum over ranks of the gradient of its own rows (an
    all-reduce, then its slice). `torch.distributed.nn.functional.all_gather` should do the
    same, but with gloo (its all-to-all path) the gradient norm came out 2.3% off a one-rank
    run of the same global batch (torch 2.13, 2 ranks), so the benchmark does not rely on it."""
    import torch
    import torch.distributed as dist

    class Gather(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            parts = [torch.empty_like(t) for _ in range(world)]
            dist.all_gather(parts, t.contiguous())
            return torch.cat(parts, 0)

        @staticmethod
        def backward(ctx, grad):
            grad = grad.contiguous().clone()
            dist.all_reduce(grad)
            n = grad.shape[0] // world
            return grad[rank * n:(rank + 1) * n]

    return Gather.apply(x)


def torch_global_loss(model, projection, batch, rank: int, world: int, temperature=0.07,
                      margin=0.2, margin_weight=0.1):
    """`retriever_models.torch_loss` with every rank's documents as negatives: this rank's
    [n] queries against the [n * world] gathered documents (gradients flow back to their
    ranks), positives at rank * n + i."""
    import torch

    from benchmarks import retriever_models as rm

    q = rm.torch_embed(model, projection, batch["query_ids"], batch["query_mask"])
    d = rm.torch_embed(model, projection, batch["doc_ids"], batch["doc_mask"])
    d_mask = batch["doc_mask"]
    if world > 1:
        d = _gather_rows(d, rank, world)
        parts = [torch.empty_like(d_mask) for _ in range(world)]
        torch.distributed.all_gather(parts, d_mask)
        d_mask = torch.cat(parts, 0)
    n = q.shape[0]
    sims = torch.einsum("qtd,bsd->qbts", q, d)
    sims = sims.masked_fill(~d_mask.bool()[None, :, None, :], -1e9)
    qm = batch["query_mask"].bool()[:, None, :]
    best = sims.max(-1).values.masked_fill(~qm, 0.0)
    scores = best.sum(-1) / qm.sum(-1).clamp(min=1).to(best.dtype)
    pos = rank * n + torch.arange(n, device=scores.device)
    logits = scores / temperature
    positive = logits.gather(1, pos[:, None])[:, 0]
    nce = (torch.logsumexp(logits, -1) - positive).mean()
    is_pos = torch.zeros_like(scores, dtype=torch.bool).scatter_(1, pos[:, None], True)
    hardest = scores.masked_fill(is_pos, -1e9).max(-1).values
    hinge = torch.clamp(margin - scores.gather(1, pos[:, None])[:, 0] + hardest, min=0.0).mean()
    return nce + margin_weight * hinge


def torch_rank(args) -> None:
    import mlx.core as mx
    import numpy as np
    import torch
    import torch.distributed as dist

    from benchmarks import retriever_models as rm
    from mlxcore.train import lora
    from mlxcore.train.tree import flatten

    gpu = not args.cpu
    dist.init_process_group("nccl" if gpu else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}" if gpu else "cpu")
    if gpu:
        torch.cuda.set_device(dev)
    mx.set_default_device(mx.cpu)  # MLX only draws the LoRA init (the same as the MLX side's)
    dtype = getattr(torch, args.dtype)
    model, projection, _ = rm.torch_model(args.model)
    adapters = lora.init(mx.random.key(0), lora.target_dims(rm.mlx_params(model, projection),
                                                             rm.TARGETS[args.model]), rm.LORA_RANK)
    model, _how = rm.add_lora(args.model, model, {k: np.array(v) for k, v in flatten(adapters).items()})
    model.to(dev, dtype)
    if projection is not None:
        projection.to(dev, dtype).requires_grad_(False)

    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model, self.projection = model, projection

        def forward(self, batch):
            return torch_global_loss(self.model, self.projection, batch, rank, world)

    ddp = torch.nn.parallel.DistributedDataParallel(Step(), device_ids=[dev.index] if gpu else None)
    run = torch.compile(ddp) if args.torch_compile else ddp
    trainable = [p for p in ddp.parameters() if p.requires_grad]
    cfg = rm.optim_config()
    total = CHECK_STEPS + args.warmup + args.steps
    groups = rm.torch_adamw_groups(cfg, total)
    opt = torch.optim.AdamW(trainable, lr=groups[0][0], betas=(cfg.beta1, cfg.beta2), eps=groups[0][1],
                            weight_decay=cfg.weight_decay, fused=gpu)
    share = slice(rank * args.batch, (rank + 1) * args.batch)
    batches = [{k: torch.from_numpy(v[share]).long().to(dev) for k, v in b.items()}
               for b in _global_batches(args, world)]
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    check = {"steps": CHECK_STEPS, "loss": [], "grad_norm": []}
    times = []
    if gpu:
        torch.cuda.reset_peak_memory_stats()
    for n in range(total):
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = run(batches[n % 2])
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(trainable, cfg.clip_norm)
        opt.param_groups[0]["lr"], opt.param_groups[0]["eps"] = groups[n]
        opt.step()
        sync()
        times.append(time.perf_counter() - start)
        if n < CHECK_STEPS:
            mean = loss.detach().float().clone()
            dist.all_reduce(mean)
            check["loss"].append(float(mean) / world)
            check["grad_norm"].append(float(norm))
    _report(rank, times[CHECK_STEPS:], check, args,
            {"world": world, "device": torch.cuda.get_device_name() if gpu else "cpu",
             "peak_bytes": torch.cuda.max_memory_allocated() if gpu else None,
             "compiled": bool(args.torch_compile)})
    dist.barrier()  # no rank tears gloo down while another still has a collective in flight
    dist.destroy_process_group()
    # Leave without running C++ static destructors: gloo's worker threads could still be
    # joinable there, and std::terminate aborted ~1 exit in 10 on 2 CPU cores, after the
    # RESULT line (torch 2.x, gloo). Everything this rank reports is already flushed.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# ------------------------------------------------------------------------------------- driver

def _rank_args(args) -> list[str]:
    return ["--model", args.model, "--batch", str(args.batch), "--steps", str(args.steps),
            "--warmup", str(args.warmup), "--dtype", args.dtype] + (["--cpu"] if args.cpu else [])


def launch(framework: str, world: int, args) -> dict:
    """Start `world` ranks of `framework` ("mlx", "torch", "torch_compile"); rank 0's result."""
    py = [sys.executable, "-m", "benchmarks.scaling"]
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", PYTHONUNBUFFERED="1",
               OPENBLAS_NUM_THREADS=str(max(1, (os.cpu_count() or 1) // world)) if args.cpu else
               os.environ.get("OPENBLAS_NUM_THREADS", ""))
    env = {k: v for k, v in env.items() if v != ""}
    if framework == "mlx":
        tail = py + ["--rank", "mlx"] + _rank_args(args)
        if world == 1:
            cmd = tail
        else:
            launcher = str(Path(sys.executable).with_name("mlx.launch"))
            cmd = [launcher, "-n", str(world), "--backend", "ring" if args.cpu else "nccl",
                   "--starting-port" if args.cpu else "--nccl-port", str(_port()), "--"] + tail
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(world),
               "--master_port", str(_port()), "-m", "benchmarks.scaling", "--rank", "torch"] + \
            _rank_args(args) + (["--torch-compile"] if framework == "torch_compile" else [])
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.communicate()
        return {"framework": framework, "world": world, "error": f"timeout {args.timeout} s"}
    lines = [x for x in out.splitlines() if x.startswith("RESULT ")]
    if proc.returncode or not lines:
        # the cause first (a launcher's summary of a crashed rank fills the tail), then the tail
        cause = [x for x in out.splitlines() if any(k in x for k in ("Error", "what()", "terminate called", "Traceback"))]
        return {"framework": framework, "world": world, "error": "\n".join(cause[:8] + ["..."]) + out[-2500:]}
    res = json.loads(lines[-1][len("RESULT "):])
    sec = statistics.median(res["step_s"])
    res.update(framework=framework, median_step_s=sec, per_rank_batch=args.batch,
               global_batch=args.batch * world, pairs_per_s=args.batch * world / sec,
               wall_s=time.perf_counter() - start)
    return res


def summarise(runs: list[dict], dtype: str) -> dict:
    """Agreement of each peer run with the MLX run of the same world size; speed-ups over one
    rank and ratios to the peers (agreeing runs only)."""
    from benchmarks.common import agreement

    ok = {(r["framework"], r["world"]): r for r in runs if "pairs_per_s" in r}
    for r in runs:
        ref = ok.get(("mlx", r["world"]))
        if r["framework"] != "mlx" and "pairs_per_s" in r:
            r["agreement"] = agreement(ref, r, dtype) if ref else {"ok": False, "reason": "no MLX run"}
    good = {k: r for k, r in ok.items() if k[0] == "mlx" or r["agreement"]["ok"]}
    out: dict = {"speedup": {}, "efficiency": {}, "mlx_over_peer": {}}
    for (fw, w), r in good.items():
        one = good.get((fw, 1))
        if one:
            out["speedup"].setdefault(fw, {})[str(w)] = r["pairs_per_s"] / one["pairs_per_s"]
            out["efficiency"].setdefault(fw, {})[str(w)] = r["pairs_per_s"] / one["pairs_per_s"] / w
        if fw != "mlx" and ("mlx", w) in good:
            out["mlx_over_peer"].setdefault(fw, {})[str(w)] = good[("mlx", w)]["pairs_per_s"] / r["pairs_per_s"]
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--machine", default="cpu")
    ap.add_argument("--model", default="t5-base")
    ap.add_argument("--gpus", nargs="+", type=int, default=[1, 2], help="rank counts to run")
    ap.add_argument("--frameworks", nargs="+", default=["mlx", "torch", "torch_compile"],
                    choices=["mlx", "torch", "torch_compile"])
    ap.add_argument("--batch", type=int, default=64, help="pairs per rank")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--cpu", action="store_true", help="ring / gloo on this CPU (the machinery, not a figure)")
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--out", default=None, help="write the JSON here too")
    ap.add_argument("--rank", choices=["mlx", "torch"], help=argparse.SUPPRESS)
    ap.add_argument("--torch-compile", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.rank == "mlx":
        mlx_rank(args)
        return {}
    if args.rank == "torch":
        torch_rank(args)
        return {}
    from benchmarks.gpu_common import write

    runs = []
    for world in args.gpus:
        for fw in args.frameworks:
            r = launch(fw, world, args)
            runs.append(r)
            print({k: v for k, v in r.items() if k not in ("step_s", "error")} | (
                {"error": r["error"][-500:]} if "error" in r else {}), flush=True)
    payload = {"settings": {"model": args.model, "dtype": args.dtype, "per_rank_batch": args.batch,
                            "steps": args.steps, "warmup": args.warmup, "check_steps": CHECK_STEPS,
                            "backend": "ring/gloo (CPU)" if args.cpu else "nccl",
                            "negatives": "global (documents gathered across ranks)",
                            "command": "python -m benchmarks.scaling " + " ".join(sys.argv[1:] if argv is None else argv)},
               "runs": runs, **summarise(runs, args.dtype),
               "targets": {"mlx_speedup_2": 1.85, "mlx_speedup_4": 3.5, "mlx_over_ddp": 1.0}}
    write("scaling", payload, args.machine, args.out)
    return payload


def results_section() -> list[str]:
    """Data-parallel scaling on two H200s (h200x2/scaling.json): per world size the step time,
    pairs/s and speedup over one GPU."""
    s = load("h200x2", "scaling")
    if not s or "speedup" not in s:
        return []
    rows = {r["world"]: r for r in s["runs"] if "samples_per_s" in r}
    out = ["### Data-parallel scaling (h200x2, mx.distributed NCCL, t5-base bf16)", "",
           "| GPUs | per-GPU batch | global batch | step ms | pairs/s | speedup | target |", "|---|---|---|---|---|---|---|"]
    for w, r in sorted(rows.items()):
        out.append(f"| {w} | {r['per_gpu_batch']} | {r['global_batch']} | {fmt(r['median_step_s'] * 1e3, 1)} "
                   f"| {fmt(r['samples_per_s'])} | {fmt(s['speedup'][str(w)], 2)}x | {'1.8x' if w == 2 else ''} |")
    return out + [""]


if __name__ == "__main__":
    main()
