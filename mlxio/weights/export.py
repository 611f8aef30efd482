"""Export a LoRA-trained retriever: a merged Hugging Face model directory and a PEFT adapter.

Merged: LoRA folded into the base weights (`mlxcore.train.lora.merge`, every adapter counted),
written as `model.safetensors` with the HF names transformers expects, beside the original
config, tokenizer and sentence-transformers files; a projection (XTR / ColBERT) goes to a
sentence-transformers `2_Dense/` module (`linear.weight`, bias-free, identity activation).
PEFT: `adapter_config.json` + `adapter_model.safetensors` with PEFT's key names
(`base_model.model.<module>.lora_A.weight` [r, in], `lora_B.weight` [out, r]); its
`target_modules` lists the adapted modules by full path, so PEFT adapts exactly those (a suffix
such as "dense" would also match BERT's `pooler.dense`, which has no adapter here).
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import mlx.core as mx

from mlxcore.train import lora
from mlxcore.train.tree import flatten
from mlxio.atomic import atomic_dir
from mlxio.errors import MlxioError
from mlxio.weights import cards
from mlxio.weights.encoders import LoadedEncoder, read_weights

COPIED = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt",
          "spiece.model", "sentence_bert_config.json", "config_sentence_transformers.json")
DENSE = "2_Dense"
log = logging.getLogger(__name__)


def _lora_layers(params: dict) -> list[str]:
    return sorted({p.rsplit(".", 1)[0] for p in flatten(params) if p.endswith(".lora_a")})


def _model_dir(encoder: LoadedEncoder) -> Path:
    modules = encoder.path / "modules.json"
    if modules.is_file():
        for module in json.loads(modules.read_text()):
            if str(module.get("type", "")).endswith("Transformer"):
                return encoder.path / module.get("path", "")
    return encoder.path


def _write_transformer(encoder: LoadedEncoder, params: dict, scale: float, out_dir: Path):
    """Merged encoder weights (HF names) + config and tokenizer files into `out_dir`; returns
    the projection weight [out, in] or None. Raises if any adapter was not merged."""
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
    return projection


def mean_pooling_view(encoder: LoadedEncoder) -> bool:
    """True when the base's sentence-transformers modules are Transformer -> Pooling(mean)
    [-> Normalize] with no Dense: then merged/'s `SentenceTransformer.encode` is the mean of
    the fine-tuned hidden states (`mlxio.search.embeddings.embed_pooled` computes the same)."""
    modules_file = encoder.path / "modules.json"
    if not modules_file.is_file():
        return False
    modules = json.loads(modules_file.read_text())
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    if "Dense" in kinds or "Pooling" not in kinds:
        return False
    pooling = next(m for m in modules if str(m.get("type", "")).endswith("Pooling"))
    config = encoder.path / pooling.get("path", "") / "config.json"
    if not config.is_file():
        return False
    modes = json.loads(config.read_text())
    return bool(modes.get("pooling_mode_mean_tokens")) and not any(
        v for k, v in modes.items() if k.startswith("pooling_mode_") and k != "pooling_mode_mean_tokens")


def export_merged(encoder: LoadedEncoder, params: dict, scale: float, out_dir: Path) -> Path:
    """Write the merged model to `out_dir` as the base's sentence-transformers model (its own
    pooling modules: a single-vector view of a multi-vector model); returns it. Built in a
    temporary sibling and renamed into place: a failed export leaves the previous one intact."""
    with atomic_dir(out_dir, "merged model") as tmp:
        _export_merged(encoder, params, scale, tmp)
    return Path(out_dir)


def _export_merged(encoder: LoadedEncoder, params: dict, scale: float, out_dir: Path) -> None:
    projection = _write_transformer(encoder, params, scale, out_dir)
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


def _write_dense(dense_dir: Path, weight: mx.array, pylate: bool = False) -> None:
    dense_dir.mkdir(parents=True, exist_ok=True)
    out_features, in_features = weight.shape
    config = {"in_features": int(in_features), "out_features": int(out_features), "bias": False,
              "activation_function": "torch.nn.modules.linear.Identity"}
    if pylate:
        config["use_residual"] = False
    (dense_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    mx.save_safetensors(str(dense_dir / "model.safetensors"), {"linear.weight": weight}, metadata={"format": "pt"})


def export_multivector(encoder: LoadedEncoder, params: dict, scale: float, out_dir: Path, *,
                       query_length: int, document_length: int) -> Path:
    """The trained multi-vector model as PyLate's ColBERT folder (`pylate.models.ColBERT(out_dir)`
    loads it as is: no random layer, no added prefix tokens).

    PyLate's format (`pylate/models/colbert.py`, `Dense.py`): a sentence-transformers folder whose
    modules are a Transformer and a Dense (`1_Dense`: the trained projection, or the identity
    when the model has none, so token embeddings are the encoder's own); its
    `config_sentence_transformers.json` (model_type "ColBERT") carries the encoding settings,
    here those of training: no [Q]/[D] prefix, no query expansion with [MASK] tokens, no
    punctuation skiplist, queries cut at `query_length` tokens and documents at
    `document_length`. PyLate L2-normalises each token and scores by MaxSim summed over query
    tokens (this project averages over them: the same ranking, scores times the query length).
    Written atomically as `export_merged`.
    """
    with atomic_dir(out_dir, "multi-vector (PyLate) model") as tmp:
        _export_multivector(encoder, params, scale, tmp, query_length=query_length,
                            document_length=document_length)
    return Path(out_dir)


def _export_multivector(encoder: LoadedEncoder, params: dict, scale: float, out_dir: Path, *,
                        query_length: int, document_length: int) -> None:
    projection = _write_transformer(encoder, params, scale, out_dir)
    hidden = int(encoder.spec.d_model)
    weight = projection if projection is not None else mx.eye(hidden, dtype=mx.float32)
    _write_dense(out_dir / "1_Dense", weight, pylate=True)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Dense", "type": "pylate.models.Dense.Dense"}]
    (out_dir / "modules.json").write_text(json.dumps(modules, indent=2) + "\n")
    (out_dir / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": int(document_length), "do_lower_case": False}, indent=2) + "\n")
    settings = {
        "model_type": "ColBERT", "similarity_fn_name": "MaxSim", "prompts": {}, "default_prompt_name": None,
        "query_prefix": "", "document_prefix": "", "query_length": int(query_length),
        "document_length": int(document_length), "do_query_expansion": False,
        "attend_to_expansion_tokens": False, "skiplist_words": [],
    }
    (out_dir / "config_sentence_transformers.json").write_text(json.dumps(settings, indent=2) + "\n")


def export_peft(encoder: LoadedEncoder, params: dict, cfg: lora.LoraConfig, out_dir: Path,
                base_model: str) -> Path:
    """Write the adapter in PEFT's LoRA format (loadable by `peft.PeftModel.from_pretrained`),
    atomically as `export_merged`."""
    if not _lora_layers(params):
        raise MlxioError("export: no LoRA adapters in params")
    with atomic_dir(out_dir, "PEFT adapter") as tmp:
        _export_peft(encoder, params, cfg, tmp, base_model)
    return Path(out_dir)


def peft_target_modules(params: dict) -> list[str]:
    """PEFT's `target_modules` for the adapters in `params`: every adapted layer's full module
    path (PEFT matches a list entry by equality or as a dotted suffix, so a full path selects that
    module alone). The configured targets are not used: "dense" also names BERT's pooler, which
    the encoder does not load, and a `re:` target is this project's syntax, not PEFT's."""
    return _lora_layers(params)


def _export_peft(encoder: LoadedEncoder, params: dict, cfg: lora.LoraConfig, out_dir: Path,
                 base_model: str) -> None:
    flat = flatten(params)
    layers = _lora_layers(params)
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
        "target_modules": peft_target_modules(params), "bias": "none", "fan_in_fan_out": False, "inference_mode": True,
        "modules_to_save": None, "init_lora_weights": True,
    }
    (out_dir / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")


def write_retriever_cards(out_dir: Path, *, base: str, results: dict, command: str, data: str) -> None:
    """README.md model cards for the exports in `out_dir`: colbert/ (the model as trained),
    merged/ (sentence-transformers' single-vector view) and peft_adapter/."""
    def metrics_of(task: str, entry: dict, names: tuple[str, ...]) -> dict:
        return {f"{task}: {name} {mode}": entry[name][mode]
                for name in names for mode in ("semantic", "hybrid") if mode in entry.get(name, {})}

    # both tasks: the held-out files of the training sources, and whole held-out packages (the
    # transfer test) when the run has them
    metrics = {**metrics_of("held-out files", results, ("untrained", "fine-tuned", "single-vector view")),
               "held-out files: BM25": results.get("bm25", {})}
    if "heldout_packages" in results:
        packages = results["heldout_packages"]
        metrics |= {**metrics_of("held-out packages", packages, ("untrained", "fine-tuned")),
                    "held-out packages: BM25": packages.get("bm25", {})}
    trained = ("LoRA fine-tuned for multi-vector (late-interaction) retrieval: each token is "
               "L2-normalised and a query scores a document by MaxSim.")
    if (out_dir / "colbert").is_dir():
        cards.write_card(
            out_dir / "colbert", title="Multi-vector code retriever (PyLate / ColBERT)", base=base,
            summary=f"{trained} This folder is the model as trained, in PyLate's ColBERT format "
                    "(no query/document prefix tokens, no query expansion, no skiplist: the encoding "
                    "used in training). Metrics below are MaxSim's (`semantic`). PyLate 1.6 needs "
                    "sentence-transformers 5.3 (its pin): `pip install sentence-transformers==5.3.0 datasets ujson` "
                    "and `pip install --no-deps pylate==1.6.0` (its other pins clash with recent torch).",
            data=data, metrics=metrics, command=command, library="PyLate",
            tags=("ColBERT", "PyLate", "sentence-transformers", "code-search", "mlx"),
            usage="""```python
from pylate import models, scores
model = models.ColBERT("colbert")
q = model.encode(["parse a date string"], is_query=True)
d = model.encode(["def parse_date(text): ..."], is_query=False)
scores.colbert_scores(q, d)  # MaxSim summed over query tokens
```""")
    if (out_dir / "merged").is_dir():
        cards.write_card(
            out_dir / "merged", title="Code retriever: single-vector view (sentence-transformers)",
            base=base,
            summary=f"{trained} This folder holds the same merged weights with the base model's "
                    "sentence-transformers modules, so `SentenceTransformer(path).encode` returns the "
                    "**single-vector view**: the base's pooling (mean over tokens) of the fine-tuned "
                    "token embeddings. It was not trained for that pooling and usually ranks below "
                    "MaxSim; for the multi-vector model use `../colbert` (PyLate) or "
                    "the project's code_search command. Metrics below: MaxSim's (`semantic`, "
                    "`hybrid`) and this view's own (`single-vector view semantic`: cosine of the "
                    "mean-pooled embeddings, same queries and truncation).",
            data=data, metrics=metrics, command=command, library="sentence-transformers",
            tags=("sentence-transformers", "code-search", "mlx"),
            usage="""```python
from sentence_transformers import SentenceTransformer
model = SentenceTransformer("merged")  # single-vector view
model.encode(["parse a date string"])
```""")
    if (out_dir / "peft_adapter").is_dir():
        cards.write_card(
            out_dir / "peft_adapter", title="LoRA adapter (PEFT) of a multi-vector code retriever",
            base=base, summary=f"{trained} The LoRA adapter alone, in PEFT's format.",
            data=data, metrics=metrics, command=command, library="peft",
            tags=("peft", "lora", "code-search", "mlx"),
            usage=f"""```python
from transformers import AutoModel
from peft import PeftModel
model = PeftModel.from_pretrained(AutoModel.from_pretrained("{base}"), "peft_adapter")
```""")


def export_retriever(encoder: LoadedEncoder, params: dict, lora_cfg: lora.LoraConfig, out_dir: Path, *, query_length: int, document_length: int, base: str, results: dict,
                     command: str, data: str) -> None:
    """Every export of a trained retriever in `out_dir`: colbert/ (PyLate, the model as
    trained), merged/ (sentence-transformers' single-vector view), peft_adapter/, each with
    its model card (`base`: the base model's hub id; `data`: what it was trained on)."""
    export_merged(encoder, params, lora_cfg.scale, out_dir / "merged")
    export_multivector(encoder, params, lora_cfg.scale, out_dir / "colbert",
                       query_length=query_length, document_length=document_length)
    export_peft(encoder, params, lora_cfg, out_dir / "peft_adapter", base)
    write_retriever_cards(out_dir, base=base, results=results, command=command, data=data)
    log.info("exported %s (PyLate, multi-vector), %s (sentence-transformers, single-vector view) and %s (PEFT)",
             out_dir / "colbert", out_dir / "merged", out_dir / "peft_adapter")
