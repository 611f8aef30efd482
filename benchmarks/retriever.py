"""Retriever training step (the xtr_lora step) and encoding throughput: MLX vs PyTorch.

Per (model, framework, batch) one child process (so peak memory and allocator caches belong to
one framework): encoding throughput (documents of 256 tokens, forward only, no LoRA) then the
training step (queries 32 + documents 256 tokens, MaxSim, InfoNCE + 0.1 x margin, backward to
LoRA r=16 on q/v, AdamW, clip 1.0). MLX: `mlxcore.retrieval.objective.contrastive_loss_fn` inside
`mlxcore.train.step.make_train_step` (mx.compile) and a compiled `token_embeddings`. PyTorch:
transformers model + PEFT LoRA, eager and torch.compile (loss function compiled; backward and
fused AdamW outside). float32 on CPU, bf16 on GPU (weights, LoRA and activations).
Same work on both sides, checked before timing: both start from one set of weights and LoRA
init, draw the same batches in the same order, and take the same optimizer steps (the recipe's
MLX AdamW without bias correction, warm-up and cosine; torch.optim.AdamW is given the per-step
lr/eps that make its update identical). Each child first runs `--check-steps` identical steps
and reports their loss and gradient norm; a PyTorch row whose first loss / gradient norm or last
checked loss differs from MLX's beyond TOLERANCE (fp32: 1e-4 / 1e-3 / 1e-3 relative; bf16:
2e-2 / 5e-2 / 5e-2) is kept but marked "invalid": true and left out of the ratios. Every side
runs the same number of untimed and timed steps, so `last_loss` is comparable too.
Both sides are timed alike: each repeat queues its steps (or encodings) back to back and waits
once at the end - PyTorch's CUDA launches return before the GPU finishes, and MLX's side queues
each step with `mx.async_eval` - so on both the host prepares the next step while the GPU runs
this one; the check steps read their loss each step.
Samples/s count pairs (step) or documents (encode); tokens/s count padded tokens (the compute).
MFU = counted model FLOPs (benchmarks.retriever_models.step_flops) / time / peak.

    python -m benchmarks.retriever --machine cpu --models minilm --batch-sizes 12
    python -m benchmarks.retriever --machine h100 --batch-sizes 12 128
"""

from __future__ import annotations

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # first: MLX's CPU BLAS is chosen when mlx.core loads (mlxio.runtime)

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

from benchmarks.common import TOLERANCE, agreement, fmt, load, times

FRAMEWORKS = ("mlx", "torch", "torch_compile")
WARMUP_S: list[float] = []
PEAK_BF16 = {"H100": 989.4e12, "H200": 989.4e12}  # dense bf16 datasheet (SXM)


def _timed(fn, sync, steps: int, repeats: int, warmup: int, host: list | None = None) -> list[float]:
    """Seconds per call of fn, one figure per repeat of `steps` calls, after warm-up. `host`, if
    given, gets per repeat the seconds per call until the last call returned, before the wait
    for the device: the host's own cost of queueing a step (the step is host-bound where it is
    the larger)."""
    start = time.perf_counter()
    for _ in range(warmup):
        fn()
    sync()
    WARMUP_S.append(time.perf_counter() - start)  # compilation (mx.compile / JIT kernels, torch.compile)
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(steps):
            fn()
        if host is not None:
            host.append((time.perf_counter() - start) / steps)
        sync()
        out.append((time.perf_counter() - start) / steps)
    return out


def _data(name: str, batch: int, args) -> dict:
    """The cycled batches as numpy (both sides draw the same rows in the same order). Tiny
    models get synthetic ids: the mined pairs' ids exceed their 512-token vocabulary."""
    from benchmarks import retriever_models as rm

    if getattr(args, "synthetic", False) or name in rm.TINY:
        cfg = rm.shape_config(name)
        doc_len = min(rm.DOC_LEN, getattr(cfg, "max_position_embeddings", rm.DOC_LEN))
        return rm.synthetic_pairs(batch * args.distinct, cfg.vocab_size, getattr(args, "query_len", rm.QUERY_LEN),
                                  getattr(args, "doc_len", doc_len))
    return rm.pair_batches(batch * args.distinct)


