"""Causal LM loading: GGUF (tiny written here, and the real SmolLM2), mlx-lm dirs, LoRA, export."""


import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.utils import load as mlx_lm_load

from mlxcore.train.lora import LoraConfig
from mlxio.errors import LoadError
from mlxio.weights import gguf_llm, llm, llm_lora

LORA = LoraConfig(rank=4, alpha=8.0, targets=("q_proj", "v_proj", "down_proj"))
TEXT = "def add(a, b):\n    return a + 12\t# héllo"


def logits_of(model, tokens):
    return np.array(model(mx.array([tokens])).astype(mx.float32))


def perturb_lora(lora, seed=1):
    """The LoRA tree with non-zero B everywhere, so adapters change the outputs."""
    flat = tree_flatten(lora)
    keys = mx.random.split(mx.random.key(seed), len(flat))
    return tree_unflatten([(k, 0.5 * mx.random.normal(v.shape, key=kk) if k.endswith("lora_b") else v)
                           for (k, v), kk in zip(flat, keys, strict=True)])


def to_gguf_qk(w: mx.array, n_head: int) -> mx.array:
    """llama.cpp's `LlamaModel.permute`: HF rotate-half Q/K rows -> interleaved GGUF rows."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_tiny_gguf(policy, path):
    """A tiny llama as llama.cpp would write it (float tensors, byte-level BPE metadata)."""
    cfg = policy.config
    names = {v: k for k, v in gguf_llm._GLOBAL_NAMES.items()}
    block = {v: k for k, v in gguf_llm._BLOCK_NAMES.items()}
    tensors = {}
    for name, w in tree_flatten(policy.model.parameters()):
        module, suffix = name.rsplit(".", 1)
        if module.startswith("model.layers."):
            _, _, i, rest = module.split(".", 3)
            if rest == "self_attn.q_proj":
                w = to_gguf_qk(w, cfg["num_attention_heads"])
            elif rest == "self_attn.k_proj":
                w = to_gguf_qk(w, cfg["num_key_value_heads"])
            tensors[f"blk.{i}.{block[rest]}.{suffix}"] = w
        else:
            tensors[f"{names[module]}.{suffix}"] = w
    tok = policy.tokenizer._tokenizer
    vocab = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
    u32 = lambda v: mx.array(v, dtype=mx.uint32)  # noqa: E731
    meta = {
        "general.architecture": "llama",
        "llama.block_count": u32(cfg["num_hidden_layers"]),
        "llama.embedding_length": u32(cfg["hidden_size"]),
        "llama.feed_forward_length": u32(cfg["intermediate_size"]),
        "llama.attention.head_count": u32(cfg["num_attention_heads"]),
        "llama.attention.head_count_kv": u32(cfg["num_key_value_heads"]),
        "llama.attention.layer_norm_rms_epsilon": mx.array(cfg["rms_norm_eps"]),
        "llama.rope.freq_base": mx.array(cfg["rope_theta"]),
        "llama.context_length": u32(cfg["max_position_embeddings"]),
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt2",
        "tokenizer.ggml.tokens": [t for t, _ in vocab],
        "tokenizer.ggml.token_type": mx.array([1] * 256 + [3] * 3, dtype=mx.int32),
        "tokenizer.ggml.eos_token_id": u32(258),
        "tokenizer.ggml.padding_token_id": u32(256),
        "tokenizer.chat_template": llm.CHATML_TEMPLATE,
    }
    mx.save_gguf(str(path), tensors, meta)


@pytest.fixture(scope="module")
def smollm2():
    return llm.load_policy()


def test_tiny_llama_gguf_round_trip_matches_hf_layout(tmp_path):
    """A llama written with llama.cpp's Q/K permutation loads back in the HF layout (the very
    same Q/K weights, no rope_traditional) with the same logits and tokenizer."""
    ref = llm.tiny_policy("llama", seed=3)
    write_tiny_gguf(ref, tmp_path / "tiny.gguf")
    got = llm.load_policy(tmp_path)  # a directory holding one .gguf
    assert "rope_traditional" not in got.config and not got.config["tie_word_embeddings"]
    for name in ("q_proj", "k_proj"):
        np.testing.assert_array_equal(np.array(getattr(got.model.layers[1].self_attn, name).weight),
                                      np.array(getattr(ref.model.layers[1].self_attn, name).weight))
    assert got.tokenizer.encode(TEXT) == ref.tokenizer.encode(TEXT)
    assert got.tokenizer.eos_token_ids == {258}
    tokens = ref.tokenizer.encode(TEXT)
    np.testing.assert_allclose(logits_of(got.model, tokens), logits_of(ref.model, tokens), atol=1e-4)


def test_smollm2_gguf_loads_quantised_with_its_tokenizer(smollm2):
    cfg = smollm2.config
    assert (cfg["model_type"], cfg["num_hidden_layers"], cfg["hidden_size"]) == ("llama", 30, 576)
    assert "rope_traditional" not in cfg and cfg["tie_word_embeddings"] and smollm2.quantized
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["quantization"]["bits"] == 4
    assert cfg["quantization"]["model.embed_tokens"]["bits"] == 8
    model = smollm2.model
    assert isinstance(model.model.embed_tokens, nn.QuantizedEmbedding)
    assert model.model.embed_tokens.bits == 8 and model.model.layers[0].mlp.down_proj.bits == 4
    tok = smollm2.tokenizer
    ids = tok.encode(TEXT)
    assert tok.decode(ids) == TEXT
    assert tok.encode("12345") == [tok.convert_tokens_to_ids(d) for d in "12345"]  # smollm digits
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    assert tok.decode(chat).endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert chat[0] == 1 and 2 in tok.eos_token_ids  # <|im_start|>, <|im_end|>


def test_smollm2_predicts_code(smollm2):
    """The quantised model is the real one: its greedy next token after a code prefix is code."""
    tok = smollm2.tokenizer
    prompt = tok.encode("def fibonacci(n):\n    if n <= 1:\n        return")
    next_token = int(mx.argmax(smollm2.model(mx.array([prompt]))[0, -1]))
    assert tok.decode([next_token]) == " n"


@pytest.mark.slow
def test_import_gguf_runs_in_mlx_lm_with_equal_logits(smollm2, tmp_path):
    out = llm.import_gguf(llm.default_gguf_path(), tmp_path / "smollm2")
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (out / name).is_file()
    model, tokenizer, config = mlx_lm_load(str(out), return_config=True)
    assert "rope_traditional" not in config and config["quantization"]["model.embed_tokens"]["bits"] == 8
    ids = smollm2.tokenizer.encode(TEXT)
    assert tokenizer.encode(TEXT) == ids
    assert tokenizer.apply_chat_template([{"role": "user", "content": "x"}],
                                         add_generation_prompt=True) == \
        smollm2.tokenizer.apply_chat_template([{"role": "user", "content": "x"}],
                                              add_generation_prompt=True)
    np.testing.assert_array_equal(logits_of(model, ids), logits_of(smollm2.model, ids))
    assert llm.load_policy(out).quantized


@pytest.mark.parametrize("size", [100, 1_000_000, 50_000_000])
def test_truncated_gguf_raises_load_error(tmp_path, size):
    path = tmp_path / "cut.gguf"
    with open(llm.default_gguf_path(), "rb") as src:
        path.write_bytes(src.read(size))
    with pytest.raises(LoadError, match="cut.gguf"):
        llm.load_policy(path)


def test_lying_safetensors_header_raises_load_error(tmp_path):
    ref = llm.tiny_policy("llama")
    llm.save_model_dir(ref.model, ref.tokenizer._tokenizer, ref.config, tmp_path)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(LoadError, match="model.safetensors"):
        llm.load_policy(tmp_path)


def test_bad_paths_raise_load_error(tmp_path, monkeypatch):
    with pytest.raises(LoadError, match="no such file"):
        llm.load_policy(tmp_path / "missing" / "x")
    with pytest.raises(LoadError, match="no config.json"):
        llm.load_policy(tmp_path)
    (tmp_path / "w.bin").write_bytes(b"x")
    with pytest.raises(LoadError, match=".gguf"):
        llm.load_policy(tmp_path / "w.bin")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(LoadError, match="hub"):
        llm.load_policy("nobody-here/no-such-model-xyz")


def test_unknown_gguf_tensor_is_named():
    with pytest.raises(LoadError, match="blk.0.ssm_conv"):
        gguf_llm.sanitize_gguf({"blk.0.ssm_conv.weight": mx.zeros(2)}, "m.gguf")


@pytest.mark.parametrize("kind,quantize", [("llama", False), ("qwen2", False), ("llama", True)])
def test_apply_lora_is_identity_then_trains_only_adapters(kind, quantize):
    policy = llm.tiny_policy(kind, quantize=quantize)
    tokens = policy.tokenizer.encode(TEXT)
    before = logits_of(policy.model, tokens)
    lora = llm_lora.apply_lora(policy.model, LORA, num_layers=1, key=mx.random.key(7))
    np.testing.assert_array_equal(logits_of(policy.model, tokens), before)  # B = 0
    trainable = dict(tree_flatten(lora))
    assert trainable.keys() == dict(tree_flatten(policy.model.trainable_parameters())).keys()
    assert sorted(trainable) == [f"model.layers.1.{m}.{p}" for m in
                                 ("mlp.down_proj", "self_attn.q_proj", "self_attn.v_proj")
                                 for p in ("lora_a", "lora_b")]
    assert trainable["model.layers.1.self_attn.q_proj.lora_a"].shape == (64, 4)
    assert trainable["model.layers.1.mlp.down_proj.lora_b"].shape == (4, 64)
    again = llm.tiny_policy(kind, quantize=quantize)
    for name, leaf in tree_flatten(llm_lora.apply_lora(again.model, LORA, num_layers=1, key=mx.random.key(7))):
        np.testing.assert_array_equal(np.array(leaf), np.array(trainable[name]))


@pytest.mark.parametrize("quantize", [False, True])
def test_adapters_load_in_mlx_lm_and_fuse(tmp_path, quantize):
    base = llm.tiny_policy("llama", seed=2, quantize=quantize)
    llm.save_model_dir(base.model, base.tokenizer._tokenizer, base.config, tmp_path / "base")
    policy = llm.load_policy(tmp_path / "base")
    assert policy.quantized == quantize
    lora = perturb_lora(llm_lora.apply_lora(policy.model, LORA, num_layers=None, key=mx.random.key(0)))
    tokens = policy.tokenizer.encode(TEXT)
    untouched = logits_of(policy.model, tokens)
    ours = logits_of(llm_lora.bind(policy.model, lora), tokens)
    assert not np.allclose(ours, logits_of(base.model, tokens), atol=1e-3)

    llm_lora.save_adapters(policy.model, lora, LORA, None, tmp_path / "adapters")
    model, _ = mlx_lm_load(str(tmp_path / "base"), adapter_path=str(tmp_path / "adapters"))
    np.testing.assert_allclose(logits_of(model, tokens), ours, atol=1e-5)

    llm_lora.fuse(policy, lora, tmp_path / "fused", dequantize=True)
    fused, _ = mlx_lm_load(str(tmp_path / "fused"))
    assert not any(isinstance(m, nn.QuantizedLinear) for _, m in fused.named_modules())
    np.testing.assert_allclose(logits_of(fused, tokens), ours, atol=1e-4)
    np.testing.assert_array_equal(logits_of(llm_lora.bind(policy.model, lora), tokens), ours)  # live policy kept
    np.testing.assert_array_equal(logits_of(policy.model, tokens), untouched)  # the model itself never changed


def test_fuse_keeps_quantisation(tmp_path):
    policy = llm.tiny_policy("qwen2", quantize=True)
    lora = llm_lora.apply_lora(policy.model, LORA, None, mx.random.key(0))
    llm_lora.fuse(policy, lora, tmp_path / "fused")
    fused, _ = mlx_lm_load(str(tmp_path / "fused"))
    q = fused.model.layers[0].self_attn.q_proj
    assert isinstance(q, nn.QuantizedLinear) and q.bits == 4
    # B = 0: the fused weight is the base re-quantised, within one quantisation step of it.
    base = policy.model.model.layers[0].self_attn.q_proj.linear

    def dequantized(m):
        return np.array(mx.dequantize(m.weight, m.scales, m.biases, m.group_size, m.bits))

    step = float(mx.max(base.scales))
    assert np.abs(dequantized(q) - dequantized(base)).max() <= step
