"""Rollout generation: MLX's decode engines (`mlxio.rl.rollout.generate_group`: "batch",
mlx-lm's BatchGenerator; "static", `mlxio.rl.decode` over `mlxcore.models.decode_step`'s compiled fixed-shape step, with
`mlxcore.models.decode_fused`'s forward; "static-generic", the same engine with the mlx-lm forward, as
it was before the fused one) vs PyTorch transformers `generate`, the same weights, sampling at
temperature 1.

Models: the SmolLM2-135M shape (Llama) and the Qwen2.5-0.5B shape (Qwen2), random weights (the
GPU machine has no model files; speed does not depend on the values), bf16; and scaled-down
shapes for a CPU (`qwen2-24l-tiny`: Qwen's 24 layers at width 128, where a decode step is all
per-op overhead as on a GPU; `llama-tiny`). Batch 64 is 8 prompts x 8 completions (`--batches
1` adds 1 prompt x 1); prompts of `--prompt-len` random tokens, exactly `--new-tokens` new
tokens (no stop token, so every run decodes the same count). tokens/s = generated tokens / wall
seconds, prefill included. The memory-bandwidth bound per decode step reads every weight once
(bf16) plus the KV cache: tokens/s <= batch x BW / bytes.

Before timing, both engines decode the same prompts greedily: `greedy.identical_rows` is the
share of rows with the same tokens, and every token either engine picked is checked against a
teacher-forced forward pass (no KV cache; a third computation): its logit must be within
`--greedy-tol` of the maximum (bf16 rounding can flip near-ties, after which two correct greedy
decoders part ways). A row where either engine picks a token further from the argmax marks the
pair invalid (`valid: false`), and its speeds are not comparable. `graph` counts the primitives
one decode step queues (export_to_dot of the step's unevaluated graph; views - reshape,
transpose, broadcast, ... - listed apart): the work the host dispatches per token
(`dev.decode_graph` counts it per layer);
`greedy.attention_shapes_*` the distinct (query, key) shapes each engine's greedy run built
attention with (prefill chunks included; the static step is traced once per call).

    python -m benchmarks.generation --machine h100 --new-tokens 256 --torch-repeats 0
    python -m benchmarks.generation --machine cpu --shapes qwen2-24l-tiny --dtype float32 --torch-repeats 0
"""

from __future__ import annotations

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # first: MLX's CPU BLAS is chosen when mlx.core loads (mlxio.runtime)

import argparse
import contextlib
import os
import re
import sys
import tempfile
import time
import types
from collections import Counter

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

from benchmarks.common import fmt

SHAPES = {
    "smollm2-135m": dict(model_type="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536,
                         num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                         rms_norm_eps=1e-5, rope_theta=100000.0, max_position_embeddings=8192,
                         tie_word_embeddings=True, head_dim=64),
    "qwen2.5-0.5b": dict(model_type="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864,
                         num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                         rms_norm_eps=1e-6, rope_theta=1000000.0, max_position_embeddings=32768,
                         tie_word_embeddings=True, head_dim=64),
    # Qwen/Qwen2.5-Coder-1.5B-Instruct and -3B-Instruct (config.json; tied embeddings)
    "qwen2.5-coder-1.5b": dict(model_type="qwen2", vocab_size=151936, hidden_size=1536, intermediate_size=8960,
                               num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                               rms_norm_eps=1e-6, rope_theta=1000000.0, max_position_embeddings=32768,
                               tie_word_embeddings=True, head_dim=128),
    "qwen2.5-coder-3b": dict(model_type="qwen2", vocab_size=151936, hidden_size=2048, intermediate_size=11008,
                             num_hidden_layers=36, num_attention_heads=16, num_key_value_heads=2,
                             rms_norm_eps=1e-6, rope_theta=1000000.0, max_position_embeddings=32768,
                             tie_word_embeddings=True, head_dim=128),
    "qwen2-24l-tiny": dict(model_type="qwen2", vocab_size=4096, hidden_size=128, intermediate_size=384,
                           num_hidden_layers=24, num_attention_heads=2, num_key_value_heads=1,
                           rms_norm_eps=1e-6, rope_theta=1000000.0, max_position_embeddings=32768,
                           tie_word_embeddings=True, head_dim=64),
    "qwen2-24l-micro": dict(model_type="qwen2", vocab_size=1024, hidden_size=64, intermediate_size=128,
                            num_hidden_layers=24, num_attention_heads=1, num_key_value_heads=1,
                            rms_norm_eps=1e-6, rope_theta=1000000.0, max_position_embeddings=32768,
                            tie_word_embeddings=True, head_dim=64),
    "llama-tiny": dict(model_type="llama", vocab_size=4096, hidden_size=192, intermediate_size=512,
                       num_hidden_layers=6, num_attention_heads=3, num_key_value_heads=1,
                       rms_norm_eps=1e-5, rope_theta=100000.0, max_position_embeddings=8192,
                       tie_word_embeddings=True, head_dim=64),
}
GPU_SHAPES = ["qwen2.5-0.5b"]
VIEWS = {"Reshape", "Transpose", "ExpandDims", "Squeeze", "Broadcast", "AsStrided", "Slice", "Flatten",
         "Unflatten", "StopGradient"}


