"""A model config's sizes are checked against the weights present before a model is built: a
claimed 1,000,000 layers, a string or float size, a hidden size the weights do not have is one
LoadError line naming the field (a policy folder, a GGUF-derived config, an encoder folder)."""

from __future__ import annotations

import json
import shutil

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mlxio.errors import LoadError
from mlxio.weights.model_check import SIZE_FIELDS, check_model_config, layers_present

LLAMA = {f"model.layers.{i}.{p}": (64,) for i in range(2) for p in ("input_layernorm.weight",)} | {
    "model.norm.weight": (64,), "model.embed_tokens.weight": (259, 64),
    "model.layers.0.self_attn.q_proj.weight": (64, 64), "model.layers.1.self_attn.q_proj.weight": (64, 64)}
GOOD = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 259, "max_position_embeddings": 2048}


def test_a_matching_config_passes():
    check_model_config(GOOD, LLAMA, "config.json")
    assert layers_present(LLAMA) == 2
    assert layers_present({"encoder.layer.5.attention.self.query.weight": (1, 1)}) == 6
    assert layers_present({"encoder.block.11.layer.0.layer_norm.weight": (1,)}) == 12


NOT_A_SIZE = st.one_of(st.text(max_size=8), st.floats(allow_nan=True), st.booleans(), st.integers(max_value=0),
                       st.integers(min_value=2**31), st.lists(st.integers(), max_size=2),
                       st.dictionaries(st.text(max_size=2), st.integers(), max_size=2))


@given(field=st.sampled_from(SIZE_FIELDS), value=NOT_A_SIZE)
def test_a_size_that_is_not_a_whole_number_is_one_line(field, value):
    with pytest.raises(LoadError, match=field) as caught:
        check_model_config({**GOOD, field: value}, LLAMA, "config.json")
    assert "\n" not in caught.value.contract_line()


@given(field=st.sampled_from(["num_hidden_layers", "num_layers", "n_layer"]), layers=st.integers(3, 2**31 - 1))
def test_more_layers_than_the_weights_hold_is_refused(field, layers):
    with pytest.raises(LoadError, match=f"{field} is {layers} but the weights hold 2 layer"):
        check_model_config({**GOOD, field: layers}, LLAMA, "config.json")


@given(hidden=st.integers(1, 2**31 - 1).filter(lambda h: h != 64))
def test_a_hidden_size_the_norms_do_not_have_is_refused(hidden):
    with pytest.raises(LoadError, match="hidden_size"):
        check_model_config({**GOOD, "hidden_size": hidden, "head_dim": 16}, LLAMA, "config.json")


def test_a_config_that_is_not_an_object_is_refused():
    for config in ([], "x", 3, None):
        with pytest.raises(LoadError, match="not an object"):
            check_model_config(config, LLAMA, "config.json")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from mlxio.weights import llm

    root = tmp_path_factory.mktemp("tiny")
    tiny = llm.tiny_policy("llama")
    llm.save_model_dir(tiny.model, tiny.tokenizer._tokenizer, tiny.config, root / "tiny")
    return root / "tiny"


@pytest.mark.parametrize(("field", "value", "words"), [
    ("num_hidden_layers", 1_000_000, "num_hidden_layers is 1000000 but the weights hold 2 layer"),
    ("hidden_size", "64", "hidden_size is '64', not a whole number"),
    ("num_attention_heads", 0, "num_attention_heads is 0"),
    ("max_position_embeddings", 1e30, r"max_position_embeddings is 1e\+30"),
])
def test_a_policy_folder_with_a_lying_config_is_refused_before_building(tiny_dir, tmp_path, field, value, words):
    from mlxio.weights import llm

    folder = tmp_path / "m"
    shutil.copytree(tiny_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, field: value}))
    with pytest.raises(LoadError, match=words) as caught:
        llm.load_policy(folder)
    assert str(folder / "config.json") in caught.value.contract_line()


def test_an_encoder_folder_with_a_lying_config_is_refused(tmp_path):
    from mlxio.weights.encoders import default_encoder_path, load_encoder

    folder = tmp_path / "enc"
    shutil.copytree(default_encoder_path(), folder)
    config = json.loads((folder / "config.json").read_text())
    for field, value, words in (("num_hidden_layers", 1_000_000, "weights hold 6 layer"),
                                ("hidden_size", "384", "hidden_size is '384'"), ("hidden_size", 768, "norm layers")):
        (folder / "config.json").write_text(json.dumps({**config, field: value}))
        with pytest.raises(LoadError, match=words):
            load_encoder(folder)