def _dtype_name(args) -> str:
    return getattr(args, "dtype", None) or ("bfloat16" if args.gpu else "float32")


def run_mlx(name: str, batch: int, args) -> dict:
    import mlx.core as mx

    from benchmarks import retriever_models as rm
    from mlxcore.retrieval.encoder import token_embeddings
    from mlxcore.retrieval.objective import LossConfig, contrastive_loss_fn
    from mlxcore.train import lora
    from mlxcore.train.optim import make_optimizer
    from mlxcore.train.step import init_state, make_train_step
    from mlxcore.train.tree import combine, map_leaves

    model, projection, real = rm.torch_model(name)
    base = rm.mlx_params(model, projection)
    spec = rm.encoder_spec(model)
    adapters = lora.init(mx.random.key(0), lora.target_dims(base, rm.TARGETS[name]), rm.LORA_RANK)
    dtype = getattr(mx, _dtype_name(args))
    cast = lambda t: map_leaves(lambda x: x.astype(dtype) if mx.issubdtype(x.dtype, mx.floating) else x, t)  # noqa: E731
    base, adapters = cast(base), cast(adapters)
    data = _data(name, batch, args)
    batches = [{k: mx.array(v[i * batch:(i + 1) * batch][None]) for k, v in data.items()}
               for i in range(args.distinct)]
    out = {"real_weights": real}

    if args.encode:
        encode = mx.compile(lambda p, i, m: token_embeddings(p, i, m, spec))
        it = iter(range(10**9))

        def enc():
            b = batches[next(it) % len(batches)]
            mx.async_eval(encode(base, b["doc_ids"][0], b["doc_mask"][0]))

        for _ in range(2):  # compile, then one encoding waited for: its peak memory
            mx.reset_peak_memory()
            enc()
            mx.synchronize()
        out["encode_peak_bytes"] = mx.get_peak_memory()
        out["encode_s"] = _timed(enc, mx.synchronize, args.steps, args.repeats, 2)
        # MLX allocates a kernel's outputs when it is queued, so encodings (and steps) in flight
        # together hold more than one does; PyTorch's allocator reuses memory in stream order
        out["encode_queued_peak_bytes"] = mx.get_peak_memory()

    params = combine(base, adapters)
    cfg = rm.optim_config()
    opt = make_optimizer(cfg)
    step = make_train_step(contrastive_loss_fn(spec, LossConfig()), opt, clip_norm=cfg.clip_norm)
    state = {"params": params, "opt": init_state(opt, params), "n": 0}

    def one():
        """One step queued, not waited for (as PyTorch's side: CUDA launches are asynchronous)."""
        n = state["n"]
        state["params"], state["opt"], state["metrics"] = step(state["params"], state["opt"],
                                                                batches[n % len(batches)], mx.array(n))
        mx.async_eval(state["params"], state["opt"], state["metrics"])
        state["n"] = n + 1

    def checked():
        one()
        state["loss"], state["grad_norm"] = (state["metrics"][k].item() for k in ("loss", "grad_norm"))

    mx.reset_peak_memory()
    out["check"] = _check(checked, state, args.check_steps)
    out["step_peak_bytes"] = mx.get_peak_memory()  # steps waited for one by one (queued ones hold more)
    mx.reset_peak_memory()
    out["step_host_s"] = []
    out["step_s"] = _timed(one, mx.synchronize, args.steps, args.repeats, STEP_WARMUP, out["step_host_s"])
    out["step_queued_peak_bytes"] = mx.get_peak_memory()
    if getattr(args, "profile", 0):
        from benchmarks.kernel_profile import profile

        out["kernel_profile"] = profile(one, args.profile, mx.synchronize)
    out["last_loss"] = state["metrics"]["loss"].item()
    out["total_steps"] = state["n"]
    out["device"] = str(mx.default_device())
    return out


STEP_WARMUP = 3  # untimed steps before timing, the same on every side (torch.compile needs 3)


