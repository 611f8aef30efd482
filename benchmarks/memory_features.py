"""Speed and memory features of the retriever's training step, each with and without, on the
same run settings: gradient checkpointing, bf16 mixed precision, the lazy evaluation interval,
the memory profiler's own overhead, evaluating each accumulated micro-batch on its own
(`eval_micro_batches`: peak memory of one micro-batch instead of all of them), and the cached
contrastive loss (`grad_cache`: one micro-batch, plain, against --grad-cache MICROxACCUM pairs
as ONE contrastive batch computed micro-batch by micro-batch, e.g. 16x16 = 256).

Each configuration runs in its own child process (so peak memory and allocator caches belong
to one configuration), on the recipe's step: `mlxcore.retrieval.objective.contrastive_loss_fn` in
`mlxcore.train.step.make_train_step` (mx.compile), LoRA r=16 on query/value, AdamW, full-length
synthetic batches (every token real). Weights are random with the real shapes (MiniLM-L6 or
BERT-base), which changes neither memory nor speed, so the GPU machine needs no model files.
Peak = MLX's high-water mark over the timed steps; activation peak = peak - memory held before
the step (weights, LoRA, optimizer state, batch).

    python -m benchmarks.memory_features --machine cpu --model minilm --batch 32 --doc-len 128
    python -m benchmarks.memory_features --machine h100 --model minilm bert-base --batch 32 --doc-len 256
"""

from __future__ import annotations

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # first: MLX's CPU BLAS is chosen when mlx.core loads (mlxio.runtime)

import argparse
import json
import os
import subprocess
import sys
import time

from benchmarks.common import RESULTS

MODELS = {  # transformers' BertConfig fields of the shapes measured
    "minilm": {"vocab_size": 30522, "hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12,
               "intermediate_size": 1536},
    "bert-base": {"vocab_size": 30522, "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
                  "intermediate_size": 3072},
}


def measure(cfg: dict) -> dict:
    """One configuration, in this process: {peak_mb, base_mb, activation_peak_mb, samples_per_s, ...}."""
    import mlx.core as mx

    from mlxcore.models import bert
    from mlxcore.retrieval import objective
    from mlxcore.retrieval.encoder import EncoderSpec
    from mlxcore.train import lora, precision
    from mlxcore.train.optim import OptimConfig, make_optimizer
    from mlxcore.train.step import init_state, make_train_step
    from mlxcore.train.tree import combine, unflatten
    from mlxio.run import memprof
    from mlxio.run.batch_probe import synthetic_batch

    model = bert.BertConfig(**MODELS[cfg["model"]])
    spec = objective.with_checkpointing(EncoderSpec(kind="bert", model=model, lora_scale=2.0),
                                        cfg["checkpointing"])
    keys = iter(mx.random.split(mx.random.key(0), 400))
    base = unflatten({k: 0.02 * mx.random.normal(s, key=next(keys)) for k, s in bert.param_shapes(model).items()})
    params = combine(base, lora.init(mx.random.key(1), lora.target_dims(base, ("query", "value")), 16))
    params = precision.cast_frozen(params, lora.is_lora_path, cfg["dtype"])
    optimizer = make_optimizer(OptimConfig(lr=1e-4, warmup_steps=2, total_steps=1000))
    step = make_train_step(objective.contrastive_loss_fn(spec), optimizer,
                           eval_micro_batches=cfg.get("eval_micro_batches", False),
                           grad_cache=objective.contrastive_parts(spec) if cfg.get("grad_cache") else None)
    opt_state = init_state(optimizer, params)
    batches = [synthetic_batch(model.vocab_size, cfg["micro"], cfg["accum"], cfg["query_len"], cfg["doc_len"], seed=i)
               for i in range(2)]
    mx.eval(params, opt_state, batches)
    profiler = None
    interval = cfg.get("eval_interval", 1)

    def run(n: int, start: int) -> None:
        nonlocal params, opt_state
        for i in range(start, start + n):
            params, opt_state, metrics = step(params, opt_state, batches[i % 2], mx.array(i))
            if (i + 1) % interval == 0 or i + 1 == start + n:
                mx.eval(params, opt_state, metrics)
                if profiler is not None:
                    profiler.record(i + 1)

    run(cfg.get("warmup", 2), 0)  # compile + warm the allocator's cache
    base_bytes = mx.get_active_memory()
    mx.reset_peak_memory()
    if cfg.get("profile"):  # it resets MLX's peak per record and keeps the overall one
        profiler = memprof.MemoryProfiler()
    rates = []
    for r in range(cfg["repeats"]):
        tic = time.perf_counter()
        run(cfg["steps"], cfg.get("warmup", 2) + r * cfg["steps"])
        rates.append(cfg["steps"] * cfg["micro"] * cfg["accum"] / (time.perf_counter() - tic))
    mb = 1024 * 1024
    peak = max(mx.get_peak_memory(), int(profiler.overall_peak_mb * mb) if profiler else 0)
    return {**cfg, "device": str(mx.default_device()), "base_mb": base_bytes / mb, "peak_mb": peak / mb,
            "activation_peak_mb": (peak - base_bytes) / mb, "samples_per_s": max(rates),
            "samples_per_s_all": rates}


