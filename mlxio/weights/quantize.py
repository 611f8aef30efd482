"""Save and load quantised params trees; compression figures for reports; the quantisation
rules' options (`QuantConfig`, the retriever's `quant.*`).

A saved model is a directory: `model.safetensors` (the flat tree: packed uint32 codes, scales,
biases and every float leaf) and `quant_config.json` ({"format", "layers": {path: {"bits",
"group_size", "mode"}}, "kept_float": {path: reason}, "extra": {...}}). Loading reads the
weights through `safeload` and checks every quantised layer's shapes against its bits and group
size, so a config that does not describe the weights is a LoadError naming the layer.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import attrs
import mlx.core as mx

from mlxcore.train import lora, quant
from mlxcore.train.quant import QUANT_KEYS
from mlxcore.train.tree import Tree, flatten, unflatten
from mlxio.atomic import atomic_dir, write_json_atomic
from mlxio.errors import ConfigError, LoadError
from mlxio.weights import safeload

WEIGHTS_NAME = "model.safetensors"
CONFIG_NAME = "quant_config.json"
FORMAT = "mlxcore.quant/v1"


@attrs.frozen(kw_only=True)
class QuantConfig:
    """Quantisation rules: fake-quantised training and the quantised export (the retriever's
    `quant.*`; `parse_rules`, `save_ptq`)."""

    qat: tuple[str, ...] = ()  # rules ("*=4/64", see mlxcore.train.quant.parse_rule): fake-quantise while training
    ptq: tuple[str, ...] = ()  # rules: quantise the merged model after training; save it and evaluate it


def parse_rules(texts: tuple[str, ...], field: str) -> tuple[quant.QuantRule, ...]:
    """Quant rules from config strings ("*=4/64", see `mlxcore.train.quant.parse_rule`); ConfigError
    naming the field and the rule."""
    try:
        return tuple(quant.parse_rule(text) for text in texts)
    except ValueError as err:
        raise ConfigError(f"{field}: {err}") from None


def save_quantized(directory: str | os.PathLike, params: Tree, report: dict, extra: dict | None = None) -> Path:
    """Write `params` (from `quant.quantize_tree`) and its report to `directory`; returns it."""
    out = Path(directory)
    flat = flatten(params)
    with atomic_dir(out, "quantized model") as tmp:
        mx.save_safetensors(str(tmp / WEIGHTS_NAME), flat, metadata={"format": FORMAT})
        write_json_atomic(tmp / CONFIG_NAME, {"format": FORMAT, "layers": report["layers"],
                                              "kept_float": report.get("kept_float", {}), "extra": extra or {}})
    return out


def _check_layer(path: Path, layer: str, fmt: dict, flat: dict) -> None:
    where = f"{path / CONFIG_NAME}: layer {layer!r}"
    if not isinstance(fmt, dict) or set(fmt) != {"bits", "group_size", "mode"}:
        raise LoadError(f"{where}: expected keys bits, group_size, mode")
    missing = [k for k in ("weight", *QUANT_KEYS) if f"{layer}.{k}" not in flat]
    if missing:
        raise LoadError(f"{where}: {WEIGHTS_NAME} lacks {[f'{layer}.{k}' for k in missing]}")
    packed, scales, biases = (flat[f"{layer}.{k}"] for k in ("weight", *QUANT_KEYS))
    bits, group = fmt["bits"], fmt["group_size"]
    if not isinstance(bits, int) or not isinstance(group, int) or bits <= 0 or group <= 0:
        raise LoadError(f"{where}: bits and group_size must be positive integers")
    if packed.dtype != mx.uint32 or packed.ndim != 2 or scales.shape != biases.shape:
        raise LoadError(f"{where}: expected uint32 [out, packed] codes and equal scales/biases shapes")
    in_dim = packed.shape[1] * 32 // bits
    if (packed.shape[1] * 32) % bits or scales.shape != (packed.shape[0], in_dim // group) or in_dim % group:
        raise LoadError(f"{where}: codes {packed.shape} and scales {scales.shape} do not fit "
                        f"bits={bits}, group_size={group}")


def load_quantized(directory: str | os.PathLike) -> tuple[Tree, dict]:
    """(params tree, report) written by `save_quantized`; LoadError naming file and layer."""
    path = Path(directory)
    try:
        config = json.loads((path / CONFIG_NAME).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise LoadError(f"{path / CONFIG_NAME}: unreadable ({err})") from err
    if not isinstance(config, dict) or config.get("format") != FORMAT or not isinstance(config.get("layers"), dict):
        raise LoadError(f"{path / CONFIG_NAME}: not a {FORMAT} quant config")
    flat = safeload.read_safetensors(path / WEIGHTS_NAME)
    for layer, fmt in config["layers"].items():
        _check_layer(path, layer, fmt, flat)
    report = {"layers": config["layers"], "kept_float": config.get("kept_float", {}),
              "extra": config.get("extra", {})}
    return unflatten(flat), report


def compression_summary(float_params: Tree, quant_params: Tree, layers: dict) -> dict:
    """Bytes before/after: of the quantised layers alone (`linear_ratio`) and of the whole tree."""
    before, after = flatten(float_params), flatten(quant_params)
    layer_before = sum(before[f"{layer}.weight"].nbytes for layer in layers)
    layer_after = sum(after[f"{layer}.{k}"].nbytes for layer in layers for k in ("weight", *QUANT_KEYS))
    total_before = sum(v.nbytes for v in before.values())
    total_after = sum(v.nbytes for v in after.values())
    return {
        "quantized_layers": len(layers),
        "layer_bytes_float": layer_before, "layer_bytes_quantized": layer_after,
        "linear_ratio": layer_before / max(layer_after, 1),
        "model_bytes_float": total_before, "model_bytes_quantized": total_after,
        "model_ratio": total_before / max(total_after, 1),
    }


def save_ptq(params: Tree, lora_scale: float, rules: tuple[str, ...], directory: str | os.PathLike,
             base_model: str) -> tuple[Tree, dict]:
    """Post-training quantisation of the LoRA-merged `params` by `rules` (config strings),
    saved in `directory`. Returns (the dequantised tree: the same numbers as the quantised
    matmuls, at BLAS speed on CPU; the compression summary)."""
    merged, _ = lora.merge(params, lora_scale)
    qparams, report = quant.quantize_tree(merged, parse_rules(rules, "quant.ptq"))
    save_quantized(directory, qparams, report, extra={"base_model": base_model, "rules": list(rules)})
    return quant.dequantize_tree(qparams, report["layers"]), compression_summary(merged, qparams, report["layers"])