class IdTokenizer:
    """Prompts are space-separated token ids (random-weight models have no vocabulary); no EOS,
    so every sequence decodes exactly max_new_tokens."""

    eos_token_ids: set = set()

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in text.split()]

    def decode(self, ids) -> str:
        return " ".join(map(str, ids))


def torch_model(shape: str, device: str, dtype: str = "bfloat16"):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = dict(SHAPES[shape])
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    return model.to(device).eval()


def mlx_model(torch_model, shape: str, dtype: str = "bfloat16"):
    """mlx-lm's model class for the shape, loaded with the torch model's weights."""
    from mlx_lm.utils import _get_classes

    model_class, args_class = _get_classes(config=dict(SHAPES[shape]))
    model = model_class(args_class.from_dict(dict(SHAPES[shape])))
    weights = {k: mx.array(v.detach().float().cpu().numpy()).astype(getattr(mx, dtype))
               for k, v in torch_model.state_dict().items()}
    weights = model.sanitize(weights) if hasattr(model, "sanitize") else weights
    model.load_weights(list(weights.items()))
    mx.eval(model.parameters())
    return model


ENGINES = ("batch", "static", "static-generic")


@contextlib.contextmanager
def engine_mode(engine: str):
    """generate_group's engine name for `engine`; the static engines' decode with the fused step
    ("static", on the CPU too, where it is not the default) or the mlx-lm forward
    ("static-generic": `mlxio.rl.decode.decode(fused=False)`)."""
    from mlxio.rl import decode

    if engine not in ("static", "static-generic"):
        yield engine
        return
    real, fused = decode.decode, engine == "static"
    decode.decode = lambda *a, **k: real(*a, **(k | {"fused": fused}))
    try:
        yield "static"
    finally:
        decode.decode = real


def run_mlx(model, prompts: list[list[int]], group: int, new_tokens: int, engine: str,
            temperature: float = 1.0) -> dict:
    from mlxio.rl.rollout import generate_group

    policy = types.SimpleNamespace(model=model, tokenizer=IdTokenizer())
    texts = [" ".join(map(str, p)) for p in prompts]
    start = time.perf_counter()
    with engine_mode(engine) as name:
        ro = generate_group(policy, texts, group_size=group, max_new_tokens=new_tokens,
                            use_chat_template=False, engine=name, temperature=temperature)
    seconds = time.perf_counter() - start
    tokens = sum(map(len, ro.completion_tokens))
    out = {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds, "rollouts": ro}
    if ro.decode_stats:
        steps = ro.decode_stats["steps"]
        out["host_call_ms_per_step"] = 1e3 * ro.decode_stats["call_s"] / steps
        out["host_queue_ms_per_step"] = 1e3 * ro.decode_stats["queue_s"] / steps
        out["host_syncs_per_step"] = ro.decode_stats["syncs"] / steps
    return out


