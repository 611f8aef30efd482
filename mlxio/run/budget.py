"""Settings that cannot fit, refused before the work starts: lower bounds of the memory a
rollout, an update step or an encoder step needs, checked against the machine's memory.

Each estimate counts only tensors that must exist at once (a KV cache, one micro-batch's
logits, a layer's attention scores), so it is a lower bound: a refused setting would certainly
not have fit, and a setting that passes may still need more. The error names the option to
lower (`--group_size 4096` on the quick preset: 8,192 sequences, whose [rows, tokens, 49,152]
float32 logits alone need hundreds of GiB).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from mlxio.errors import ConfigError

if TYPE_CHECKING:
    from mlxio.rl.evaluation import EvalConfig

GiB = 1 << 30
FLOAT = 4  # bytes: estimates count float32 (the CPU default; bf16 halves some, never all)


def machine_bytes() -> int:
    """The memory the arrays can use: the GPU's (MLX's device info) on a GPU, else the RAM."""
    try:
        import mlx.core as mx

        if mx.default_device() == mx.gpu:
            info = mx.device_info() if hasattr(mx, "device_info") else mx.metal.device_info()
            size = int(info.get("memory_size") or info.get("total_memory") or 0)
            if size > 0:
                return size
    except Exception:  # noqa: BLE001 - no device info: fall back to the RAM
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return 1 << 62  # unknown: refuse nothing


def _gib(n: float) -> str:
    return f"{n / GiB:.1f} GiB" if n >= GiB / 10 else f"{n / (1 << 20):.0f} MiB"


def require(needed: float, option: str, value, what: str, fix: str, where: str | None = None,
            available: int | None = None) -> None:
    """ConfigError naming `option` when `needed` bytes exceed the machine's memory."""
    available = machine_bytes() if available is None else available
    if needed > available:
        raise ConfigError(f"{option}: {value} cannot fit: {what} need at least {_gib(needed)}, this machine has "
                          f"{_gib(available)}", where=where, fix=fix)


def model_dims(config: dict) -> dict[str, int]:
    """{layers, hidden, kv_dim, vocab} of a causal LM's HF / mlx-lm config (0 where absent)."""
    hidden = int(config.get("hidden_size") or 0)
    heads = int(config.get("num_attention_heads") or 1)
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or (hidden // max(heads, 1)))
    return {"layers": int(config.get("num_hidden_layers") or 0), "hidden": hidden,
            "kv_dim": kv_heads * head_dim, "vocab": int(config.get("vocab_size") or 0)}


def rollout_bytes(rows: int, tokens: int, config: dict) -> int:
    """Lower bound of a batched generation: the KV cache of `rows` sequences of `tokens`, plus
    one decode step's logits."""
    d = model_dims(config)
    return rows * (d["layers"] * 2 * d["kv_dim"] * tokens + d["vocab"]) * FLOAT


def update_bytes(rows: int, tokens: int, config: dict) -> int:
    """Lower bound of one policy-update micro-batch of `rows` sequences: its logits and their
    log-softmax ([rows, tokens, vocab] each) and one hidden state per layer kept for backward."""
    d = model_dims(config)
    return rows * tokens * (2 * d["vocab"] + d["layers"] * d["hidden"]) * FLOAT


def check_rlaif(config: dict, *, prompts_per_step: int, group_size: int, max_new_tokens: int, accum: int,
                ev: EvalConfig, world_size: int = 1, where: str | None = None,
                available: int | None = None) -> None:
    """The RLAIF recipe's per-step memory (prompts_per_step x group_size sequences of at least
    max_new_tokens tokens, the update in `accum` micro-batches) against the machine (`config`:
    the model's): the rollout's KV cache and an update micro-batch's logits, and the
    evaluation's (`ev`) KV cache. ConfigError naming group_size (or max_new_tokens) when either
    cannot fit."""
    rows = prompts_per_step * group_size // max(world_size, 1)
    tokens = max_new_tokens + 16  # a prompt has some tokens: 16 keeps the bound a lower bound
    per_micro = max(rows // accum, 1)
    option, value = ("group_size", group_size) if group_size >= prompts_per_step else (
        "prompts_per_step", prompts_per_step)
    fix = f"lower --{option} or --max_new_tokens (the update splits into --train.accum micro-batches: raise it too)"
    require(rollout_bytes(rows, tokens, config), option, value,
            f"{rows} sequences x {tokens} tokens of generation (KV cache)", fix, where, available)
    require(update_bytes(per_micro, tokens, config), option, value,
            f"the update's micro-batches of {per_micro} sequences x {tokens} tokens x {model_dims(config)['vocab']} "
            "logits", fix, where, available)
    if (ev.before or ev.after) and ev.samples:
        rows = ev.batch * ev.samples  # the evaluation decodes `batch` prompts x `samples` completions together
        require(rollout_bytes(rows, ev.max_new_tokens + 16, config), "eval.batch", ev.batch,
                f"the evaluation's {ev.batch} prompts x {ev.samples} samples x {ev.max_new_tokens + 16} tokens "
                "(KV cache)", "lower --eval.batch, --eval.samples or --eval.max_new_tokens", where, available)


def check_encoder(model_cfg, batch: int, tokens: int, option: str, value, backward: bool,
                  where: str | None = None, fix: str | None = None, available: int | None = None) -> None:
    """An encoder step over `batch` texts of `tokens` (a BERT / T5 config: hidden size, layers,
    heads) within the machine's memory, else a ConfigError naming `option`."""
    hidden = getattr(model_cfg, "hidden_size", None) or getattr(model_cfg, "d_model", 0)
    layers = getattr(model_cfg, "num_hidden_layers", None) or getattr(model_cfg, "num_layers", 0)
    heads = getattr(model_cfg, "num_attention_heads", None) or getattr(model_cfg, "num_heads", 1)
    require(encoder_bytes(batch, tokens, int(hidden), int(layers), int(heads), backward), option, value,
            f"{batch} texts x {tokens} tokens through {layers} layers ({'training' if backward else 'encoding'})",
            fix or f"lower --{option}", where, available)


def encoder_bytes(batch: int, tokens: int, hidden: int, layers: int, heads: int, backward: bool) -> int:
    """Lower bound of an encoder forward (and backward) over `batch` texts of `tokens`: a layer's
    attention scores [batch, heads, tokens, tokens] plus, for backward, every layer's hidden
    state [batch, tokens, hidden]."""
    attention = batch * heads * tokens * tokens
    states = batch * tokens * hidden * (layers if backward else 2)
    return (attention + states) * FLOAT
