"""Export a LoRA-trained retriever: a merged Hugging Face model directory and a PEFT adapter.

Merged: LoRA folded into the base weights (`mlxcore.lora.merge`, every adapter counted),
written as `model.safetensors` with the HF names transformers expects, beside the original
config, tokenizer and sentence-transformers files; a projection (XTR / ColBERT) goes to a
sentence-transformers `2_Dense/` module (`linear.weight`, bias-free, identity activation).
PEFT: `adapter_config.json` + `adapter_model.safetensors` with PEFT's key names
(`base_model.model.<module>.lora_A.weight` [r, in], `lora_B.weight` [out, r]).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx.core as mx

from mlxcore import lora
from mlxcore.tree import flatten
from mlxio.errors import MlxioError
from mlxio.weights.encoders import LoadedEncoder, read_weights

COPIED = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt",
          "spiece.model", "sentence_bert_config.json", "config_sentence_transformers.json")
DENSE = "2_Dense"


def _lora_layers(params: dict) -> list[str]:
    return sorted({p.rsplit(".", 1)[0] for p in flatten(params) if p.endswith(".lora_a")})


def _model_dir(encoder: LoadedEncoder) -> Path:
    modules = encoder.path / "modules.json"
    if modules.is_file():
        for module in json.loads(modules.read_text()):
            if str(module.get("type", "")).endswith("Transformer"):
                return encoder.path / module.get("path", "")
    return encoder.path


def export_merged(encoder: LoadedEncoder, params: dict, scale: float, out_dir: Path) -> Path:
    """Write the merged model to `out_dir`; returns it. Raises if any adapter was not merged."""
    layers = _lora_layers(params)
    merged, count = lora.merge(params, scale)
    if count != len(layers):
        raise MlxioError(f"export: merged {count} of {len(layers)} LoRA layers")
    weights = flatten(merged)
    projection = weights.pop("projection.weight", None)
    source_dir = _model_dir(encoder)
    raw, _ = read_weights(source_dir)
    weights.update({k: v for k, v in raw.items() if k.startswith("pooler.")})  # kept for BertModel
    out_dir.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out_dir / "model.safetensors"), weights, metadata={"format": "pt"})
    for name in COPIED:
        for folder in (source_dir, encoder.path):
            if (folder / name).is_file():
                shutil.copyfile(folder / name, out_dir / name)
                break
    modules_file = encoder.path / "modules.json"
    modules = json.loads(modules_file.read_text()) if modules_file.is_file() else None
    if projection is not None:
        _write_dense(out_dir / DENSE, projection)
        dense = [m for m in modules or [] if str(m.get("type", "")).endswith("Dense")]
        if not dense:  # a projection trained from scratch: a multi-vector model, no pooling
            modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                       {"idx": 1, "name": "1", "path": DENSE, "type": "sentence_transformers.models.Dense"}]
        else:
            dense[0]["path"] = DENSE
    if modules is not None:
        for module in modules:
            path = module.get("path", "")
            if path and path != DENSE and (encoder.path / path).is_dir():
                shutil.copytree(encoder.path / path, out_dir / path, dirs_exist_ok=True)
            if str(module.get("type", "")).endswith("Transformer"):
                module["path"] = ""
        (out_dir / "modules.json").write_text(json.dumps(modules, indent=2) + "\n")
    return out_dir


def _write_dense(dense_dir: Path, weight: mx.array) -> None:
    dense_dir.mkdir(parents=True, exist_ok=True)
    out_features, in_features = weight.shape
    config = {"in_features": int(in_features), "out_features": int(out_features), "bias": False,
              "activation_function": "torch.nn.modules.linear.Identity"}
    (dense_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    mx.save_safetensors(str(dense_dir / "model.safetensors"), {"linear.weight": weight}, metadata={"format": "pt"})


def export_peft(encoder: LoadedEncoder, params: dict, cfg: lora.LoraConfig, targets: tuple[str, ...],
                out_dir: Path, base_model: str) -> Path:
    """Write the adapter in PEFT's LoRA format (loadable by `peft.PeftModel.from_pretrained`)."""
    flat = flatten(params)
    layers = _lora_layers(params)
    if not layers:
        raise MlxioError("export: no LoRA adapters in params")
    tensors = {}
    for layer in layers:
        tensors[f"base_model.model.{layer}.lora_A.weight"] = flat[f"{layer}.lora_a"].T  # [r, in]
        tensors[f"base_model.model.{layer}.lora_B.weight"] = flat[f"{layer}.lora_b"].T  # [out, r]
    out_dir.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out_dir / "adapter_model.safetensors"), tensors, metadata={"format": "pt"})
    if "projection.weight" in flat and encoder.meta.get("projection") is None:
        _write_dense(out_dir / DENSE, flat["projection.weight"])  # trained from scratch: not LoRA
    config = {
        "peft_type": "LORA", "task_type": "FEATURE_EXTRACTION", "base_model_name_or_path": base_model,
        "r": cfg.rank, "lora_alpha": cfg.alpha, "lora_dropout": cfg.dropout, "use_rslora": cfg.rslora,
        "target_modules": list(targets), "bias": "none", "fan_in_fan_out": False, "inference_mode": True,
        "modules_to_save": None, "init_lora_weights": True,
    }
    (out_dir / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out_dir