def reference_gaps(model, prompts: list[list[int]], completions: list[list[int]], rows: int = 8) -> np.ndarray:
    """Per completion token, max logit - the token's logit, by one teacher-forced forward pass
    without a KV cache (rows at a time): 0 where the token is the argmax."""
    gaps = []
    for start in range(0, len(prompts), rows):
        seqs = [p + c for p, c in zip(prompts[start:start + rows], completions[start:start + rows], strict=True)]
        if len({len(t) for t in seqs}) != 1:
            raise ValueError("reference_gaps needs rows of one length (no stop token)")
        ids = mx.array(seqs)
        first = len(prompts[start]) - 1
        logits = model(ids[:, :-1])[:, first:].astype(mx.float32)
        picked = mx.take_along_axis(logits, ids[:, first + 1:, None], axis=-1)[..., 0]
        gaps.append(np.array(logits.max(axis=-1) - picked))
    return np.concatenate(gaps)


@contextlib.contextmanager
def attention_shapes(model):
    """The distinct (query, key) shapes the model's attention is built with meanwhile (prefill
    included): a decode step whose key length changes is a new shape every token."""
    module = sys.modules[type(model).__module__]
    sdpa = module.scaled_dot_product_attention
    seen = set()

    def spy(queries, keys, *args, **kwargs):
        seen.add((tuple(queries.shape), tuple(keys.shape)))
        return sdpa(queries, keys, *args, **kwargs)

    module.scaled_dot_product_attention = spy
    try:
        yield seen
    finally:
        module.scaled_dot_product_attention = sdpa