def _check(one, state: dict, steps: int) -> dict:
    """Run the first `steps` training steps (from the initial weights, batches 0, 1, ... cycled)
    before any timing; their loss and pre-clip gradient norm per step, and the wall time."""
    start = time.perf_counter()
    losses, norms = [], []
    for _ in range(steps):
        one()
        losses.append(state["loss"])
        norms.append(state["grad_norm"])
    return {"steps": steps, "loss": losses, "grad_norm": norms, "seconds": time.perf_counter() - start}


def run_torch(name: str, batch: int, args, compiled: bool) -> dict:
    import mlx.core as mx
    import torch

    from benchmarks import retriever_models as rm
    from mlxcore.train import lora
    from mlxcore.train.tree import flatten

    mx.set_default_device(mx.cpu)  # MLX only draws the LoRA init here
    dev = torch.device("cuda" if args.gpu else "cpu")
    dtype = getattr(torch, _dtype_name(args))
    model, projection, real = rm.torch_model(name)
    adapters = lora.init(mx.random.key(0), lora.target_dims(rm.mlx_params(model, projection),
                                                             rm.TARGETS[name]), rm.LORA_RANK)
    adapters = {k: __import__("numpy").array(v) for k, v in flatten(adapters).items()}
    model.to(dev, dtype)
    if projection is not None:
        projection.to(dev, dtype).requires_grad_(False)
    data = _data(name, batch, args)
    batches = [{k: torch.from_numpy(v[i * batch:(i + 1) * batch]).long().to(dev) for k, v in data.items()}
               for i in range(args.distinct)]
    sync = torch.cuda.synchronize if args.gpu else (lambda: None)
    out = {"real_weights": real, "attn_implementation": model.config._attn_implementation}

    if args.encode:
        embed = torch.compile(rm.torch_embed) if compiled else rm.torch_embed
        it = iter(range(10**9))

        def enc():
            b = batches[next(it) % len(batches)]
            with torch.inference_mode():
                embed(model, projection, b["doc_ids"], b["doc_mask"])

        if args.gpu:
            torch.cuda.reset_peak_memory_stats()
        out["encode_s"] = _timed(enc, sync, args.steps, args.repeats, 3 if compiled else 2)
        if args.gpu:
            out["encode_peak_bytes"] = torch.cuda.max_memory_allocated()

    model, how = rm.add_lora(name, model, adapters)
    model.to(dev, dtype)
    out["lora"] = how
    trainable = [p for p in model.parameters() if p.requires_grad]
    cfg = rm.optim_config()
    profiled = getattr(args, "profile", 0)  # kernel_profile.profile runs one untraced step first
    total = args.check_steps + STEP_WARMUP + args.steps * args.repeats + (profiled + 1 if profiled else 0)
    groups = rm.torch_adamw_groups(cfg, total)  # MLX's AdamW steps, computed before timing
    opt = torch.optim.AdamW(trainable, lr=groups[0][0], betas=(cfg.beta1, cfg.beta2), eps=groups[0][1],
                            weight_decay=cfg.weight_decay, fused=args.gpu)
    loss_fn = torch.compile(rm.torch_loss) if compiled else rm.torch_loss
    state = {"n": 0}

    def one():
        n = state["n"]
        b = batches[n % len(batches)]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model, projection, b)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(trainable, cfg.clip_norm)
        group = opt.param_groups[0]
        group["lr"], group["eps"] = groups[n]
        opt.step()
        state["n"] = n + 1
        state["loss_t"], state["norm_t"] = loss, norm

    def checked():
        one()
        state["loss"], state["grad_norm"] = float(state["loss_t"].detach()), float(state["norm_t"])

    out["check"] = _check(checked, state, args.check_steps)
    if args.gpu:
        torch.cuda.reset_peak_memory_stats()
    out["step_host_s"] = []
    out["step_s"] = _timed(one, sync, args.steps, args.repeats, STEP_WARMUP, out["step_host_s"])
    if args.gpu:
        out["step_peak_bytes"] = torch.cuda.max_memory_allocated()
        out["device"] = torch.cuda.get_device_name()
    if getattr(args, "profile", 0):
        from benchmarks.kernel_profile import profile

        out["kernel_profile"] = profile(one, args.profile, sync)
    out["last_loss"] = float(state["loss_t"].detach())
    out["total_steps"] = state["n"]
    return out


