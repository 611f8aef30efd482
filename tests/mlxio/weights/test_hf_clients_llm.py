"""The causal LMs this project writes, read by the ecosystem's own clients: transformers loads the
imported GGUF and the fused RLAIF model with the logits and greedy text of mlx-lm."""

import json

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm import generate
from mlx_lm.utils import load as mlx_lm_load

from mlxcore.train.lora import LoraConfig
from mlxio.weights import import_gguf, llm, llm_lora

pytestmark = pytest.mark.slow
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

PROMPT = [{"role": "user", "content": "Write a Python function that reverses a string."}]
LORA = LoraConfig(rank=4, alpha=8.0, targets=("q_proj", "k_proj", "v_proj"))


def hf_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def hf_greedy(model, tokenizer, ids, n):
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False,
                             attention_mask=torch.ones(1, len(ids), dtype=torch.long))
    return tokenizer.decode(out[0, len(ids):].tolist())


def mlx_greedy(model, tokenizer, ids, n):
    return generate(model, tokenizer, ids, max_tokens=n)


def test_import_gguf_cli_dequantized_loads_in_transformers(tmp_path):
    out = tmp_path / "smollm2"
    import_gguf.main(["--default", str(out), "--dequantize", "--dtype", "float32"])
    config = json.loads((out / "config.json").read_text())
    assert "rope_traditional" not in config and "quantization" not in config
    assert config["torch_dtype"] == "float32"
    model, tokenizer = mlx_lm_load(str(out))
    ids = tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True)
    ours = np.array(model(mx.array([ids]))[0])
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    assert hf_tok.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=True,
                                      return_dict=False) == ids
    theirs = hf_logits(hf, ids)
    diff = np.abs(theirs - ours).max()
    print(f"imported GGUF: max |logit diff| transformers vs mlx-lm = {diff:.2e}")
    assert diff < 1e-3
    text = mlx_greedy(model, tokenizer, ids, 24)
    assert hf_greedy(hf, hf_tok, ids, 24) == text
    assert "def " in text


def test_fused_rlaif_model_matches_in_transformers(tmp_path):
    """LoRA on Q/K/V of the embedded GGUF policy (B perturbed so the adapters matter), fused as
    the RLAIF recipe fuses it: transformers' logits and greedy text equal mlx-lm's."""
    policy = llm.load_policy(dequantize=True, dtype="float32")
    lora = tree_flatten(llm_lora.apply_lora(policy.model, LORA, num_layers=None, key=mx.random.key(0)))
    keys = mx.random.split(mx.random.key(1), len(lora))
    lora = tree_unflatten([(k, 0.02 * mx.random.normal(v.shape, key=kk) if k.endswith("lora_b") else v)
                           for (k, v), kk in zip(lora, keys, strict=True)])
    tok = policy.tokenizer
    ids = tok.apply_chat_template(PROMPT, add_generation_prompt=True)
    live = np.array(llm_lora.bind(policy.model, lora)(mx.array([ids]))[0])
    llm_lora.fuse(policy, lora, tmp_path / "fused", dequantize=True)
    fused, fused_tok = mlx_lm_load(str(tmp_path / "fused"))
    ours = np.array(fused(mx.array([ids]))[0])
    np.testing.assert_allclose(ours, live, atol=1e-3)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "fused").eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "fused")
    theirs = hf_logits(hf, ids)
    diff = np.abs(theirs - ours).max()
    agree = (theirs.argmax(-1) == ours.argmax(-1)).mean()
    print(f"fused RLAIF model: max |logit diff| transformers vs mlx-lm = {diff:.2e}, "
          f"argmax agreement {agree:.3f}")
    assert diff < 1e-3 and agree == 1.0
    assert hf_greedy(hf, hf_tok, ids, 24) == mlx_greedy(fused, fused_tok, ids, 24)
