"""The retriever step's two implementations, built from ONE set of weights, for the benchmarks.

MLX side: the recipe's own pieces (`mlxcore.retrieval.objective.contrastive_loss_fn`, `mlxcore.train.lora`,
`mlxcore.train.step.make_train_step`). PyTorch side: the transformers model (T5EncoderModel /
BertModel) with LoRA through PEFT (hand LoRA with the same math when PEFT is missing), the same
MaxSim + InfoNCE + margin loss written in torch. The torch model is created first (random init
for the T5-base / XTR-base shape, real all-MiniLM-L6-v2 weights where the package is installed)
and its state dict is converted into the MLX params tree, so both start from identical weights
and identical LoRA A matrices (B = 0).

Batches: real (docstring sentence, function source) pairs mined from the interpreter's stdlib,
tokenized once with the MiniLM tokenizer and padded to exactly query 32 / document 256 tokens,
cached as .gpu/bench/pairs.npz (carried to the GPU machine, which has no tokenizer files).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

DATA = Path(os.environ.get("BENCH_DATA", Path(__file__).resolve().parent.parent / ".gpu" / "bench"))
QUERY_LEN, DOC_LEN = 32, 256

# T5-base == XTR-base encoder shape (XTR adds a 768 -> 128 bias-free projection).
T5_BASE = dict(vocab_size=32128, d_model=768, d_kv=64, d_ff=3072, num_layers=12, num_heads=12,
               feed_forward_proj="relu", dropout_rate=0.0)
MINILM = dict(vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
              intermediate_size=1536, hidden_act="gelu", max_position_embeddings=512,
              type_vocab_size=2, layer_norm_eps=1e-12, hidden_dropout_prob=0.0,
              attention_probs_dropout_prob=0.0, pad_token_id=0)
# Tiny shapes (random weights) for the CPU test of the agreement check (tests/benchmarks/test_bench_agreement.py).
T5_TINY = dict(T5_BASE, vocab_size=512, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4)
BERT_TINY = dict(MINILM, vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=128, max_position_embeddings=128)
MODELS = ("t5-base", "minilm")
TINY = {"t5-tiny": T5_TINY, "bert-tiny": BERT_TINY}
LORA_RANK, LORA_ALPHA = 16, 32.0
TARGETS = {"t5-base": ("q", "v"), "minilm": ("query", "value"), "t5-tiny": ("q", "v"),
           "bert-tiny": ("query", "value")}


# ----------------------------------------------------------------------------- data


def pair_batches(n: int) -> dict[str, np.ndarray]:
    """n (query, code) pairs as {query_ids [n, 32], query_mask, doc_ids [n, 256], doc_mask} int32."""
    path = DATA / "pairs.npz"
    if not path.is_file():
        build_pairs(path)
    data = dict(np.load(path))
    total = len(data["query_ids"])
    rows = np.arange(n) % total  # wrap around when more rows are asked for than mined
    return {k: v[rows] for k, v in data.items()}


def synthetic_pairs(n: int, vocab: int, query_len: int, doc_len: int, seed: int = 0) -> dict[str, np.ndarray]:
    """n random (query, document) id rows with random real lengths (>= 2), right-padded with 0:
    the same arrays for both frameworks, for tiny models whose vocabulary MiniLM's ids exceed."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, width in (("query", query_len), ("doc", doc_len)):
        ids = rng.integers(1, vocab, size=(n, width)).astype(np.int32)
        lengths = rng.integers(2, width + 1, size=n)
        mask = (np.arange(width)[None, :] < lengths[:, None]).astype(np.int32)
        out[f"{name}_ids"], out[f"{name}_mask"] = ids * mask, mask
    return out


def build_pairs(path: Path, limit: int = 4096) -> None:
    """Mine stdlib pairs, tokenize with MiniLM's tokenizer at fixed widths, save an npz."""
    from mlxio.data.pairs import mine_pairs
    from mlxio.weights.encoders import default_encoder_path, load_tokenizer

    pairs = mine_pairs()
    picks = np.random.default_rng(0).permutation(len(pairs))[:limit]
    pairs = [pairs[i] for i in sorted(picks)]
    tok = load_tokenizer(default_encoder_path(), "bert")
    out = {}
    for name, texts, width in (("query", [p.query for p in pairs], QUERY_LEN),
                               ("doc", [p.code for p in pairs], DOC_LEN)):
        tok.enable_truncation(width)
        ids = np.zeros((len(texts), width), np.int32)
        for row, enc in enumerate(tok.encode_batch(texts)):
            ids[row, : len(enc.ids)] = enc.ids
        out[f"{name}_ids"], out[f"{name}_mask"] = ids, (ids != 0).astype(np.int32)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, **out)


# ----------------------------------------------------------------------------- torch model