def child(args) -> None:
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    fw = args.framework
    res = run_mlx(args.model, args.batch, args) if fw == "mlx" else run_torch(
        args.model, args.batch, args, fw == "torch_compile")
    res["warmup_s"] = WARMUP_S  # [encode, step] wall seconds of the warm-up calls
    res["process_max_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print("RESULT " + json.dumps(res), flush=True)


def summarise(name: str, fw: str, batch: int, raw: dict, gpu_name: str | None) -> dict:
    from benchmarks import retriever_models as rm

    cfg = rm.shape_config(name)
    row = {"model": name, "framework": fw, "batch": batch, **raw}
    peak = next((v for k, v in PEAK_BF16.items() if gpu_name and k in gpu_name), None)
    for kind, tokens_per, flops in (
            ("step", rm.QUERY_LEN + rm.DOC_LEN, rm.step_flops(cfg, batch)),
            ("encode", rm.DOC_LEN, rm.step_flops(cfg, batch, train=False))):
        if f"{kind}_s" not in raw:
            continue
        sec = statistics.median(raw[f"{kind}_s"])
        row[f"{kind}_median_s"] = sec
        row[f"{kind}_samples_per_s"] = batch / sec
        row[f"{kind}_tokens_per_s"] = batch * tokens_per / sec
        row[f"{kind}_tflops"] = flops / sec / 1e12
        row[f"{kind}_flops"] = flops
        if peak:
            row[f"{kind}_mfu"] = flops / sec / peak
    return row


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--machine", default="cpu", help="results subfolder (cpu, h100, ...)")
    ap.add_argument("--models", nargs="+", default=["t5-base", "minilm"])
    ap.add_argument("--frameworks", nargs="+", default=list(FRAMEWORKS), choices=FRAMEWORKS)
    ap.add_argument("--batch-sizes", nargs="+", type=int, default=[12, 128])
    ap.add_argument("--steps", type=int, default=5, help="steps per timed repeat")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--distinct", type=int, default=2, help="distinct batches cycled through")
    ap.add_argument("--no-encode", dest="encode", action="store_false")
    ap.add_argument("--check-steps", type=int, default=5,
                    help="identical steps run and compared across frameworks before timing")
    ap.add_argument("--dtype", default=None, choices=("float32", "bfloat16"),
                    help="compute dtype (default: float32 on the CPU, bfloat16 on a GPU)")
    ap.add_argument("--profile", type=int, default=0,
                    help="after timing, N more steps under the CUDA kernel profiler (benchmarks.kernel_profile)")
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: default)")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per child run")
    ap.add_argument("--out", default=None, help="JSON path (default benchmarks/results/<machine>/retriever.json)")
    ap.add_argument("--child", nargs=3, metavar=("MODEL", "FRAMEWORK", "BATCH"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.gpu = args.machine != "cpu"
    if args.profile and not args.gpu:
        ap.error("--profile: the kernel profiler records CUDA kernels; run it with a GPU --machine")
    if args.child:
        args.model, args.framework, args.batch = args.child[0], args.child[1], int(args.child[2])
        child(args)
        return {}

    from benchmarks.gpu_common import gpu_name

    name = gpu_name() if args.gpu else None
    rows, load_before = [], os.getloadavg()
    for model in args.models:
        for batch in args.batch_sizes:
            for fw in args.frameworks:
                cmd = [sys.executable, "-m", "benchmarks.retriever", "--machine", args.machine,
                       "--steps", str(args.steps), "--repeats", str(args.repeats),
                       "--distinct", str(args.distinct), "--threads", str(args.threads),
                       "--check-steps", str(args.check_steps), "--profile", str(args.profile), *(["--dtype", args.dtype] if args.dtype else []),
                       *([] if args.encode else ["--no-encode"]), "--child", model, fw, str(batch)]
                start = time.time()
                try:
                    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
                    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
                    if proc.returncode or not lines:
                        row = {"model": model, "framework": fw, "batch": batch,
                               "error": (proc.stderr or proc.stdout)[-1500:]}
                    else:
                        row = summarise(model, fw, batch, json.loads(lines[-1][7:]), name)
                except subprocess.TimeoutExpired:
                    row = {"model": model, "framework": fw, "batch": batch, "error": f"timeout {args.timeout}s"}
                row["wall_s"] = time.time() - start
                rows.append(row)
                save(rows, args, name, load_before)  # after every run: a killed job keeps what it did
                print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()
                                  if not isinstance(v, list)}), flush=True)
    return save(rows, args, name, load_before)


