"""Primitives and host time of one static decode step, per layer and per step: the mlx-lm forward
on `StaticKVCache` ("generic", `mlxcore.models.decode_step.make_step`) against `mlxcore.models.decode_fused`'s
step ("fused"), on random weights of a shape from `benchmarks.generation.SHAPES`.

A batch-64 decode step on a GPU is host-bound (MLX's host time per primitive, views included),
so the count of primitives per step is the quantity to cut; it does not depend on the device,
so a CPU counts it. Per layer = (count at `--layers` b - count at a) / (b - a): the rest
(embedding, final norm, head, sampling) is the per-step constant. `export_to_dot` of the step's
unevaluated outputs; views (reshape, transpose, slice, ...) apart from kernels. The CUDA fused
attention shows as one `ScaledDotProductAttention`; on the CPU MLX lowers it to its composite
(scale, matmul, softmax, matmul), so the CPU count of "fused" is 3 kernels per layer higher
than the GPU's (`attention_fallback` says which one was counted).

Timing (`--steps`): ms per step of each engine decoding batch `--batch` for `--steps` steps
(all of it host time on a GPU-like shape: `qwen2-24l-micro` on the CPU), and the host ms in
the compiled step's call (building the step's graph) per step.

    python -m dev.decode_graph --machine cpu
    python -m dev.decode_graph --machine h100 --time-shape qwen2.5-0.5b --dtype bfloat16
"""

from __future__ import annotations

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # first: MLX's CPU BLAS is chosen when mlx.core loads (mlxio.runtime)

import argparse
import time

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten


def random_model(shape: str, layers: int | None, dtype: str):
    from mlx_lm.utils import _get_classes

    from benchmarks.generation import SHAPES

    config = dict(SHAPES[shape]) | ({"num_hidden_layers": layers} if layers else {})
    model_class, args_class = _get_classes(config=config)
    model = model_class(args_class.from_dict(config))
    model.set_dtype(getattr(mx, dtype))
    model.eval()
    mx.eval(model.parameters())
    return model


def caches_for(model, batch: int, prompt_len: int, new_tokens: int):
    """A [batch] static cache after `prompt_len` random tokens (one prefill, copied per row)."""
    from mlxcore.models import decode_step
    from mlxcore.train import buckets
    from mlxio.rl.rollout import _prefill

    vocab = model.args.vocab_size
    prompt = np.random.default_rng(0).integers(100, vocab, prompt_len).tolist()
    cache = _prefill(model, prompt[:-1])
    return decode_step.static_cache([cache] * batch, buckets.cache_length(prompt_len - 1, new_tokens)), prompt[-1]


def step_graph(model, fused: bool, batch: int) -> dict:
    """One step's primitives (`benchmarks.generation.graph_nodes`) and its host build ms."""
    from mlx_lm.sample_utils import make_sampler

    from benchmarks.generation import graph_nodes
    from mlxio.rl import decode

    caches, last = caches_for(model, batch, 16, 8)
    step, state = decode.step_and_state(model, make_sampler(temp=1.0), caches, None, fused)
    x = mx.array([last] * batch, mx.uint32)
    mx.eval(mx.random.state, state)
    mx.eval(step(x, state))  # (traces and compiles)
    start = time.perf_counter()
    nxt, lp, state = step(x, state)
    build_ms = 1e3 * (time.perf_counter() - start)
    graph = graph_nodes([nxt, lp, *[a for _, a in tree_flatten(state)]])
    mx.eval(nxt, lp, state)
    return graph | {"host_build_ms": build_ms}


def per_layer(model_at: dict, a: int, b: int) -> dict:
    """(count at b layers - count at a) / (b - a) for the totals and every primitive kind."""
    lo, hi = model_at[a], model_at[b]
    out = {k: (hi[k] - lo[k]) / (b - a) for k in ("primitives", "views", "non_view")}
    kinds = set(lo["kinds"]) | set(hi["kinds"])
    out["kinds"] = {k: (hi["kinds"].get(k, 0) - lo["kinds"].get(k, 0)) / (b - a) for k in sorted(kinds)}
    out["kinds"] = {k: v for k, v in out["kinds"].items() if v}
    out["per_step_constant"] = {k: lo[k] - a * out[k] for k in ("primitives", "views", "non_view")}
    return out


def time_engine(model, fused: bool, batch: int, steps: int, repeats: int) -> dict:
    """ms per decode step (no stop tokens; `mlxio.rl.decode.decode`'s loop, syncs included)."""
    from mlx_lm.sample_utils import make_sampler

    from mlxio.rl import decode

    sampler = make_sampler(temp=1.0)
    runs = []
    for r in range(repeats + 1):  # the first run traces and compiles
        caches, last = caches_for(model, batch, 16, steps)
        mx.eval([c.state for c in caches])
        start = time.perf_counter()
        _, _, _, stats = decode.decode(model, sampler, [last] * batch, caches, steps, lambda i, new: None,
                                  sampler_key=("bench", fused), fused=fused)
        seconds = time.perf_counter() - start
        if r:
            runs.append({"ms_per_step": 1e3 * seconds / stats["steps"],
                         "host_call_ms_per_step": 1e3 * stats["call_s"] / stats["steps"],
                         "host_queue_ms_per_step": 1e3 * stats["queue_s"] / stats["steps"]})
    out = {k: float(np.median([r[k] for r in runs])) for k in runs[0]}
    out["tokens_per_s"] = 1e3 * batch / out["ms_per_step"]
    return out


def main(argv=None):
    from benchmarks.gpu_common import write
    from dev import RESULTS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--machine", default="cpu")
    ap.add_argument("--out", default=None)
    ap.add_argument("--shape", default="qwen2.5-0.5b", help="the shape whose primitives are counted")
    ap.add_argument("--layers", nargs=2, type=int, default=[2, 4], help="two layer counts: per layer = difference")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--dtype", default="float32", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--time-shape", default="qwen2-24l-micro", help="the shape timed ('' : none)")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    a, b = args.layers
    result = {"shape": args.shape, "batch": args.batch, "dtype": args.dtype, "layers": [a, b],
              "device": str(mx.default_device()), "graph": {}, "timing": {}}
    for engine, fused in (("generic", False), ("fused", True)):
        at = {n: step_graph(random_model(args.shape, n, args.dtype), fused, args.batch) for n in (a, b)}
        full = random_model(args.shape, None, args.dtype).args.num_hidden_layers
        layer = per_layer(at, a, b)
        result["graph"][engine] = {
            "per_layer": layer,
            "per_step_full_depth": {k: layer["per_step_constant"][k] + full * layer[k]
                                    for k in ("primitives", "views", "non_view")},
            "full_depth_layers": full, f"at_{b}_layers": at[b],
            "attention_fallback": "ScaledDotProductAttention" not in at[b]["kinds"] if fused else None}
        print(engine, {k: v for k, v in result["graph"][engine].items() if not k.startswith("at_")}, flush=True)
    if args.time_shape:
        model = random_model(args.time_shape, None, args.dtype)
        for engine, fused in (("generic", False), ("fused", True)):
            result["timing"][engine] = time_engine(model, fused, args.batch, args.steps, args.repeats)
            print(engine, result["timing"][engine], flush=True)
        result["timing"]["shape"] = args.time_shape
        result["timing"]["fused_over_generic"] = (result["timing"]["fused"]["tokens_per_s"]
                                                  / result["timing"]["generic"]["tokens_per_s"])
    return write("decode_graph", result, args.machine, args.out, RESULTS)


if __name__ == "__main__":
    main()
