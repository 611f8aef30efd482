"""GGUF causal LMs (llama / qwen2 families) as mlx-lm models, kept quantised.

`mx.load(path, return_metadata=True)` reads Q4_0 / Q4_1 / Q8_0 tensors natively as MLX
group-wise affine quantised weights (`weight` uint32-packed, `scales`, `biases`; group 32), so a
GGUF model runs in mlx-lm's own `llama` / `qwen2` classes without dequantising: every layer is
quantised with the bits its tensors were packed with (SmolLM2's Q4_1 file keeps an 8-bit
token embedding beside 4-bit linears). The tokenizer is rebuilt from the GGUF metadata as a
`tokenizers` byte-level BPE.
"""

from __future__ import annotations

import importlib
import re
from collections import Counter
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

from mlxio.errors import LoadError
from mlxio.weights import safeload_gguf

GGUF_GROUP_SIZE = 32  # every GGUF block format MLX maps to affine quantisation has 32 weights

# GGUF tensor name part -> mlx-lm module path (llama.cpp's `gguf-py/gguf/tensor_mapping.py`).
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_SUFFIXES = ("weight", "bias", "scales", "biases")
_BLOCK_RE = re.compile(r"^blk\.(\d+)\.(\w+)\.(\w+)$")
_GLOBAL_RE = re.compile(r"^(\w+)\.(\w+)$")

# llama.cpp pre-tokenizer names (`tokenizer.ggml.pre`) -> the split regex run before byte-level
# BPE (llama.cpp `llama-vocab.cpp`); None = GPT-2's own regex inside ByteLevel.
_GPT2_SPLIT = None
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
                r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}"
                 r"\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_PRE_TOKENIZERS = {
    "default": ("bytelevel", _GPT2_SPLIT),
    "gpt2": ("bytelevel", _GPT2_SPLIT),
    # StarCoder-style vocabularies: every digit is its own pre-token, then GPT-2's regex.
    "smollm": ("digits", _GPT2_SPLIT),
    "starcoder": ("digits", _GPT2_SPLIT),
    "refact": ("digits", _GPT2_SPLIT),
    "qwen2": ("split", _QWEN2_SPLIT),
    "llama-bpe": ("split", _LLAMA3_SPLIT),
    "llama3": ("split", _LLAMA3_SPLIT),
}
_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp token types
_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}


def _scalar(metadata: dict, key: str, path: Path, default=None):
    if key not in metadata:
        if default is None:
            raise LoadError(f"{path}: GGUF metadata has no {key!r}")
        return default
    value = metadata[key]
    return value.item() if isinstance(value, mx.array) else value


def sanitize_gguf(weights: dict[str, mx.array], path: Path | str = "<gguf>") -> dict[str, mx.array]:
    """GGUF tensor names -> mlx-lm names (`blk.3.attn_q.scales` -> `model.layers.3.self_attn.
    q_proj.scales`). An unknown tensor raises LoadError naming it (silently dropping one would
    load a different model)."""
    out = {}
    for name, value in weights.items():
        if m := _BLOCK_RE.match(name):
            block, part, suffix = m.groups()
            module = _BLOCK_NAMES.get(part)
            module = module and f"model.layers.{block}.{module}"
        elif m := _GLOBAL_RE.match(name):
            part, suffix = m.groups()
            module = _GLOBAL_NAMES.get(part)
        else:
            module, suffix = None, ""
        if module is None or suffix not in _SUFFIXES:
            raise LoadError(f"{path}: GGUF tensor {name!r} is not supported (llama/qwen2 dense)")
        out[f"{module}.{suffix}"] = value
    return out


def quantization_from_weights(weights: dict[str, mx.array]) -> dict | None:
    """mlx-lm `quantization` config for sanitised GGUF weights, or None when nothing is packed.

    The default bits are the most common; layers packed otherwise get a per-layer entry (mlx-lm
    looks a module path up in this dict before the defaults).
    """
    bits_of = {}
    for name, scales in weights.items():
        if not name.endswith(".scales"):
            continue
        module = name[: -len(".scales")]
        in_dims = scales.shape[-1] * GGUF_GROUP_SIZE
        bits_of[module] = weights[f"{module}.weight"].shape[-1] * 32 // in_dims
    if not bits_of:
        return None
    default_bits = Counter(bits_of.values()).most_common(1)[0][0]
    quant = {"group_size": GGUF_GROUP_SIZE, "bits": default_bits, "mode": "affine"}
    for module, bits in sorted(bits_of.items()):
        if bits != default_bits:
            quant[module] = {"group_size": GGUF_GROUP_SIZE, "bits": bits, "mode": "affine"}
    return quant