def greedy_check(model, prompts: list[list[int]], group: int, new_tokens: int, tol: float,
                 engines: tuple[str, ...] = ENGINES) -> dict:
    """The engines' greedy tokens for the same prompts, compared with each other ("static" with
    "batch" and "static-generic") and with the teacher-forced argmax (see the module doc)."""
    tokens, out = {}, {"tokens": new_tokens, "tol": tol}
    distinct = list(range(0, len(prompts) * group, group))  # greedy copies of one prompt are the same
    per_row = [prompts[i // group] for i in distinct]
    for engine in engines:
        with attention_shapes(model) as shapes:
            tokens[engine] = run_mlx(model, prompts, group, new_tokens, engine, temperature=0.0)["rollouts"].completion_tokens
        gap = reference_gaps(model, per_row, [tokens[engine][i] for i in distinct])
        out |= {f"max_gap_{engine}": float(gap.max()), f"tokens_off_argmax_{engine}": int((gap > tol).sum()),
                f"attention_shapes_{engine}": len(shapes)}
    out["rows"] = len(tokens["static"])
    for other in (e for e in engines if e != "static"):
        a, b = tokens[other], tokens["static"]
        common = [next((k for k, (x, y) in enumerate(zip(r, s, strict=True)) if x != y), len(r))
                  for r, s in zip(a, b, strict=True)]
        suffix = "" if other == "batch" else f"_{other}"
        out[f"identical_rows{suffix}"] = float(np.mean([x == y for x, y in zip(a, b, strict=True)]))
        out[f"mean_common_prefix{suffix}"] = float(np.mean(common))
    out["valid"] = all(out[f"max_gap_{e}"] <= tol for e in engines)
    return out


def graph_nodes(outputs: list[mx.array]) -> dict:
    """Primitives in the unevaluated graph of `outputs` (export_to_dot), views apart."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "g.dot")
        mx.export_to_dot(path, *outputs)
        labels = re.findall(r'label ="(\w+)", shape=rectangle', open(path).read())
    kinds = Counter(labels)
    views = sum(v for k, v in kinds.items() if k in VIEWS)
    return {"primitives": len(labels), "views": views, "non_view": len(labels) - views,
            "kinds": dict(kinds.most_common())}


def step_graphs(model, prompts: list[list[int]], group: int) -> dict:
    """One decode step's graph, as each engine builds it: "batch" (mlx-lm's GenerationBatch._step
    on a BatchKVCache, plus the per-row log-probability picks `generate_group` makes), "static"
    (the compiled fused step, `mlxcore.models.decode_fused`) and "static-generic" (the compiled mlx-lm
    forward on StaticKVCache); host_build_ms: host time to build it (the
    forward + sampling + per-row split; the compiled step's call), not evaluating it."""
    from mlx_lm.models.cache import BatchKVCache
    from mlx_lm.sample_utils import make_sampler

    from mlxcore.models import decode_step
    from mlxcore.train import buckets
    from mlxio.rl import decode
    from mlxio.rl.rollout import _prefill

    sampler = make_sampler(temp=1.0)
    mx.eval(mx.random.state)  # (else the graph holds every lazy key split since the start)
    per_row = [_prefill(model, p[:-1], True) for p in prompts for _ in range(group)]
    x = mx.array([p[-1] for p in prompts for _ in range(group)], mx.uint32)
    batch = [BatchKVCache.merge(list(layer)) for layer in zip(*per_row, strict=True)]
    mx.eval([(c.keys, c.values, c.offset, c.left_padding) for c in batch])
    start = time.perf_counter()
    logits = model(x[:, None], cache=batch)[:, -1, :]
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    tokens = sampler(logprobs)
    rows = list(logprobs)  # (GenerationBatch._step's per-row split)
    build_old = time.perf_counter() - start
    old = graph_nodes([tokens, *rows, *[c.keys for c in batch], *[c.values for c in batch]])
    mx.eval(tokens, rows)
    picks = graph_nodes([mx.stack([row[t] for row, t in zip(rows, tokens.tolist(), strict=True)])])
    old = {k: old[k] + picks[k] for k in ("primitives", "views", "non_view")} | {
        "kinds": dict(Counter(old["kinds"]) + Counter(picks["kinds"]))}
    out = {"batch": old}
    for engine, fused in (("static", True), ("static-generic", False)):
        caches = decode_step.static_cache(per_row, buckets.cache_length(max(map(len, prompts)) - 1, 8))
        step, states = decode.step_and_state(model, sampler, caches, None, fused)
        mx.eval(states)
        mx.eval(step(x, states))  # (the first call traces and compiles)
        start = time.perf_counter()
        nxt, lp, states = step(x, states)
        build = time.perf_counter() - start
        out[engine] = graph_nodes([nxt, lp, *[a for _, a in tree_flatten(states)]])
        out[engine]["host_build_ms"] = 1e3 * build
        mx.eval(nxt, lp, states)
    old["host_build_ms"] = 1e3 * build_old
    return out


def run_torch(model, prompts: list[list[int]], group: int, new_tokens: int, device: str) -> dict:
    import torch

    ids = torch.tensor([p for p in prompts for _ in range(group)], device=device)
    torch.manual_seed(0)
    torch.cuda.synchronize() if device == "cuda" else None
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True,
                             temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, pad_token_id=0)
    torch.cuda.synchronize() if device == "cuda" else None
    seconds = time.perf_counter() - start
    tokens = int((out.shape[1] - ids.shape[1]) * out.shape[0])
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds}


