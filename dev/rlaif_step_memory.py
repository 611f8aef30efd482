"""Where the RLAIF update step's memory goes (issue 33 item 2), on the code path the GPU runs:
the recipe's loss (`benchmarks.rlaif_parts.loss`: hidden states, chunked log-probs, the policy loss) inside
`mlxcore.train.step.make_train_step`, the "full" preset's LoRA (r=16 on q, k, v, o) and AdamW, random
weights of a `benchmarks.generation.SHAPES` shape in bf16.

Three accounts, one JSON (`dev/results/<machine>/rlaif_step_memory.json`):

1. `saved` - what autodiff keeps for the backward pass, read off the graph (no evaluation):
   `mx.export_function` traces the loss's value and LoRA gradient; the arrays the forward pass
   computes (ancestors of the loss) that a backward op reads are the saved ones, views resolved
   to their buffer, identical ops merged as `mx.compile` merges them. Per block = (blocks b) -
   (blocks a); the rest is the embedding, final norm and log-prob head. At the real micro-batch
   (`--saved-rows` x prompt + completion). Recomputed parts (`memory.recompute`) are custom
   vjps, which the exporter cannot trace: this account is of `recompute` off.
2. `measured` - the compiled step's peak on this machine's MLX (`mx.get_peak_memory`, what
   MLX allocated), per variant, at a small micro-batch (`--rows`) and a cut vocabulary
   (`--vocab`: the head's [chunk, vocab] buffers are in `head`): "live" with MLX's run-ahead off
   (`mx.set_memory_limit(1)`: each op waits for the ones queued before it, so the peak is what
   the graph keeps alive), "queued" as MLX runs by default (the host queues up to ~50 ops on a
   CPU, ~10 CUDA graphs of up to 100 ops / 1,000 MB of inputs on an H100 ahead of the device,
   and their buffers are allocated: the difference is that run-ahead), "capped" with the memory
   limit at `--cap-mb` above the live peak (evaluation waits only when above it).
3. `analytic` - bytes per block and row of the minimum a LoRA backward needs (the inputs of
   the trainable matmuls, the norms' inputs, q/k/v/out and the log-sum-exp of a fused
   attention, SwiGLU's two inputs) and of what the GPU's MLX keeps (its fused RMSNorm, RoPE and
   attention; the attention's backward fused only when the model's input length is a multiple
   of 128, mlx/backend/cuda/scaled_dot_product_attention.cpp), each item named, to set beside
   `saved` (the CPU's MLX runs the norms, RoPE and attention as composites: float32 norm copies
   and [rows, heads, T, T] probabilities that a GPU never keeps).

    python -m dev.rlaif_step_memory --machine cpu
    python -m dev.rlaif_step_memory --machine h100 --rows 16 --vocab 151936 --layers 2 4 --head-rows 512 \
        --cap-mb 3000 --variants recompute_off recompute_mlp_lora accum3 accum3_eval_micro   # on a GPU
"""

from __future__ import annotations

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # first: MLX's CPU BLAS is chosen when mlx.core loads (mlxio.runtime)

import argparse
import math
import threading
import time
from collections import Counter

import attrs
import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten

from dev import RESULTS

# primitives whose output shares its input's buffer (Reshape copies when its input is not
# contiguous: counted as a view here, so a transposed-then-reshaped array is under-counted)
VIEWS = {"Reshape", "Transpose", "ExpandDims", "Squeeze", "Broadcast", "AsStrided", "Slice", "Flatten",
         "Unflatten", "StopGradient", "Depends", "Copy"}
BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "int32": 4, "uint32": 4, "bool": 1, "int64": 8, "uint8": 1}
RECOMPUTE_ALL = ("mlp", "lora")


