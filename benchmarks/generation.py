"""Rollout generation on the GPU: MLX (`mlxio.rl.rollout.generate_group`, mlx-lm's BatchGenerator)
vs PyTorch transformers `generate`, same weights, bf16, sampling at temperature 1.

Models: the SmolLM2-135M shape (Llama) and the Qwen2.5-0.5B shape (Qwen2), random weights (the
GPU machine has no model files; speed does not depend on the values). Batch 1 (1 prompt x 1)
and batch 64 (8 prompts x 8 completions), prompts of `--prompt-len` random tokens, exactly
`--new-tokens` new tokens (no stop token, so every run decodes the same count). tokens/s =
generated tokens / wall seconds, prefill included. The memory-bandwidth bound per decode step
reads every weight once (bf16) plus the KV cache: tokens/s <= batch x BW / bytes.

    python -m benchmarks.generation --machine h100 --new-tokens 256
"""

from __future__ import annotations

# isort: off
import mlxio  # noqa: F401
# isort: on

import argparse
import time
import types

import mlx.core as mx
import numpy as np

SHAPES = {
    "smollm2-135m": dict(model_type="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536,
                         num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                         rms_norm_eps=1e-5, rope_theta=100000.0, max_position_embeddings=8192,
                         tie_word_embeddings=True, head_dim=64),
    "qwen2.5-0.5b": dict(model_type="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864,
                         num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                         rms_norm_eps=1e-6, rope_theta=1000000.0, max_position_embeddings=32768,
                         tie_word_embeddings=True, head_dim=64),
}


class IdTokenizer:
    """Prompts are space-separated token ids (random-weight models have no vocabulary); no EOS,
    so every sequence decodes exactly max_new_tokens."""

    eos_token_ids: set = set()

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in text.split()]

    def decode(self, ids) -> str:
        return " ".join(map(str, ids))


def torch_model(shape: str, device: str):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = dict(SHAPES[shape])
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    return model.to(device).eval()


def mlx_model(torch_model, shape: str):
    """mlx-lm's model class for the shape, loaded with the torch model's weights."""
    from mlx_lm.utils import _get_classes

    model_class, args_class = _get_classes(config=dict(SHAPES[shape]))
    model = model_class(args_class.from_dict(dict(SHAPES[shape])))
    weights = {k: mx.array(v.detach().float().cpu().numpy()).astype(mx.bfloat16)
               for k, v in torch_model.state_dict().items()}
    weights = model.sanitize(weights) if hasattr(model, "sanitize") else weights
    model.load_weights(list(weights.items()))
    mx.eval(model.parameters())
    return model


def run_mlx(model, prompts: list[list[int]], group: int, new_tokens: int) -> dict:
    from mlxio.rl.rollout import generate_group

    policy = types.SimpleNamespace(model=model, tokenizer=IdTokenizer())
    texts = [" ".join(map(str, p)) for p in prompts]
    start = time.perf_counter()
    ro = generate_group(policy, texts, group_size=group, max_new_tokens=new_tokens,
                        use_chat_template=False)
    seconds = time.perf_counter() - start
    tokens = sum(map(len, ro.completion_tokens))
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds}


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


def bandwidth_bound(model, batch: int, context: int, bandwidth: float) -> float:
    """tokens/s if each decode step only read the bf16 weights once and the KV cache."""
    cfg = model.config
    weights = sum(p.numel() for p in model.parameters()) * 2
    kv = batch * context * cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * (
        cfg.hidden_size // cfg.num_attention_heads) * 2
    return batch * bandwidth / (weights + kv)


def payload(args, device: str, results: list[dict]) -> dict:
    return {"settings": {"dtype": "bfloat16", "weights": "random (shape only)", "sampling": "temperature 1",
                         "bandwidth_bytes_per_s": args.bandwidth, "torch_device": device,
                         "mlx_device": str(mx.default_device()), "repeats": args.repeats,
                         "torch_generate": "transformers generate, default dynamic KV cache"},
            "runs": results}


def main(argv=None):
    import torch

    from benchmarks.gpu_common import write

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--machine", default="h100")
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--bandwidth", type=float, default=3.35e12, help="device memory bytes/s (H100 SXM)")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    rng = np.random.default_rng(0)
    results = []
    for shape in args.shapes:
        tm = torch_model(shape, device)
        mm = mlx_model(tm, shape)
        vocab = SHAPES[shape]["vocab_size"]
        prompts = rng.integers(100, vocab, (8, args.prompt_len)).tolist()
        for label, ps, group in (("batch1", prompts[:1], 1), ("batch64", prompts, 8)):
            batch = len(ps) * group
            run_mlx(mm, ps, group, 8)  # warm-up (kernels, graph shapes)
            run_torch(tm, ps, group, 8, device)
            m = [run_mlx(mm, ps, group, args.new_tokens) for _ in range(args.repeats)]
            t = [run_torch(tm, ps, group, args.new_tokens, device) for _ in range(args.repeats)]
            row = {"shape": shape, "batch": batch, "label": label, "new_tokens": args.new_tokens,
                   "prompt_len": args.prompt_len,
                   "mlx_tokens_per_s": [x["tokens_per_s"] for x in m],
                   "torch_tokens_per_s": [x["tokens_per_s"] for x in t],
                   "bandwidth_bound_tokens_per_s": bandwidth_bound(
                       tm, batch, args.prompt_len + args.new_tokens // 2, args.bandwidth)}
            row["mlx_median"] = float(np.median(row["mlx_tokens_per_s"]))
            row["torch_median"] = float(np.median(row["torch_tokens_per_s"]))
            row["mlx_over_torch"] = row["mlx_median"] / row["torch_median"]
            row["mlx_share_of_bound"] = row["mlx_median"] / row["bandwidth_bound_tokens_per_s"]
            results.append(row)
            print({k: v for k, v in row.items() if not isinstance(v, list)}, flush=True)
            write("generation", payload(args, device, results), args.machine)  # keep partial results
        del tm, mm
        mx.clear_cache()
        torch.cuda.empty_cache() if device == "cuda" else None
    return write("generation", payload(args, device, results), args.machine)


if __name__ == "__main__":
    main()
