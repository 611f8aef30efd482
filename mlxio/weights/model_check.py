"""A model config's sizes checked against the weights actually present, before any model is built.

A config.json (or GGUF metadata) that claims 1,000,000 layers would have the loader build a
million blocks before it noticed that the weights hold two; a string or a float where a size
belongs fails deep inside it. `check_model_config(config, shapes, where)` refuses both with one
LoadError line naming the field, reading only the weights' names and shapes (safetensors headers,
`header_shapes`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mlxio.errors import LoadError

# sizes a transformers / mlx-lm / GGUF-derived config may give: a whole number >= 1 where present
SIZE_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
               "vocab_size", "max_position_embeddings", "head_dim", "d_model", "num_layers", "num_decoder_layers",
               "num_heads", "d_ff", "d_kv", "n_positions", "n_embd", "n_layer", "n_head", "type_vocab_size")
MAX_SIZE = 2**31 - 1
LAYER_FIELDS = ("num_hidden_layers", "num_layers", "n_layer")
HIDDEN_FIELDS = ("hidden_size", "d_model", "n_embd")
_LAYER = re.compile(r"(?:^|\.)(?:layers|layer|block|blk|h)\.(\d{1,9})\.")
_NORM = re.compile(r"(?:^|\.)(?:norm|final_layer_norm|final_layernorm|LayerNorm|layer_norm|ln_f|input_layernorm)\.weight$")
_FIX = "use the model's own config.json (its sizes must match its weights)"


def header_shapes(files: list[Path]) -> dict[str, tuple[int, ...]]:
    """{tensor name: shape} from the (validated) headers of safetensors `files`."""
    from mlxio.weights import safeload

    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        header, _, _ = safeload.parse_safetensors_header(file)
        shapes.update({name: tuple(entry["shape"]) for name, entry in header.items()})
    return shapes


def layers_present(shapes: Mapping[str, tuple[int, ...]]) -> int | None:
    """1 + the highest block index in the weights' names (`model.layers.7.` -> 8); None if none."""
    found = [int(m.group(1)) for name in shapes if (m := _LAYER.search(name))]
    return max(found) + 1 if found else None


def check_model_config(config: Any, shapes: Mapping[str, tuple[int, ...]], where: str) -> None:
    """LoadError (one line naming `where` and the field) unless every size field present in
    `config` is a whole number in 1..2^31-1, the layer count is at most the blocks the weights
    hold, the hidden size is the length of the model's norm weights (where it has any) and the
    attention heads divide it (unless `head_dim` is given)."""
    if not isinstance(config, dict):
        raise LoadError(f"the model config is a JSON {type(config).__name__}, not an object", where=where, fix=_FIX)
    for field in SIZE_FIELDS:
        value = config.get(field)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SIZE:
            raise LoadError(f"{field} is {str(repr(value))[:60]}, not a whole number in 1..{MAX_SIZE}",
                            where=where, fix=_FIX)
    present = layers_present(shapes)
    for field in LAYER_FIELDS:
        claimed = config.get(field)
        if claimed is not None and present is not None and claimed > present:
            raise LoadError(f"{field} is {claimed} but the weights hold {present} layer(s)", where=where, fix=_FIX)
    hidden_field = next((f for f in HIDDEN_FIELDS if config.get(f) is not None), None)
    norms = {shape[0] for name, shape in shapes.items() if len(shape) == 1 and _NORM.search(name)}
    if hidden_field and norms and config[hidden_field] not in norms:
        raise LoadError(f"{hidden_field} is {config[hidden_field]} but the weights' norm layers have "
                        f"{sorted(norms)[:3]} features", where=where, fix=_FIX)
    heads = config.get("num_attention_heads")
    if hidden_field == "hidden_size" and heads and config.get("head_dim") is None and config["hidden_size"] % heads:
        raise LoadError(f"hidden_size {config['hidden_size']} is not a multiple of num_attention_heads {heads}",
                        where=where, fix=_FIX)