def bandwidth_bound(model, batch: int, context: int, bandwidth: float, dtype_bytes: int = 2) -> float:
    """tokens/s if each decode step only read the weights once and the KV cache."""
    cfg = model.config
    weights = sum(p.numel() for p in model.parameters()) * dtype_bytes
    kv = batch * context * cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * (
        cfg.hidden_size // cfg.num_attention_heads) * dtype_bytes
    return batch * bandwidth / (weights + kv)


def payload(args, device: str, results: list[dict]) -> dict:
    return {"settings": {"dtype": args.dtype, "weights": "random (shape only)", "sampling": "temperature 1",
                         "bandwidth_bytes_per_s": args.bandwidth, "torch_device": device,
                         "mlx_device": str(mx.default_device()), "repeats": args.repeats,
                         "torch_repeats": args.torch_repeats, "greedy_tol": args.greedy_tol,
                         "layers_override": args.layers,
                         "engines": {"batch": "mlx-lm BatchGenerator (generate_group engine='batch')",
                                     "static": "mlxio.rl.decode compiled fixed-shape step (engine='static'), "
                                               "mlxcore.decode_fused forward",
                                     "static-generic": "the same static engine on the mlx-lm forward "
                                                       "(decode(fused=False); the engine before decode_fused)"},
                         "torch_generate": "transformers generate, default dynamic KV cache"},
            "runs": results}


def say(start: float, tag: str, what: str) -> None:
    print(f"[{time.perf_counter() - start:6.1f} s] {tag}: {what}", flush=True)


def median(runs: list[dict], key: str = "tokens_per_s") -> float:
    return float(np.median([r[key] for r in runs]))


def main(argv=None):
    from benchmarks.gpu_common import write

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--machine", default="h100")
    ap.add_argument("--out", default=None, help="write the JSON here (default benchmarks/results/<machine>/)")
    ap.add_argument("--shapes", nargs="+", default=GPU_SHAPES, choices=list(SHAPES))
    ap.add_argument("--batches", nargs="+", type=int, default=[64], choices=[1, 64])
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--bandwidth", type=float, default=3.35e12, help="device memory bytes/s (H100 SXM)")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs of each MLX engine")
    ap.add_argument("--layers", type=int, default=None,
                    help="override the shapes' layer count (a quick CPU check of a real shape's heads / vocab)")
    ap.add_argument("--torch-repeats", type=int, default=2, help="timed torch runs (0: no torch)")
    ap.add_argument("--engines", nargs="+", default=list(ENGINES), choices=ENGINES,
                    help="MLX engines to time (batch and static always)")
    ap.add_argument("--greedy-tol", type=float, default=None,
                    help="logit distance from the argmax a greedy token may have (default: 0.125 in "
                         "half precision, 1e-3 in float32)")
    args = ap.parse_args(argv)
    engines = tuple(e for e in ENGINES if e in {"batch", "static", *args.engines})
    if args.layers:
        for name in args.shapes:
            SHAPES[name] = SHAPES[name] | {"num_hidden_layers": args.layers}
    if args.greedy_tol is None:
        args.greedy_tol = 1e-3 if args.dtype == "float32" else 0.125
    tol = args.greedy_tol
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    rng = np.random.default_rng(0)
    results = []
    for shape in args.shapes:
        tm = torch_model(shape, device, args.dtype)
        mm = mlx_model(tm, shape, args.dtype)
        vocab = SHAPES[shape]["vocab_size"]
        prompts = rng.integers(100, vocab, (8, args.prompt_len)).tolist()
        for label, ps, group in (("batch1", prompts[:1], 1), ("batch64", prompts, 8)):
            batch = len(ps) * group
            if batch not in args.batches:
                continue
            t0 = time.perf_counter()
            tag = f"{shape} b{batch}"
            warm = {}
            for engine in engines:  # first calls: kernels compile (minutes on a fresh GPU)
                warm[engine] = run_mlx(mm, ps, group, args.new_tokens, engine)["seconds"]
                say(t0, tag, f"{engine} warm-up {warm[engine]:.1f} s")
            row = {"shape": shape, "batch": batch, "label": label, "new_tokens": args.new_tokens,
                   "prompt_len": args.prompt_len, "dtype": args.dtype, "warmup_seconds": warm}
            row["greedy"] = greedy_check(mm, ps, group, args.new_tokens, tol, engines)
            row["valid"] = row["greedy"]["valid"]
            say(t0, tag, f"greedy check {row['greedy']}")
            row["graph"] = step_graphs(mm, ps, group)
            runs = {}
            for _ in range(args.repeats):  # interleaved: drift hits both engines alike
                for engine in engines:
                    runs.setdefault(engine, []).append(run_mlx(mm, ps, group, args.new_tokens, engine))
            for engine, rs in runs.items():
                row[f"{engine}_tokens_per_s"] = [r["tokens_per_s"] for r in rs]
                row[f"{engine}_median"] = median(rs)
            row["static_over_batch"] = row["static_median"] / row["batch_median"]
            if "static-generic" in runs:
                row["static_over_generic"] = row["static_median"] / row["static-generic_median"]
            for engine in (e for e in engines if e.startswith("static")):
                for what in ("host_call_ms_per_step", "host_queue_ms_per_step", "host_syncs_per_step"):
                    row[f"{engine}_{what}"] = median(runs[engine], what)
            row["ms_per_step"] = {e: 1e3 * batch / row[f"{e}_median"] for e in runs}
            row["bandwidth_bound_tokens_per_s"] = bandwidth_bound(
                tm, batch, args.prompt_len + args.new_tokens // 2, args.bandwidth,
                4 if args.dtype == "float32" else 2)
            row["static_share_of_bound"] = row["static_median"] / row["bandwidth_bound_tokens_per_s"]
            say(t0, tag, ", ".join(f"{e} {row[f'{e}_median']:.0f} tok/s" for e in engines)
                + f" (static / batch {row['static_over_batch']:.2f}x), valid={row['valid']}")
            write("generation", payload(args, device, results + [row]), args.machine, args.out)  # before torch
            if args.torch_repeats:
                run_torch(tm, ps, group, 8, device)  # warm-up
                t = [run_torch(tm, ps, group, args.new_tokens, device) for _ in range(args.torch_repeats)]
                row["torch_tokens_per_s"] = [x["tokens_per_s"] for x in t]
                row["torch_median"] = median(t)
                row["static_over_torch"] = row["static_median"] / row["torch_median"]
                row["batch_over_torch"] = row["batch_median"] / row["torch_median"]
                say(t0, tag, f"torch {row['torch_median']:.0f} tok/s")
            row["seconds"] = time.perf_counter() - t0
            results.append(row)
            print({k: v for k, v in row.items() if not isinstance(v, (list, dict))}, flush=True)
            print({"graph": {e: {k: v for k, v in g.items() if k != "kinds"} for e, g in row["graph"].items()}},
                  flush=True)
            write("generation", payload(args, device, results), args.machine, args.out)  # keep partial results
        del tm, mm
        mx.clear_cache()
        torch.cuda.empty_cache() if device == "cuda" else None
    return write("generation", payload(args, device, results), args.machine, args.out)


