"""Where an update step's time goes: the step of `benchmarks.rlaif_step` split into phases, each
timed on its own with a barrier (mx.eval / torch.cuda.synchronize) at its end, on the same batch:

- `forward`: the loss of every micro-batch (no gradient);
- `forward_backward`: the loss and LoRA gradients of every micro-batch, summed (MLX: the
  step's own `mlxcore.train.step.accumulate`, one compiled graph);
- `step`: the whole step (clipping and the optimizer on top).
`backward` = forward_backward - forward and `optimizer` = step - forward_backward are the
differences of medians. MLX's phases are compiled like its step; PyTorch's run the variant's
loss (torch.compile'd where the row is).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

PHASES = ("forward", "forward_backward", "step")


def split(seconds: dict[str, list[float]]) -> dict:
    """Medians in ms of each phase's timings ({phase: [s, ...]}) and the differences between them."""
    ms = {k: 1e3 * statistics.median(v) for k, v in seconds.items()}
    out = {f"{k}_ms": v for k, v in ms.items()}
    if {"forward", "forward_backward"} <= ms.keys():
        out["backward_ms"] = ms["forward_backward"] - ms["forward"]
    if {"forward_backward", "step"} <= ms.keys():
        out["optimizer_ms"] = ms["step"] - ms["forward_backward"]
    return out


def timed(fns: dict[str, Callable[[], None]], repeats: int, sync: Callable[[], None]) -> dict:
    """Each phase's function run once (compilation) and then `repeats` times, interleaved, each
    call between two `sync()` barriers -> `split` of the timings."""
    for fn in fns.values():
        fn()
        sync()
    seconds: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            sync()
            start = time.perf_counter()
            fn()
            sync()
            seconds[name].append(time.perf_counter() - start)
    return split(seconds)


def mlx_phases(loss_fn, step, params, state, batch, repeats: int = 3) -> dict:
    """MLX: `loss_fn(lora, micro, key) -> (loss, metrics)`, `step` the compiled train step,
    `batch` leaves [accum, micro, ...]; `params` and `state` are not changed."""
    import mlx.core as mx

    from mlxcore.train.step import accumulate

    accum = batch["tokens"].shape[0]
    keys = mx.random.split(mx.random.key(0), accum)

    @mx.compile
    def forward(p, b):
        return sum(loss_fn(p, {k: v[i] for k, v in b.items()}, keys[i])[0] for i in range(accum)) / accum

    value_and_grad = mx.value_and_grad(lambda p, micro, key: loss_fn(p, micro, key)[0])

    def grad_fn(p, micro, key):
        loss, grads = value_and_grad(p, micro, key)
        return (loss, {}), grads

    @mx.compile
    def forward_backward(p, b):
        return accumulate(grad_fn, p, b, keys)

    return timed({"forward": lambda: mx.eval(forward(params, batch)),
                  "forward_backward": lambda: mx.eval(forward_backward(params, batch)),
                  "step": lambda: mx.eval(step(params, state, batch, mx.array(0)))}, repeats, lambda: None)


def torch_phases(model, loss_fn, mbs: list[dict], optimizer_step: Callable[[], None], repeats: int = 3) -> dict:
    """PyTorch: `loss_fn(model, mb)` per micro-batch of `mbs`; `optimizer_step()` clips and
    steps (the row's); gradients are cleared after each phase. The step phase changes the
    adapters: run it after the timed steps."""
    import torch

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)

    def forward():
        with torch.no_grad():
            for mb in mbs:
                loss_fn(model, mb)

    def forward_backward():
        model.zero_grad(set_to_none=True)
        for mb in mbs:
            (loss_fn(model, mb) / len(mbs)).backward()

    def step():
        forward_backward()
        optimizer_step()
        model.zero_grad(set_to_none=True)

    return timed({"forward": forward, "forward_backward": forward_backward, "step": step}, repeats, sync)


def phases_table(runs: dict) -> list[str]:
    """The rows' steps split into phases (`rlaif_step --profile`), ms, when measured."""
    split = {fw: run["phases"] for fw, run in runs.items() if run.get("phases")}
    if not split:
        return []
    cols = ("forward_ms", "backward_ms", "optimizer_ms", "step_ms")
    return ["Where the step's time goes (`--profile`: each phase timed alone between barriers; backward = "
            "forward+backward - forward, optimizer = step - forward+backward), ms:", "",
            "| framework | forward | backward | clip + optimizer | step |", "|---|---|---|---|---|",
            *(f"| {fw} | " + " | ".join(f"{p[c]:.1f}" if c in p else "" for c in cols) + " |" for fw, p in split.items()),
            ""]
