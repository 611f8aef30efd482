"""Loading encoders from disk: round trips of tiny checkpoints written by transformers and by
MLX, sentence-transformers (2_Dense) and ColBERT (`linear.weight`) projections, PyTorch .bin
conversion, tokenisation, and a LoadError naming the key for every bad checkpoint."""

import json
import sys

import mlx.core as mx
import numpy as np
import pytest
from tokenizers import Tokenizer
from tokenizers.implementations import BertWordPieceTokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace

from mlxcore.retrieval.encoder import hidden_states, token_embeddings
from mlxcore.train.tree import flatten
from mlxio.errors import LoadError
from mlxio.weights.encoders import default_encoder_path, load_encoder, tokenize

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

WORDS = ["def", "return", "self", "x", "y", "(", ")", ":", "+", "if", "else", "for", "in"]


def bert_dir(tmp_path, seed=0):
    """A tiny BertModel saved by transformers (safetensors) with a WordPiece tokenizer.json."""
    cfg = transformers.BertConfig(vocab_size=24, hidden_size=8, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=16,
                                  max_position_embeddings=64)
    torch.manual_seed(seed)
    model = transformers.BertModel(cfg).eval()
    model.save_pretrained(tmp_path)
    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS])}
    BertWordPieceTokenizer(vocab).save(str(tmp_path / "tokenizer.json"))
    return model


def t5_dir(tmp_path, seed=0, full=False):
    """A tiny T5 (encoder only, or the full encoder-decoder) saved by transformers, with a
    word-level tokenizer.json that has no post-processor (the loader must add </s>)."""
    cfg = transformers.T5Config(vocab_size=24, d_model=8, d_kv=4, d_ff=16, num_layers=2,
                                num_heads=2, feed_forward_proj="gated-gelu", dropout_rate=0.0)
    torch.manual_seed(seed)
    cls = transformers.T5ForConditionalGeneration if full else transformers.T5EncoderModel
    model = cls(cfg).eval()
    model.save_pretrained(tmp_path)
    tok = Tokenizer(WordLevel({w: i for i, w in enumerate(["<pad>", "</s>", "<unk>", *WORDS])},
                              unk_token="<unk>"))
    tok.pre_tokenizer = Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    return model


def torch_hidden(model, ids, mask):
    encoder = model.get_encoder() if hasattr(model, "decoder") else model  # seq2seq: encoder half
    with torch.no_grad():
        return encoder(input_ids=torch.from_numpy(ids.astype(np.int64)),
                       attention_mask=torch.from_numpy(mask.astype(np.int64))).last_hidden_state.numpy()


TEXTS = ["def f ( x ) : return x + y", "for x in y", "if x"]


@pytest.mark.parametrize("kind", ["bert", "t5", "t5-full"])
def test_transformers_checkpoint_round_trip(tmp_path, kind):
    model = bert_dir(tmp_path) if kind == "bert" else t5_dir(tmp_path, full=kind == "t5-full")
    enc = load_encoder(tmp_path)
    assert enc.spec.kind == kind.split("-")[0] and enc.meta["projection"] is None
    flat = flatten(enc.params)
    dropped = ("decoder.", "lm_head.", "encoder.embed_tokens", "pooler.", "embeddings.position_ids")
    state = {k: v for k, v in model.state_dict().items() if not k.startswith(dropped)}
    assert set(flat) == set(state)
    for key, value in state.items():
        np.testing.assert_array_equal(np.array(flat[key]), value.numpy())
    ids, mask = tokenize(enc.tokenizer, TEXTS, max_length=16, bucket=8)
    assert ids.shape == (3, 16) and ids.dtype == np.int32 and mask.dtype == np.bool_
    lengths = mask.sum(1)
    if kind == "bert":
        assert (ids[:, 0] == 2).all() and (ids[np.arange(3), lengths - 1] == 3).all()  # CLS..SEP
    else:
        assert (ids[np.arange(3), lengths - 1] == 1).all()  # ... </s>
    out = np.array(hidden_states(enc.params, mx.array(ids), mx.array(mask), enc.spec))
    assert np.abs(out - torch_hidden(model, ids, mask))[mask].max() <= 1e-5