def config_from_gguf(metadata: dict, weights: dict[str, mx.array], path: Path) -> dict:
    """mlx-lm model config (a `config.json` dict) from GGUF metadata and sanitised weights."""
    arch = _scalar(metadata, "general.architecture", path)
    if arch not in ("llama", "qwen2"):
        raise LoadError(f"{path}: GGUF architecture {arch!r} is not supported (llama, qwen2)")
    scaling = metadata.get(f"{arch}.rope.scaling.type", "none")
    if scaling not in ("none", None):
        raise LoadError(f"{path}: GGUF {arch}.rope.scaling.type={scaling!r} is not supported")
    n_heads = int(_scalar(metadata, f"{arch}.attention.head_count", path))
    n_vocab = metadata.get(f"{arch}.vocab_size")
    n_vocab = int(n_vocab.item()) if n_vocab is not None else len(metadata["tokenizer.ggml.tokens"])
    config = {
        "model_type": arch,
        "hidden_size": int(_scalar(metadata, f"{arch}.embedding_length", path)),
        "num_hidden_layers": int(_scalar(metadata, f"{arch}.block_count", path)),
        "intermediate_size": int(_scalar(metadata, f"{arch}.feed_forward_length", path)),
        "num_attention_heads": n_heads,
        "num_key_value_heads": int(_scalar(metadata, f"{arch}.attention.head_count_kv", path, n_heads)),
        "rms_norm_eps": float(_scalar(metadata, f"{arch}.attention.layer_norm_rms_epsilon", path)),
        "rope_theta": float(_scalar(metadata, f"{arch}.rope.freq_base", path, 10000.0)),
        "max_position_embeddings": int(_scalar(metadata, f"{arch}.context_length", path)),
        "vocab_size": n_vocab,
        "tie_word_embeddings": "lm_head.weight" not in weights,
        "architectures": [_ARCHITECTURES[arch]],
        # No rope_traditional: `unpermute_qk` puts llama's Q/K rows back in the Hugging Face
        # (rotate-half RoPE) order, which mlx-lm and transformers both run by default.
    }
    if arch == "llama":
        config["attention_bias"] = "model.layers.0.self_attn.q_proj.bias" in weights
    if (quant := quantization_from_weights(weights)) is not None:
        config["quantization"] = quant
    for key in ("bos", "eos"):
        value = metadata.get(f"tokenizer.ggml.{key}_token_id")
        if value is not None:
            config[f"{key}_token_id"] = int(value.item())
    return config


def unpermute_qk(weights: dict[str, mx.array], config: dict) -> dict[str, mx.array]:
    """llama's Q/K projections back in Hugging Face row order.

    llama.cpp's converter (`LlamaModel.permute`) reorders each head's output rows from
    rotate-half pairs (i, i + d/2) to interleaved pairs (2i, 2i + 1) for its interleaved RoPE;
    this is the inverse, as transformers' own GGUF loader does it
    (`modeling_gguf_pytorch_utils.LlamaTensorProcessor._reverse_permute_weights`). Rows are
    whole quantisation groups' owners, so packed `weight`, `scales`, `biases` and a `bias` are
    permuted alike. qwen2 (stored unpermuted) is returned as is.
    """
    if config["model_type"] != "llama":
        return weights
    heads = {"q_proj": config["num_attention_heads"], "k_proj": config["num_key_value_heads"]}
    out = dict(weights)
    for name, value in weights.items():
        module = name.rsplit(".", 1)[0]
        n_head = heads.get(module.rsplit(".", 1)[-1])
        if n_head is None or ".self_attn." not in module:
            continue
        half = value.shape[0] // n_head // 2
        out[name] = (value.reshape(n_head, half, 2, *value.shape[1:]).swapaxes(1, 2)
                     .reshape(value.shape))
    return out