def build(shape: str, layers: int, vocab: int | None, dtype: str = "bfloat16", seed: int = 0):
    """mlx-lm's model of `shape` with `layers` blocks (and `vocab` tokens), random weights from
    `seed`, in `dtype`, with the full preset's LoRA; returns (model, LoRA tree)."""
    from mlx_lm.utils import _get_classes

    from benchmarks.generation import SHAPES
    from mlxio.weights import llm_lora
    from recipes.rlaif_config import PRESETS

    cfg = dict(SHAPES[shape], num_hidden_layers=layers, **({"vocab_size": vocab} if vocab else {}))
    model_class, args_class = _get_classes(config=cfg)
    mx.random.seed(seed)
    model = model_class(args_class.from_dict(cfg))
    model.set_dtype(getattr(mx, dtype))
    mx.eval(model.parameters())
    return model, llm_lora.apply_lora(model, PRESETS["full"].lora, None, mx.random.key(seed))


def recipe_cfg(recompute: tuple[str, ...], chunk: int = 512):
    from recipes.rlaif_config import PRESETS

    cfg = PRESETS["full"]
    return attrs.evolve(cfg, memory=attrs.evolve(cfg.memory, recompute=recompute, logprob_chunk=chunk))


def step_batch(cfg, rows: int, accum: int, prompt: int, completion: int, vocab: int) -> dict:
    from benchmarks.rlaif_step import batch_arrays, mlx_batch

    return mlx_batch(batch_arrays(rows * accum, prompt, completion, vocab), rows, cfg)


# ---- 1. what autodiff keeps: the traced graph ------------------------------------------------

def traced_graph(loss_fn, params, micro) -> list[dict]:
    """Nodes of `mx.export_function`'s trace of [loss, *LoRA gradients] (topological order)."""
    names = [k for k, _ in tree_flatten(params)]

    def fn(*leaves):
        tree = tree_unflatten(list(zip(names, leaves, strict=True)))
        (loss, _), grads = mx.value_and_grad(lambda p: loss_fn(p, micro, mx.random.key(0)))(tree)
        return [loss] + [g for _, g in tree_flatten(grads)]

    nodes = []
    mx.export_function(nodes.append, fn, *[v for _, v in tree_flatten(params)])
    return nodes


def saved_arrays(nodes: list[dict]) -> Counter:
    """{(producer, shape, dtype): count} of the buffers the backward pass reads from the forward
    pass (see the module doc), identical primitives merged (`mx.compile`'s simplification)."""
    loss_id = next(n for n in nodes if n["type"] == "outputs")["outputs"][0][0]
    prims = [n for n in nodes if n["type"] == "primitive"]
    canon, seen, producer = {}, {}, {}
    for n in prims:  # merge identical ops on identical inputs
        ins = tuple(canon.get(i[0], i[0]) for i in n["inputs"])
        key = (n["name"], repr(n["arguments"]), ins)
        if key in seen:
            for o, first in zip(n["outputs"], seen[key]["outputs"], strict=True):
                canon[o[0]] = canon.get(first[0], first[0])
            continue
        seen[key] = n
        n["canon_inputs"] = ins
        for o in n["outputs"]:
            producer[o[0]] = n
    forward, stack = set(), [canon.get(loss_id, loss_id)]
    while stack:
        a = stack.pop()
        if a in forward or a not in producer:
            continue
        forward.add(a)
        stack.extend(producer[a]["canon_inputs"])

    def root(a):
        while a in producer and producer[a]["name"] in VIEWS:
            a = producer[a]["canon_inputs"][0]
        return a

    saved = set()
    for n in seen.values():
        if any(o[0] in forward for o in n["outputs"]):
            continue  # a forward op
        for a in n["canon_inputs"]:
            if a in forward and root(a) in producer:  # computed by the forward pass (not a weight)
                saved.add(root(a))
    out = Counter()
    for a in saved:
        n = producer[a]
        shape, dtype = next((o[1], o[2]) for o in n["outputs"] if o[0] == a)
        out[(n["name"], tuple(shape), str(dtype).rsplit(".", 1)[-1])] += 1
    return out


def nbytes(shape, dtype: str) -> int:
    return math.prod(shape) * BYTES.get(dtype, 4)


