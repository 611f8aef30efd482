"""The PEFT adapter names exactly the modules it adapts: loaded by `peft.PeftModel.from_pretrained`
with warnings as errors (a suffix target such as "dense" also matched BERT's pooler, and PEFT
warned "missing adapter keys ... pooler.dense"), PEFT adapts the same layers MLX did, and its
token embeddings equal MLX's (atol 1e-4, float32 on CPU)."""

from __future__ import annotations

import warnings

import mlx.core as mx
import numpy as np
import pytest

from mlxcore.retrieval.encoder import token_embeddings
from mlxcore.train import lora
from mlxcore.train.tree import combine, flatten, unflatten
from mlxio.weights import export
from mlxio.weights.encoders import default_encoder_path, load_encoder, tokenize

TEXTS = ["def add(a, b):\n    return a + b", "Parse a date string into a datetime object."]


SCALE = 2.0  # alpha 8 / rank 4


@pytest.fixture(scope="module")
def minilm():
    return load_encoder(str(default_encoder_path()), lora_scale=SCALE)


def adapted(encoder, cfg: lora.LoraConfig, seed: int = 0) -> dict:
    """The encoder's params with adapters on `cfg.targets`, B random (not zero), so the adapter
    changes the embeddings and a dropped or misplaced adapter shows."""
    adapters = flatten(lora.init(mx.random.key(seed), lora.target_dims(encoder.params, cfg.targets), cfg.rank))
    keys = iter(mx.random.split(mx.random.key(seed + 1), len(adapters)))
    adapters = {k: (0.02 * mx.random.normal(v.shape, key=next(keys)) if k.endswith("lora_b") else v)
                for k, v in adapters.items()}
    return combine(encoder.params, unflatten(adapters))


@pytest.mark.parametrize("targets", [("query", "key", "value", "dense"),  # the quick preset's: every linear
                                     ("query", "value"),
                                     ("re:layer\\.[01]\\..*(query|output\\.dense)",)])
def test_peft_loads_the_export_without_warnings(minilm, tmp_path, targets):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    cfg = lora.LoraConfig(rank=4, alpha=8.0, targets=targets)
    assert cfg.scale == SCALE
    params = adapted(minilm, cfg)
    out = export.export_peft(minilm, params, cfg, tmp_path / "peft", "sentence-transformers/all-MiniLM-L6-v2")
    base = transformers.AutoModel.from_pretrained(default_encoder_path())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # transformers 5.x deprecation raised from inside peft's own loader: not about the adapter
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing", category=FutureWarning)
        model = peft.PeftModel.from_pretrained(base, out)
    ours_layers = sorted(lora.target_dims(minilm.params, targets))
    theirs_layers = sorted(name.removeprefix("base_model.model.") for name, module in model.named_modules()
                           if hasattr(module, "lora_A") and "default" in module.lora_A)
    assert theirs_layers == ours_layers
    ids, mask = tokenize(minilm.tokenizer, TEXTS, 32)
    ours = np.array(token_embeddings(params, mx.array(ids), mx.array(mask), minilm.spec))
    with torch.no_grad():
        hidden = model.eval()(input_ids=torch.tensor(ids, dtype=torch.long),
                              attention_mask=torch.tensor(mask, dtype=torch.long)).last_hidden_state
    theirs = torch.nn.functional.normalize(hidden, dim=-1).numpy()
    real = np.asarray(mask, bool)
    np.testing.assert_allclose(theirs[real], ours[real], atol=1e-4)


def test_target_modules_are_full_paths(minilm):
    cfg = lora.LoraConfig(rank=2, alpha=4.0, targets=("dense",))
    names = export.peft_target_modules(adapted(minilm, cfg))
    assert len(names) == 3 * 6  # attention.output, intermediate, output: 3 dense layers in each of 6 blocks
    assert all(n.startswith("encoder.layer.") and n.endswith(".dense") for n in names)
    assert not any(n.startswith("pooler") for n in names)
