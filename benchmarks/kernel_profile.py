"""Where a GPU step's time goes, kernel by kernel, for MLX and PyTorch alike.

`profile(fn, steps, sync)` runs `fn` `steps` times under PyTorch's profiler with CUDA activity
only. Kineto records every kernel the process launches through CUPTI, whichever library launched
it, so MLX's kernels are timed by the same clock as PyTorch's (nsys is not on the lent machine).
The summary gives the kernels' device time per step, the wall time per step (their ratio is how
busy the GPU was: well under 1 means the host, not the GPU, sets the pace), time by category and
the most expensive kernels, and the last step's kernels in launch order (`last_step`).

    python -m benchmarks.retriever --machine h100 --models minilm --batch-sizes 128 --profile 10
"""

from __future__ import annotations

import re
import time

# (category, pattern over the kernel's name), first match wins
CATEGORIES = (
    ("attention", r"sdpa|flash|fmha|attention|attn"),
    ("gemm", r"gemm|cutlass|xmma|nvjet|cublas|matmul|wgmma|sm90_"),
    ("norm", r"layer_?norm|rms_?norm|LayerNorm|RMSNorm"),
    ("softmax", r"softmax"),
    ("reduce", r"reduce|Reduce|argmax|arg_reduce|all_reduce|row_reduce|col_reduce"),
    ("gather/scatter", r"gather|scatter|index|embedding"),
    ("copy", r"copy|Copy|transpose|cat_|concat"),
    # mx.compile's kernels are named after their graph (inputs "...V2I...", outputs "...V2O...")
    ("fused elementwise", r"Compiled|compiled|fused|triton_|V2O|V2I|_contiguous<|_strided<"),
    ("elementwise", r"binary|unary|ternary|elementwise|vectorized|Binary|Unary|Ternary"),
)


def categorise(name: str) -> str:
    """The category of a kernel name (see CATEGORIES), or "other"."""
    for cat, pattern in CATEGORIES:
        if re.search(pattern, name):
            return cat
    return "other"


def summarise(events: list[tuple[str, int, float]], steps: int, wall_s: float, top: int = 60) -> dict:
    """events: (kernel name, calls, device seconds in all) over `steps` steps of `wall_s` seconds."""
    total = sum(e[2] for e in events)
    cats: dict[str, dict] = {}
    for name, calls, sec in events:
        c = cats.setdefault(categorise(name), {"s_per_step": 0.0, "calls_per_step": 0.0})
        c["s_per_step"] += sec / steps
        c["calls_per_step"] += calls / steps
    for c in cats.values():
        c["share"] = c["s_per_step"] / (total / steps) if total else 0.0
    ranked = sorted(events, key=lambda e: -e[2])[:top]
    return {
        "steps": steps,
        "wall_s_per_step": wall_s / steps,
        "kernel_s_per_step": total / steps,
        "gpu_busy": (total / wall_s) if wall_s else None,
        "kernels_per_step": sum(e[1] for e in events) / steps,
        "categories": dict(sorted(cats.items(), key=lambda kv: -kv[1]["s_per_step"])),
        "top": [{"name": n[:160], "category": categorise(n), "calls_per_step": c / steps,
                 "us_per_call": 1e6 * s / c if c else 0.0, "s_per_step": s / steps} for n, c, s in ranked],
    }


def profile(fn, steps: int, sync) -> dict:
    """Run fn() `steps` times (after one untraced call) under the CUDA profiler; `summarise`d."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    fn()
    sync()
    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            fn()
        sync()
        wall = time.perf_counter() - start
    events = []
    try:
        kernels = sorted((e for e in prof.events() if e.device_type.name == "CUDA"), key=lambda e: e.time_range.start)
    except (AttributeError, RuntimeError):  # a torch whose events differ: no trace, the summary stands
        kernels = []
    for evt in prof.key_averages():
        us = getattr(evt, "self_device_time_total", None)
        if us is None:
            us = getattr(evt, "self_cuda_time_total", 0.0)
        if us and evt.count:
            events.append((evt.key, int(evt.count), us / 1e6))
    out = summarise(events, steps, wall)
    # the last step's kernels in launch order: name, start and duration (us), to see which
    # instance of a kernel is slow and what ran before it
    last = kernels[-round(out["kernels_per_step"]):] if kernels else []
    t0 = last[0].time_range.start if last else 0
    out["last_step"] = [[e.name[:80], round(e.time_range.start - t0, 1), round(e.time_range.elapsed_us(), 1)]
                        for e in last]
    return out