def child(cfg: dict) -> dict:
    """`measure(cfg)` in a fresh process."""
    done = subprocess.run([sys.executable, "-m", "benchmarks.memory_features", "--child", json.dumps(cfg)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        return {**cfg, "error": done.stderr.strip().splitlines()[-3:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def pairs_for(model: str, batch: int, doc_len: int, steps: int, repeats: int, warmup: int,
              split: tuple[int, int] = (12, 4), cached: tuple[int, int] = (16, 16)) -> dict[str, list[dict]]:
    """{feature: [without, with]} configurations that differ only in the feature."""
    base = {"model": model, "micro": batch, "accum": 1, "query_len": 32, "doc_len": doc_len, "dtype": "float32",
            "checkpointing": False, "steps": steps, "repeats": repeats, "warmup": warmup}
    quick = {**base, "micro": split[0], "accum": split[1], "steps": max(steps, 4) // 4 * 4}  # a recipe preset's split
    return {
        "gradient_checkpointing": [base, {**base, "checkpointing": True}],
        "bf16": [base, {**base, "dtype": "bfloat16"}],
        "eval_interval": [{**quick, "eval_interval": 1}, {**quick, "eval_interval": 4}],
        "eval_micro_batches": [quick, {**quick, "eval_micro_batches": True}],
        "profile_memory": [base, {**base, "profile": True}],
        "grad_cache": [{**base, "micro": cached[0]},
                       {**base, "micro": cached[0], "accum": cached[1], "grad_cache": True}],
    }


def summarise(rows: list[dict]) -> dict:
    off, on = rows
    if "error" in off or "error" in on:
        return {}
    return {"peak_change": on["peak_mb"] / off["peak_mb"] - 1,
            "activation_peak_change": on["activation_peak_mb"] / off["activation_peak_mb"] - 1,
            "speed_change": on["samples_per_s"] / off["samples_per_s"] - 1}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--machine", default="cpu")
    parser.add_argument("--model", nargs="+", default=["minilm"], choices=sorted(MODELS))
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--doc-len", type=int, default=128)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--split", default="12x4", help="MICROxACCUM of the eval_interval runs (quick: 12x4, smoke: 4x2)")
    parser.add_argument("--grad-cache", default="16x16",
                        help="MICROxACCUM of the grad_cache run (its plain peer: one MICRO micro-batch)")
    parser.add_argument("--features", nargs="+", default=None)
    parser.add_argument("--out", default=None, help="JSON path (default benchmarks/results/<machine>/...)")
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure(json.loads(args.child))))
        return
    load_before, results = os.getloadavg(), {}
    split = tuple(int(x) for x in args.split.split("x"))
    cached = tuple(int(x) for x in args.grad_cache.split("x"))
    if len(split) != 2 or len(cached) != 2 or min(*split, *cached) < 1:
        parser.error("--split and --grad-cache take MICROxACCUM with both >= 1")
    for model in args.model:
        for feature, configs in pairs_for(model, args.batch, args.doc_len, args.steps, args.repeats,
                                                    args.warmup, split, cached).items():
            if args.features and feature not in args.features:
                continue
            rows = [child(c) for c in configs]
            results.setdefault(model, {})[feature] = {"without": rows[0], "with": rows[1], **summarise(rows)}
            print(model, feature, json.dumps(results[model][feature].get("peak_change")),
                  json.dumps(results[model][feature].get("speed_change")), flush=True)
    from benchmarks.gpu_common import write

    suffix = "_".join(args.features) if args.features else "all"
    write(f"memory_features_b{args.batch}_d{args.doc_len}_{suffix}", {
        "settings": {"batch": args.batch, "query_len": 32, "doc_len": args.doc_len, "steps": args.steps,
                     "repeats": args.repeats, "warmup": args.warmup, "eval_interval_split": args.split,
                     "grad_cache": args.grad_cache, "lora": "r=16 on query,value", "weights": "random, real shapes"},
        "load_avg_before": load_before, "load_avg_after": os.getloadavg(), "results": results,
    }, args.machine, args.out)


FLAGS = {"gradient_checkpointing": "--memory.gradient_checkpointing true",
         "bf16": "--memory.compute_dtype bfloat16", "eval_interval": "--train.eval_interval 4",
         "eval_micro_batches": "--memory.eval_micro_batches true", "profile_memory": "--profile-memory",
         "grad_cache": "--train.grad_cache true"}


def results_section() -> list[str]:
    """Each speed / memory option of the retriever recipe with and without (cpu/memory_features_*.json)."""
    rows = []
    for path in sorted((RESULTS / "cpu").glob("memory_features_*.json")):
        m = json.loads(path.read_text())
        busy = max(m["load_avg_before"][0], m["load_avg_after"][0]) > 3.0
        for model, features in m["results"].items():
            for name, v in features.items():
                a, b = v["without"], v["with"]
                shape = f"{a['micro']} x {a['accum']}" if (a["micro"], a["accum"]) == (b["micro"], b["accum"]) else \
                    f"{a['micro']} x {a['accum']} -> {b['micro']} x {b['accum']} as one contrastive batch"
                rows.append(f"| `{FLAGS.get(name, name)}` | {model}, {shape}, documents of {a['doc_len']} "
                            f"| {a['peak_mb']:,.0f} -> {b['peak_mb']:,.0f} | {a['activation_peak_mb']:,.0f} -> "
                            f"{b['activation_peak_mb']:,.0f} | {a['samples_per_s']:.1f} -> {b['samples_per_s']:.1f}"
                            f"{' (shared CPU: noisy)' if busy else ''} |")
    if not rows:
        return []
    return ["### Speed and memory options of the retriever recipe (cpu; benchmarks/memory_features.py)", "",
            "| option | model, micro-batch x accumulation | peak MB without -> with | activations MB "
            "| samples/s |", "|---|---|---|---|---|", *rows, ""]


if __name__ == "__main__":
    main()