def save(rows: list[dict], args, name: str | None, load_before) -> dict:
    from benchmarks.gpu_common import write

    payload = {"settings": {"query_len": 32, "doc_len": 256, "lora": "r=16 alpha=32 on q,v",
                            "dtype": _dtype_name(args), "steps_per_repeat": args.steps,
                            "check_steps": args.check_steps, "warmup_steps": STEP_WARMUP,
                            "tolerance": TOLERANCE[_dtype_name(args)],
                            "optim": "mlxcore.optim AdamW (no bias correction, lr 2e-4, warm-up 10, cosine to "
                                     "1000, clip 1.0); torch.optim.AdamW given per-step lr/eps that take the "
                                     "same steps (benchmarks.retriever_models.torch_adamw_groups)",
                            "repeats": args.repeats, "distinct_batches": args.distinct,
                            "threads": args.threads or "default",
                            "peak_flops": next((v for k, v in PEAK_BF16.items() if name and k in name), None)},
               "load_avg_before": load_before, "load_avg_after": os.getloadavg(), "gpu": name,
               "runs": rows}
    mark_agreement(rows, payload["settings"]["dtype"])
    payload["ratios"] = ratios(rows)
    write("retriever", payload, args.machine, args.out)
    return payload


def mark_agreement(rows: list[dict], dtype: str) -> None:
    """Annotate each PyTorch row with its agreement with the MLX row of the same (model, batch);
    a row that does not agree gets "invalid": true and is left out of the ratios."""
    mlx = {(r["model"], r["batch"]): r for r in rows if r["framework"] == "mlx" and "error" not in r}
    for r in rows:
        if r["framework"] == "mlx" or "error" in r:
            continue
        ref = mlx.get((r["model"], r["batch"]))
        r["agreement"] = agreement(ref, r, dtype) if ref else {"ok": False, "reason": "no MLX run to compare"}
        r["invalid"] = not r["agreement"]["ok"]


def ratios(rows: list[dict]) -> list[dict]:
    """MLX over each PyTorch variant, per (model, batch), for step and encode throughput; a peer
    flagged invalid (its pre-timing check disagrees with MLX) is left out."""
    by = {(r["model"], r["batch"], r["framework"]): r for r in rows if "error" not in r and not r.get("invalid")}
    out = []
    for (model, batch, fw), r in by.items():
        if fw != "mlx":
            continue
        for peer in ("torch", "torch_compile"):
            p = by.get((model, batch, peer))
            for kind in ("step", "encode"):
                if p and f"{kind}_samples_per_s" in r and f"{kind}_samples_per_s" in p:
                    out.append({"model": model, "batch": batch, "kind": kind, "peer": peer,
                                "mlx_over_peer": r[f"{kind}_samples_per_s"] / p[f"{kind}_samples_per_s"]})
    return out


def first_steps_s(run: dict | None) -> float | None:
    """Seconds a child took for its first `check_steps` identical steps, kernel compilation
    (MLX's NVRTC, torch.compile's Inductor) included, with the kernel caches as that run found
    them (often warm from an earlier run on the machine): not a fresh machine's cold start."""
    if run is None or "error" in run:
        return None
    return (run.get("check") or {}).get("seconds")