def test_mlx_saved_checkpoint_round_trip(tmp_path):
    bert_dir(tmp_path)
    enc = load_encoder(tmp_path)
    out_dir = tmp_path / "mlx"
    out_dir.mkdir()
    (out_dir / "config.json").write_text((tmp_path / "config.json").read_text())
    (out_dir / "tokenizer.json").write_text((tmp_path / "tokenizer.json").read_text())
    mx.save_safetensors(str(out_dir / "model.safetensors"), flatten(enc.params))
    again = load_encoder(out_dir)
    assert again.spec == enc.spec
    for key, value in flatten(enc.params).items():
        assert mx.array_equal(flatten(again.params)[key], value)


def test_tokenize_truncates_and_buckets(tmp_path):
    bert_dir(tmp_path)
    tok = load_encoder(tmp_path).tokenizer
    ids, mask = tokenize(tok, ["x " * 100, "y"], max_length=20, bucket=8)
    assert ids.shape == (2, 20) and mask.sum(1).tolist() == [20, 3]
    assert ids[0, -1] == 3 and ids[1, 2] == 3  # [SEP] survives truncation
    ids, mask = tokenize(tok, ["x y", "y"], max_length=20, bucket=8)
    assert ids.shape == (2, 8) and not mask[:, 4:].any() and (ids[~mask] == 0).all()


def write_dense(directory, weight, activation="torch.nn.modules.linear.Identity", as_bin=False):
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({
        "in_features": weight.shape[1], "out_features": weight.shape[0], "bias": False,
        "activation_function": activation}))
    if as_bin:
        torch.save({"linear.weight": torch.from_numpy(weight)}, directory / "pytorch_model.bin")
    else:
        mx.save_safetensors(str(directory / "model.safetensors"), {"linear.weight": mx.array(weight)})


def write_modules(root):
    (root / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"},
    ]))


@pytest.mark.parametrize("as_bin", [False, True])
def test_sentence_transformers_dense_gives_projection(tmp_path, as_bin):
    model = t5_dir(tmp_path)
    weight = np.random.default_rng(0).normal(size=(5, 8)).astype(np.float32)
    write_modules(tmp_path)
    write_dense(tmp_path / "2_Dense", weight, as_bin=as_bin)
    enc = load_encoder(tmp_path)
    assert enc.meta["projection"] == "2_Dense" and enc.meta["dim"] == 5
    np.testing.assert_array_equal(np.array(enc.params["projection"]["weight"]), weight)
    ids, mask = tokenize(enc.tokenizer, TEXTS, max_length=16, bucket=8)
    out = np.array(token_embeddings(enc.params, mx.array(ids), mx.array(mask), enc.spec))
    ref = torch_hidden(model, ids, mask) @ weight.T
    ref /= np.linalg.norm(ref, axis=-1, keepdims=True)
    assert np.abs(out - ref)[mask].max() <= 1e-5
    if as_bin:
        assert (tmp_path / "2_Dense" / "model.safetensors").is_file()  # converted once


def test_dense_with_activation_is_refused(tmp_path):
    t5_dir(tmp_path)
    write_modules(tmp_path)
    write_dense(tmp_path / "2_Dense", np.zeros((5, 8), np.float32),
                activation="torch.nn.modules.activation.Tanh")
    with pytest.raises(LoadError, match="Tanh"):
        load_encoder(tmp_path)


