"""Settings that cannot fit, refused before the work starts: lower bounds of the memory an
encoder step needs (`check_encoder`; a causal LM's rollout and update: mlxio.rl.memory_bounds),
checked against the machine's memory (`require`).

Each estimate counts only tensors that must exist at once (a KV cache, one micro-batch's
logits, a layer's attention scores), so it is a lower bound: a refused setting would certainly
not have fit, and a setting that passes may still need more. The error names the option to
lower (`--group_size 4096` on the quick preset: 8,192 sequences, whose [rows, tokens, 49,152]
float32 logits alone need hundreds of GiB).
"""

from __future__ import annotations

import os

from mlxio.errors import ConfigError

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