def machine_section(machine: str, data: dict, bars: list, name: str = "retriever") -> list[str]:
    """One result file's table (docs/performance.md): per (model, batch) the step and encoding rates of
    each side, their ratios, MFU, peak memory and the first steps' seconds; appends the ratios to `bars`
    (the chart's (label, MLX / PyTorch))."""
    runs = {(r["model"], r["batch"], r["framework"]): r for r in data["runs"]}
    keys = sorted({(m, b) for m, b, _ in runs}, key=lambda k: (k[0], k[1]))
    checked = any("agreement" in r for r in data["runs"])
    out = [f"### Retriever training step and encoding, {machine} ({data['settings']['dtype']}"
           f"{', ' + data['gpu'] if data.get('gpu') else ''}; {name}.json"
           f"{', both sides checked to take the same steps' if checked else ', before the agreement check'})", "",
           "| model | batch | step pairs/s MLX | PyTorch eager | torch.compile | MLX / eager | MLX / compile "
           "| MLX MFU | peak GB MLX / eager | encode docs/s MLX | encode eager (SDPA) | encode compile "
           "| encode MLX / eager | first 5 steps s incl. compilation, caches as found: MLX / eager / compile |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for model, batch in keys:
        m, t, c = (runs.get((model, batch, f)) for f in ("mlx", "torch", "torch_compile"))

        def get(r, k):
            return None if r is None or "error" in r else r.get(k)

        def ratio(a, b, k):
            x, y = get(a, k), get(b, k)
            return None if x is None or y is None else x / y

        step_e, step_c = ratio(m, t, "step_samples_per_s"), ratio(m, c, "step_samples_per_s")
        enc_e = ratio(m, t, "encode_samples_per_s")
        mfu = get(m, "step_mfu")
        peaks = [get(r, "step_peak_bytes") or get(r, "process_max_rss_bytes") for r in (m, t)]
        out.append(
            f"| {model} | {batch} | {fmt(get(m, 'step_samples_per_s'), 1)} | {fmt(get(t, 'step_samples_per_s'), 1)} "
            f"| {fmt(get(c, 'step_samples_per_s'), 1)} | {times(step_e)} | {times(step_c)} "
            f"| {fmt(mfu * 100 if mfu else None, 1)}% | {' / '.join(fmt(p / 1e9 if p else None, 1) for p in peaks)} "
            f"| {fmt(get(m, 'encode_samples_per_s'), 1)} | {fmt(get(t, 'encode_samples_per_s'), 1)} "
            f"| {fmt(get(c, 'encode_samples_per_s'), 1)} | {times(enc_e)} "
            f"| {' / '.join(fmt(first_steps_s(r), 1) for r in (m, t, c))} |")
        for label, val in ((f"{machine} {model} b{batch} step vs eager", step_e),
                           (f"{machine} {model} b{batch} step vs compile", step_c),
                           (f"{machine} {model} b{batch} encode vs eager", enc_e)):
            if val:
                bars.append((label, val))
    errors = [f"{k[0]} b{k[1]} {k[2]}: {r['error'][:80]!r}" for k, r in runs.items() if "error" in r]
    if errors:
        out += ["", "Not measured: " + "; ".join(errors)]
    for key, note in (data.get("notes") or {}).items():
        out += ["", f"- {key}: {note}"]
    load_avg = data.get("load_avg_before")
    if load_avg and machine == "cpu":
        busy = max(load_avg[0], data["load_avg_after"][0]) > 3.0  # 2 cores: above ~3, other jobs shared them
        out += ["", f"CPU load average during the run: {load_avg[0]:.1f} (before) / {data['load_avg_after'][0]:.1f} "
                "(after) on 2 cores" + (" shared with other jobs: CPU figures are noisy." if busy else ".")]
    return out + [""]


def results_section(bars: list) -> list[str]:
    """The retriever step and encoding tables of every committed run (h100's agreement-checked
    MiniLM b128 run, h100's and the CPU's full runs), in that order."""
    lines = []
    for machine, name in (("h100", "retriever_minilm_b128"), ("h100", "retriever"), ("cpu", "retriever")):
        r = load(machine, name)
        if r:
            lines += machine_section(machine, r, bars, name)
    return lines


if __name__ == "__main__":
    main()