def test_colbert_checkpoint_gives_projection(tmp_path):
    """HF_ColBERT layout: `bert.`-prefixed BertModel weights plus `linear.weight` [dim, hidden]."""
    model = bert_dir(tmp_path)
    state = {f"bert.{k}": mx.array(v.numpy()) for k, v in model.state_dict().items()}
    state["linear.weight"] = mx.array(np.random.default_rng(1).normal(size=(4, 8)).astype(np.float32))
    (tmp_path / "model.safetensors").unlink()
    mx.save_safetensors(str(tmp_path / "model.safetensors"), state)
    enc = load_encoder(tmp_path)
    assert enc.meta["projection"] == "linear.weight" and enc.meta["dim"] == 4
    assert "pooler" not in enc.params
    ids, mask = tokenize(enc.tokenizer, TEXTS, max_length=16, bucket=8)
    assert token_embeddings(enc.params, mx.array(ids), mx.array(mask), enc.spec).shape == (3, 16, 4)


def rewrite_weights(directory, edit):
    weights = dict(mx.load(str(directory / "model.safetensors")))
    edit(weights)
    mx.save_safetensors(str(directory / "model.safetensors"), weights)


KEY = "encoder.layer.1.attention.self.value.weight"


@pytest.mark.parametrize("edit, message", [
    (lambda w: w.pop(KEY), "missing weight.*" + KEY),
    (lambda w: w.update({"encoder.layer.1.extra.weight": mx.zeros((2,))}),
     "unexpected weight.*encoder.layer.1.extra.weight"),
    (lambda w: w.update({KEY: mx.zeros((8, 4))}), KEY + ".*shape \\(8, 4\\), expected \\(8, 8\\)"),
])
def test_bad_weights_raise_load_error_naming_the_key(tmp_path, edit, message):
    bert_dir(tmp_path)
    rewrite_weights(tmp_path, edit)
    with pytest.raises(LoadError, match=message):
        load_encoder(tmp_path)


def test_pytorch_bin_is_converted_once(tmp_path):
    model = bert_dir(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
    first = load_encoder(tmp_path)
    assert first.meta["weights_file"] == "pytorch_model.bin"
    assert (tmp_path / "model.safetensors").is_file()
    second = load_encoder(tmp_path)
    assert second.meta["weights_file"] == "model.safetensors"
    for key, value in flatten(first.params).items():
        assert mx.array_equal(flatten(second.params)[key], value)
    # transformers reads the converted file back.
    again = transformers.BertModel.from_pretrained(tmp_path)
    np.testing.assert_array_equal(again.embeddings.word_embeddings.weight.detach().numpy(),
                                  model.embeddings.word_embeddings.weight.detach().numpy())


def test_pytorch_bin_without_torch_says_how_to_convert(tmp_path, monkeypatch):
    model = bert_dir(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now raises ImportError
    with pytest.raises(LoadError, match="pytorch_model.bin.*needs torch.*safetensors"):
        load_encoder(tmp_path)


def test_pickled_object_in_bin_is_refused(tmp_path):
    bert_dir(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    torch.save({"weights": object()}, tmp_path / "pytorch_model.bin")
    with pytest.raises(LoadError, match="weights_only"):
        load_encoder(tmp_path)


@pytest.mark.parametrize("edit, message", [
    ({"model_type": "gpt2"}, "model_type 'gpt2'"),
    ({"hidden_act": "swish"}, "hidden_act"),
    ({"num_hidden_layers": None}, "num_hidden_layers"),
])
def test_bad_config_raises_load_error(tmp_path, edit, message):
    bert_dir(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    for key, value in edit.items():
        if value is None:
            del config[key]
        else:
            config[key] = value
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(LoadError, match=f"config.json.*{message}"):
        load_encoder(tmp_path)


def test_unreachable_hub_id_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(LoadError, match="hub could not provide it"):
        load_encoder("no-such-org/no-such-encoder")
    with pytest.raises(LoadError, match="not a model directory"):
        load_encoder(tmp_path / "missing")


def test_default_encoder_is_minilm():
    enc = load_encoder(default_encoder_path())
    assert enc.spec.kind == "bert" and enc.spec.model.hidden_size == 384
    assert enc.meta["max_seq_length"] == 256 and enc.meta["dim"] == 384