def torch_model(name: str, seed: int = 0):
    """(encoder nn.Module, projection nn.Linear | None, real_weights: bool), float32, eval mode."""
    import torch
    from transformers import BertConfig, BertModel, T5Config, T5EncoderModel

    torch.manual_seed(seed)
    if name == "t5-tiny":
        return T5EncoderModel(T5Config(**T5_TINY)).eval(), torch.nn.Linear(64, 32, bias=False), False
    if name == "bert-tiny":
        return BertModel(BertConfig(**BERT_TINY), add_pooling_layer=False).eval(), None, False
    if name == "t5-base":
        model = T5EncoderModel(T5Config(**T5_BASE))
        projection = torch.nn.Linear(768, 128, bias=False)
        return model.eval(), projection, False
    if name != "minilm":
        raise ValueError(f"model {name!r}: choose from {MODELS}")
    real = False
    try:
        from mlxio.weights.encoders import default_encoder_path

        path = default_encoder_path()
        model = BertModel.from_pretrained(str(path), add_pooling_layer=False, attn_implementation="sdpa",
                                          hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        real = True
    except Exception:  # the GPU machine has no weights package: same shape, random weights
        model = BertModel(BertConfig(**MINILM), add_pooling_layer=False)
    return model.eval(), None, real


def mlx_params(model, projection) -> dict:
    """The MLX params tree (HF-keyed, float32) holding the torch model's current weights."""
    import mlx.core as mx

    from mlxcore.train.tree import unflatten
    from mlxio.weights.encoders import sanitize

    kind = "t5" if model.config.model_type == "t5" else "bert"
    weights = {k: mx.array(v.detach().float().cpu().numpy()) for k, v in model.state_dict().items()}
    weights = sanitize(weights, kind)
    if projection is not None:
        weights["projection.weight"] = mx.array(projection.weight.detach().float().cpu().numpy())
    return unflatten(weights)


def encoder_spec(model):
    from mlxcore.models import bert, t5
    from mlxcore.retrieval.encoder import EncoderSpec

    cfg = model.config.to_dict()
    if model.config.model_type == "t5":
        return EncoderSpec(kind="t5", model=t5.T5Config.from_hf(cfg), lora_scale=LORA_ALPHA / LORA_RANK)
    return EncoderSpec(kind="bert", model=bert.BertConfig.from_hf(cfg), lora_scale=LORA_ALPHA / LORA_RANK)


def copy_adapters_into_peft(wrapped, adapters_flat: dict[str, np.ndarray]) -> None:
    """Set a PEFT model's adapters to MLX's ({layer.lora_a [in, r], layer.lora_b [r, out]},
    layer paths as in the base model): lora_A = a.T [r, in], lora_B = b.T [out, r]."""
    import torch

    with torch.no_grad():
        for layer in {k.rsplit(".", 1)[0] for k in adapters_flat}:
            module = wrapped.base_model.model.get_submodule(layer)
            module.lora_A["default"].weight.copy_(torch.from_numpy(adapters_flat[f"{layer}.lora_a"].T))
            module.lora_B["default"].weight.copy_(torch.from_numpy(adapters_flat[f"{layer}.lora_b"].T))


def add_lora(name: str, model, adapters_flat: dict[str, np.ndarray]):
    """Wrap `model` with LoRA on the targets (PEFT if importable, else hand LoRA), copying the
    MLX adapters ({layer.lora_a [in, r], layer.lora_b [r, out]}). Returns (model, how)."""

    targets = TARGETS[name]
    try:
        from peft import LoraConfig, get_peft_model

        wrapped = get_peft_model(model, LoraConfig(r=LORA_RANK, lora_alpha=LORA_ALPHA, lora_dropout=0.0,
                                                   target_modules=list(targets), bias="none"))
        copy_adapters_into_peft(wrapped, adapters_flat)
        return wrapped, f"peft {__import__('peft').__version__}"
    except ImportError:
        pass
    for p in model.parameters():
        p.requires_grad_(False)
    for layer in {k.rsplit(".", 1)[0] for k in adapters_flat}:
        parent, _, child = layer.rpartition(".")
        base = model.get_submodule(layer)
        setattr(model.get_submodule(parent), child,
                HandLora(base, adapters_flat[f"{layer}.lora_a"], adapters_flat[f"{layer}.lora_b"]))
    return model, "hand LoRA (PEFT not installed)"


def _hand_lora_class():
    import torch

    class _HandLora(torch.nn.Module):
        """y = base(x) + scale * x @ A @ B, A [in, r], B [r, out] (PEFT's math)."""

        def __init__(self, base, a, b):
            super().__init__()
            self.base = base
            self.lora_a = torch.nn.Parameter(torch.from_numpy(np.array(a)))
            self.lora_b = torch.nn.Parameter(torch.from_numpy(np.array(b)))

        def forward(self, x):
            return self.base(x) + (LORA_ALPHA / LORA_RANK) * ((x @ self.lora_a) @ self.lora_b)

    return _HandLora


def HandLora(base, a, b):  # noqa: N802 (a class factory: torch is imported lazily)
    return _hand_lora_class()(base, a, b)


# ----------------------------------------------------------------------------- torch loss


def torch_embed(model, projection, ids, mask):
    """Unit-norm token embeddings [B, T, D] (as mlxcore.retrieval.encoder.token_embeddings)."""
    import torch

    h = model(input_ids=ids, attention_mask=mask).last_hidden_state
    if projection is not None:
        h = projection(h)
    return torch.nn.functional.normalize(h, dim=-1)


def torch_loss(model, projection, batch, temperature=0.07, margin=0.2, margin_weight=0.1):
    """InfoNCE over in-batch MaxSim scores + margin_weight * hardest-negative margin loss."""
    import torch

    q = torch_embed(model, projection, batch["query_ids"], batch["query_mask"])
    d = torch_embed(model, projection, batch["doc_ids"], batch["doc_mask"])
    sims = torch.einsum("qtd,bsd->qbts", q, d)
    sims = sims.masked_fill(~batch["doc_mask"].bool()[None, :, None, :], -1e9)
    qm = batch["query_mask"].bool()[:, None, :]
    best = sims.max(-1).values.masked_fill(~qm, 0.0)
    scores = best.sum(-1) / qm.sum(-1).clamp(min=1).to(best.dtype)
    n = scores.shape[0]
    eye = torch.eye(n, dtype=torch.bool, device=scores.device)
    logits = scores / temperature
    nce = (torch.logsumexp(logits, -1) - logits.diagonal()).mean()
    hardest = scores.masked_fill(eye, -1e9).max(-1).values
    hinge = torch.clamp(margin - scores.diagonal() + hardest, min=0.0).mean()
    return nce + margin_weight * hinge


# ----------------------------------------------------------------------------- FLOPs


def shape_config(name: str):
    """The transformers config of a benchmark model shape (no weights built)."""
    from transformers import BertConfig, T5Config

    if name in TINY:
        return T5Config(**T5_TINY) if name.startswith("t5") else BertConfig(**BERT_TINY)
    return T5Config(**T5_BASE) if name == "t5-base" else BertConfig(**MINILM)


def step_flops(cfg, batch: int, query_len: int = QUERY_LEN, doc_len: int = DOC_LEN,
               train: bool = True) -> float:
    """Model FLOPs of one step: 2 x (non-embedding linear params) per token forward, the same
    again for activation gradients (frozen weights: no weight-gradient matmuls), plus attention
    (QK^T, AV: 4 T d per token per layer forward, twice that backward), plus MaxSim."""
    if cfg.model_type == "t5":
        layers, d, inner, ff = cfg.num_layers, cfg.d_model, cfg.num_heads * cfg.d_kv, cfg.d_ff
        dim = 128 if d == 768 else 32
    else:
        layers, d, inner, ff = cfg.num_hidden_layers, cfg.hidden_size, cfg.hidden_size, cfg.intermediate_size
        dim = d
    linear = layers * (4 * d * inner + 2 * d * ff) + (d * dim if cfg.model_type == "t5" else 0)
    passes = 2 if train else 1  # forward, + activation gradients (same cost as forward)
    total = 0.0
    for length in (query_len, doc_len) if train else (doc_len,):
        tokens = batch * length
        total += passes * 2 * linear * tokens
        total += (3 if train else 1) * 4 * length * inner * layers * tokens
    if train:
        total += 3 * 2 * batch * batch * query_len * doc_len * dim
    return total


# ----------------------------------------------------------------------------- same optimizer


def optim_config():
    """The benchmark's optimizer (the recipe's: mlxcore.optim AdamW, no bias correction, linear
    warm-up from 0 then cosine, clip 1.0), as an `mlxcore.train.optim.OptimConfig`."""
    from mlxcore.train.optim import OptimConfig

    return OptimConfig(lr=2e-4, warmup_steps=10, total_steps=1000, weight_decay=0.0)


def torch_adamw_groups(cfg, steps: int) -> list[tuple[float, float]]:
    """(lr, eps) per step for torch.optim.AdamW so that it takes MLX's AdamW steps exactly.

    MLX (bias_correction=False): p -= lr_n * m / (sqrt(v) + eps), lr_n = schedule(n) read before
    the step counter rises (0 at the first step with warm-up from 0). torch always corrects bias:
    p -= lr_t * (m / c1) / (sqrt(v) / sqrt(c2) + eps_t), c1 = 1 - b1^t, c2 = 1 - b2^t, t = n + 1.
    Equal when lr_t = lr_n * c1 / sqrt(c2) and eps_t = eps / sqrt(c2). (Before this, the torch side
    ran a constant lr 2e-4 with bias correction: ~5x MLX's effective step after warm-up, and no
    warm-up; see docs/performance.md.)"""
    import math

    out = []
    for n in range(steps):
        if n < cfg.warmup_steps:
            lr = cfg.lr * n / cfg.warmup_steps
        else:
            decay = max(cfg.total_steps - cfg.warmup_steps, 1)
            k = min(n - cfg.warmup_steps, decay)
            end = cfg.lr * cfg.min_lr_ratio
            lr = end + (cfg.lr - end) * 0.5 * (1 + math.cos(math.pi * k / decay))
        c1, c2 = 1 - cfg.beta1 ** (n + 1), 1 - cfg.beta2 ** (n + 1)
        out.append((lr * c1 / math.sqrt(c2), cfg.eps / math.sqrt(c2)))
    return out