def saved_account(args) -> dict:
    """Per block (blocks b - blocks a) and the rest, at `--saved-rows` rows of the real shape."""
    from benchmarks import rlaif_parts

    inventories = {}
    for layers in args.layers:
        model, params = build(args.shape, layers, None)
        cfg = recipe_cfg(())
        batch = step_batch(cfg, args.saved_rows, 1, args.prompt, args.completion, model.args.vocab_size)
        micro = {k: v[0] for k, v in batch.items()}
        inventories[layers] = saved_arrays(traced_graph(rlaif_parts.loss(model, cfg), params, micro))
        del model, params
    a, b = args.layers
    per_block = Counter({k: (inventories[b][k] - inventories[a][k]) / (b - a)
                         for k in inventories[b] | inventories[a]})
    rest = Counter({k: inventories[a][k] - a * per_block[k] for k in inventories[a]})

    def table(counts):
        rows = [{"producer": k[0], "shape": list(k[1]), "dtype": k[2], "count": c, "bytes": c * nbytes(k[1], k[2])}
                for k, c in counts.items() if c > 1e-9]
        return sorted(rows, key=lambda r: -r["bytes"])

    blocks = table(per_block)
    return {"rows": args.saved_rows, "tokens": args.prompt + args.completion, "per_block": blocks,
            "per_block_bytes": sum(r["bytes"] for r in blocks), "rest": table(rest),
            "rest_bytes": sum(r["bytes"] for r in table(rest))}


# ---- 2. measured peaks ------------------------------------------------------------------------