def results_section(machine: str, data: dict, bars: list) -> list[str]:
    """Rollout generation: mlx-lm's BatchGenerator ("batch", the old path) vs the static engine
    (mlxio.rl.decode with mlxcore.models.decode_fused's step; "static-generic": the same engine with the
    mlx-lm forward, the static engine before the fused step) vs transformers generate, in one run
    on the same weights."""
    def ratio(x):
        return "-" if x is None else f"{fmt(x, 2)}x"

    out = [f"### Rollout generation, {machine} (bf16, random weights of the shape; benchmarks/generation.py)", "",
           "| model shape | batch | MLX static tok/s | MLX static, generic step tok/s | MLX batch (mlx-lm) tok/s "
           "| static / batch | static / generic step | transformers generate tok/s | static / torch "
           "| bandwidth bound tok/s | static share of bound | greedy check |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in data["runs"]:
        out.append(f"| {r['shape']} | {r['batch']} | {fmt(r['static_median'])} | {fmt(r.get('static-generic_median'))} "
                   f"| {fmt(r['batch_median'])} | {ratio(r['static_over_batch'])} | {ratio(r.get('static_over_generic'))} "
                   f"| {fmt(r.get('torch_median'))} | {ratio(r.get('static_over_torch'))} "
                   f"| {fmt(r['bandwidth_bound_tokens_per_s'])} | {fmt(r['static_share_of_bound'] * 100, 1)}% "
                   f"| {'valid' if r.get('valid') else 'INVALID'} |")
        if r.get("static_over_torch"):
            bars.append((f"{machine} gen {r['shape']} b{r['batch']}", r["static_over_torch"]))
    r = data["runs"][0]
    out += ["", f"Per decode step of the static engine: {fmt((r.get('ms_per_step') or {}).get('static'), 1)} ms, "
            f"of which {fmt(r.get('static_host_queue_ms_per_step'), 1)} ms host time queueing its kernels and "
            f"{fmt(r.get('static_host_call_ms_per_step'), 1)} ms calling the compiled step; "
            f"{r.get('static_host_syncs_per_step')} host syncs per step."]
    return out + [""]


if __name__ == "__main__":
    main()