def build_model(config: dict, weights: dict[str, mx.array], source: Path | str) -> nn.Module:
    """mlx-lm model for `config`, quantised per layer as the packed weights say, weights loaded."""
    arch = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    model = arch.Model(arch.ModelArgs.from_dict(config))
    weights = model.sanitize(dict(weights))
    quant = config.get("quantization")
    if quant is not None:
        def class_predicate(path: str, module: nn.Module):
            if not hasattr(module, "to_quantized") or f"{path}.scales" not in weights:
                return False
            return quant.get(path, {k: quant[k] for k in ("group_size", "bits", "mode")})

        nn.quantize(model, group_size=quant["group_size"], bits=quant["bits"],
                    class_predicate=class_predicate)
    try:
        model.load_weights(list(weights.items()), strict=True)
    except ValueError as e:
        raise LoadError(f"{source}: weights do not fit a {config['model_type']} model: {e}") from e
    model.eval()
    mx.eval(model.parameters())
    return model


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by byte-level BPE vocabularies."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), 256)]
    extra = [b for b in range(256) if b not in keep]
    return {**{b: chr(b) for b in keep}, **{b: chr(256 + i) for i, b in enumerate(extra)}}


def byte_level_tokenizer(tokens: list[str], merges: list[tuple[str, str]], pre: str,
                         special: list[str], bos: str | None, add_bos: bool,
                         source: Path | str = "<tokenizer>") -> Tokenizer:
    """Byte-level BPE `tokenizers.Tokenizer` (GPT-2 style) from a vocabulary and merge list.

    `pre` names the pre-tokenizer as llama.cpp does (`tokenizer.ggml.pre`); `special` tokens
    are matched whole before BPE and never split.
    """
    if pre not in _PRE_TOKENIZERS:
        raise LoadError(f"{source}: GGUF pre-tokenizer {pre!r} is not supported "
                        f"({', '.join(sorted(_PRE_TOKENIZERS))})")
    kind, split = _PRE_TOKENIZERS[pre]
    vocab = {token: i for i, token in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=split is None)
    if kind == "digits":
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level])
    elif kind == "split":
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(split), behavior="isolated"), byte_level])
    else:
        tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    if add_bos and bos is not None:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1",
            special_tokens=[(bos, vocab[bos])])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def tokenizer_from_gguf(metadata: dict, path: Path):
    """transformers `PreTrainedTokenizerFast` rebuilt from GGUF `tokenizer.ggml.*` metadata."""
    from transformers import PreTrainedTokenizerFast

    model_kind = metadata.get("tokenizer.ggml.model")
    if model_kind != "gpt2":
        raise LoadError(f"{path}: GGUF tokenizer.ggml.model={model_kind!r} is not supported "
                        "(only byte-level BPE, 'gpt2')")
    tokens = list(metadata["tokenizer.ggml.tokens"])
    merges = [tuple(m.split(" ", 1)) for m in metadata.get("tokenizer.ggml.merges", [])]
    types = metadata.get("tokenizer.ggml.token_type")
    types = np.array(types) if types is not None else np.ones(len(tokens), np.int32)
    special = [tokens[i] for i in np.nonzero((types == _CONTROL) | (types == _USER_DEFINED))[0]]

    def token_at(key):
        value = metadata.get(f"tokenizer.ggml.{key}_token_id")
        return None if value is None else tokens[int(value.item())]

    bos = token_at("bos")
    add_bos = bool(_scalar(metadata, "tokenizer.ggml.add_bos_token", path, False))
    pre = metadata.get("tokenizer.ggml.pre", "default")
    tok = byte_level_tokenizer(tokens, merges, pre, special, bos, add_bos, path)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=bos, eos_token=token_at("eos"), pad_token=token_at("padding"),
        unk_token=token_at("unknown"), chat_template=metadata.get("tokenizer.chat_template"),
        clean_up_tokenization_spaces=False)


def read_gguf(path: Path) -> tuple[dict[str, mx.array], dict]:
    """(weights, metadata) of a GGUF file whose header `mlxio.weights.safeload` validated first (a
    truncated or lying header is a LoadError, never an out-of-bounds read)."""
    if not Path(path).is_file():
        raise LoadError(f"{path}: no such GGUF file")
    return safeload_gguf.read_gguf(path)