def run_step(step, params, state, batch, limit: int | None = None, trace: bool = False) -> dict:
    """One step after a compiling one: peak bytes above what was allocated before it, seconds,
    loss, gradient norm, and with `trace` the active bytes sampled every ~2 ms."""
    out = step(params, state, batch, mx.array(0))
    mx.eval(out)
    old = mx.set_memory_limit(limit) if limit else None
    samples, stop = [], []
    try:
        mx.clear_cache()
        mx.reset_peak_memory()
        before = mx.get_active_memory()

        def sample():
            while not stop:
                samples.append(mx.get_active_memory() - before)
                time.sleep(0.002)

        sampler = threading.Thread(target=sample)
        if trace:
            sampler.start()
        start = time.perf_counter()
        _, _, metrics = out = step(params, state, batch, mx.array(0))
        mx.eval(out)
        seconds = time.perf_counter() - start
        peak = mx.get_peak_memory() - before
    finally:
        stop.append(1)
        if trace:
            sampler.join()
        if old is not None:
            mx.set_memory_limit(old)
    res = {"peak_bytes": peak, "seconds": seconds, "loss": metrics["loss"].item(),
           "grad_norm": metrics["grad_norm"].item()}
    if trace:
        res["trace_mb"] = [round(s / 1e6, 1) for s in samples[::max(1, len(samples) // 200)]]
    return res


def measured(args) -> dict:
    """Peaks of the variants at `--rows` x (prompt + completion), `--vocab`, blocks `--layers`."""
    from benchmarks import rlaif_parts
    from mlxcore.train import step as step_mod
    from mlxcore.train.optim import make_optimizer
    from mlxcore.train.step import init_state, make_train_step

    variants = {  # name: (recompute, accum, eval_micro, micro-batches chained)
        "recompute_off": ((), 1, False, True),
        "recompute_mlp": (("mlp",), 1, False, True),
        "recompute_lora": (("lora",), 1, False, True),
        "recompute_mlp_lora": (RECOMPUTE_ALL, 1, False, True),
        "accum3_unchained": (RECOMPUTE_ALL, 3, False, False),
        "accum3": (RECOMPUTE_ALL, 3, False, True),
        "accum3_eval_micro": (RECOMPUTE_ALL, 3, True, True),
    }
    chained = step_mod.after
    out = {}
    for layers in args.layers:
        model, params = build(args.shape, layers, args.vocab)
        for name in args.variants:
            recompute, accum, eval_micro, chain = variants[name]
            if accum > 1 and layers != max(args.layers):
                continue
            cfg = recipe_cfg(recompute)
            opt = make_optimizer(cfg.optim)
            step_mod.after = chained if chain else (lambda tree, deps: tree)  # the previous behaviour
            try:
                step = make_train_step(rlaif_parts.loss(model, cfg), opt, clip_norm=cfg.optim.clip_norm,
                                       eval_micro_batches=eval_micro)
                state = init_state(opt, params)
                batch = step_batch(cfg, args.rows, accum, args.prompt, args.completion, args.vocab)
                mx.eval(state, batch)
                live = run_step(step, params, state, batch, limit=1)
                queued = run_step(step, params, state, batch, trace=args.trace)
                capped = run_step(step, params, state, batch, limit=mx.get_active_memory() + live["peak_bytes"]
                                  + int(args.cap_mb * 1e6)) if args.cap_mb else None
            finally:
                step_mod.after = chained
            out[f"{name}_L{layers}"] = {"layers": layers, "recompute": list(recompute), "accum": accum,
                                        "eval_micro": eval_micro, "chained": chain, "live": live,
                                        "queued": queued, **({"capped": capped} if capped else {})}
            print(name, layers, {k: (v["peak_bytes"] / 1e6, round(v["seconds"], 1))
                                 for k, v in (("live", live), ("queued", queued), ("capped", capped)) if v},
                  flush=True)
        del model, params
    a, b = args.layers
    slopes = {name: {kind: (out[f"{name}_L{b}"][kind]["peak_bytes"] - out[f"{name}_L{a}"][kind]["peak_bytes"]) / (b - a)
                     for kind in ("live", "queued")}
              for name in args.variants if f"{name}_L{a}" in out and f"{name}_L{b}" in out}
    return {"rows": args.rows, "vocab": args.vocab, "tokens": args.prompt + args.completion,
            "runs": out, "per_block_bytes": slopes}


def head_account(args) -> dict:
    """The log-prob head alone at the real vocabulary: peak of the gradient of
    `gathered_logprobs` over `--head-rows` scored positions, chunk = all of them."""
    from benchmarks.generation import SHAPES
    from mlxcore.rl.logprobs import head_logprobs

    vocab, hidden = SHAPES[args.shape]["vocab_size"], SHAPES[args.shape]["hidden_size"]
    w = (mx.random.normal((vocab, hidden), key=mx.random.key(0)) * 0.02).astype(mx.bfloat16)
    h = mx.random.normal((args.head_rows, hidden), key=mx.random.key(1)).astype(mx.bfloat16)
    t = mx.random.randint(0, vocab, (args.head_rows,), key=mx.random.key(2))
    mx.eval(w, h, t)  # before compiling: a lazy `w` would be traced into the step and drawn again
    fn = mx.compile(mx.grad(lambda h: head_logprobs(lambda x: x @ w.T, h, t, chunk=args.head_rows)[0].sum()))
    mx.eval(fn(h))
    peak = {}
    for label, limit in (("live", 1), ("queued", None)):
        old = mx.set_memory_limit(limit) if limit else None
        mx.clear_cache()
        mx.reset_peak_memory()
        before = mx.get_active_memory()
        mx.eval(fn(h))
        peak[label] = mx.get_peak_memory() - before
        if old is not None:
            mx.set_memory_limit(old)
    return {"rows": args.head_rows, "vocab": vocab, "peak_bytes": peak,
            "per_chunk_row_bytes": {k: v / args.head_rows for k, v in peak.items()},
            "logits_row_bytes": {"bf16": vocab * 2, "float32": vocab * 4}}


# ---- 3. analytic --------------------------------------------------------------------------------

def analytic(shape: str, rows: int, tokens: int, attention_fused_vjp: bool) -> dict:
    """Bytes per block: (item, bytes) of the minimum, of the GPU's MLX before this study's fixes
    and after them (`memory.recompute` mlp + lora)."""
    from benchmarks.generation import SHAPES

    s = SHAPES[shape]
    d, ffn, heads, kv = s["hidden_size"], s["intermediate_size"], s["num_attention_heads"], s["num_key_value_heads"]
    hd = s.get("head_dim") or d // heads
    n = rows * tokens
    bf16, f32 = 2, 4
    hidden, mlp, qkv = n * d * bf16, n * ffn * bf16, n * (heads + 2 * kv) * hd * bf16
    lse = rows * heads * tokens * f32
    probs = rows * heads * tokens * tokens * bf16
    minimum = {"block input (norm 1)": hidden, "mid residual (norm 2)": hidden,
               "norm 1 output (LoRA A input, bf16)": hidden, "q, k, v (attention)": qkv,
               "attention output + log-sum-exp (o_proj LoRA input)": hidden + lse,
               "SwiGLU inputs g, u": 2 * mlp}
    gpu_before = {"block input (norm 1)": hidden, "mid residual (norm 2)": hidden,
                  "q/k/v LoRA input, float32 copy (one: compile merges the three)": 2 * hidden,
                  "q, k, v (attention)": qkv,
                  "attention output (o_proj LoRA input, float32 copy)": 2 * hidden,
                  "SwiGLU g, u, sigmoid(g), silu(g)": 4 * mlp,
                  **({"attention output + log-sum-exp (fused backward)": hidden + lse} if attention_fused_vjp else
                     {"attention backward recomputes [rows, heads, T, T] (transient, ~5 x)": 0})}
    gpu_after = {k: v for k, v in gpu_before.items() if "float32" not in k and "SwiGLU" not in k}
    gpu_after |= {"norm 1 output (LoRA A input, bf16)": hidden, "attention output (o_proj LoRA input, bf16)": hidden,
                  "SwiGLU inputs g, u": 2 * mlp}
    return {"rows": rows, "tokens": tokens, "unit_bytes": hidden, "attention_probs_bytes": probs,
            "minimum": minimum, "gpu_before": gpu_before, "gpu_after": gpu_after,
            "totals": {k: sum(v.values()) for k, v in (("minimum", minimum), ("gpu_before", gpu_before),
                                                        ("gpu_after", gpu_after))}}


def main(argv=None) -> dict:
    import json

    from benchmarks.gpu_common import write

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--machine", default="cpu")
    ap.add_argument("--shape", default="qwen2.5-0.5b")
    ap.add_argument("--layers", type=int, nargs=2, default=[1, 2], help="two block counts: per block = the difference")
    ap.add_argument("--rows", type=int, default=1, help="measured: rows per micro-batch")
    ap.add_argument("--vocab", type=int, default=4096, help="measured: vocabulary (the head is measured apart)")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--completion", type=int, default=256)
    ap.add_argument("--saved-rows", type=int, default=16, help="saved: rows of the traced micro-batch")
    ap.add_argument("--head-rows", type=int, default=64, help="head: scored positions measured at the real vocabulary")
    ap.add_argument("--cap-mb", type=float, default=0.0, help="measured: also run with the memory limit this far "
                    "above the live peak (0: not)")
    ap.add_argument("--trace", action="store_true", help="measured: sample active memory during the queued step")
    ap.add_argument("--variants", nargs="+", default=["recompute_off", "recompute_mlp", "recompute_lora",
                                                      "recompute_mlp_lora", "accum3_unchained", "accum3",
                                                      "accum3_eval_micro"])
    ap.add_argument("--parts", nargs="+", default=["saved", "measured", "head"],
                    choices=["saved", "measured", "head"])
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if len(set(args.layers)) != 2 or min(args.layers) < 1:
        ap.error("--layers: two different block counts >= 1")
    args.layers = sorted(args.layers)
    result = {"command": "python -m dev.rlaif_step_memory " + " ".join(argv or __import__("sys").argv[1:]),
              "shape": args.shape, "device": str(mx.default_device()),
              "analytic_16x383": analytic(args.shape, 16, args.prompt + args.completion - 1, False),
              "analytic_16x384": analytic(args.shape, 16, args.prompt + args.completion, True)}
    if "saved" in args.parts:
        result["saved"] = saved_account(args)
        print(json.dumps({k: v for k, v in result["saved"].items() if k != "rest"}, indent=1)[:3000], flush=True)
    if "head" in args.parts:
        result["head"] = head_account(args)
        print(result["head"], flush=True)
    if "measured" in args.parts:
        result["measured"] = measured(args)
    write("rlaif_step_memory", result, args.machine, out=args.out, root=RESULTS)
    return result


if __name__ == "__main__":
    main()
