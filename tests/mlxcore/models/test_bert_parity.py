"""BERT encoder parity with transformers' BertModel (CPU, float32): random tiny configs, and the
real all-MiniLM-L6-v2 on 50 real code snippets (stdlib function sources).

Tolerances: tiny configs, last hidden states max |mlx - torch| <= 1e-4 on real tokens
(post-LN keeps them O(1)); MiniLM, sentence-transformers pooling (mask-weighted mean of the last
hidden state) cosine >= 0.99999 for every snippet, and token ids identical to transformers'
tokenizer (truncation at 128 included).
"""

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.encode import batches, stdlib_snippets
from mlxcore.models import bert
from mlxcore.retrieval.encoder import hidden_states
from mlxcore.train.tree import unflatten
from mlxio.weights.encoders import (
    check_weights,
    default_encoder_path,
    load_encoder,
    sanitize,
    tokenize,
)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def to_mlx(model, kind: str, shapes: dict) -> dict:
    """state_dict -> MLX params tree through the loader's own sanitize + check_weights."""
    weights = sanitize({k: mx.array(v.detach().numpy()) for k, v in model.state_dict().items()}, kind)
    check_weights(weights, shapes, "torch state_dict")
    return unflatten(weights)


def padded_batch(rng, batch: int, length: int, vocab: int):
    """ids [B, T] int32 and a mask whose rows hold 1..T real tokens (row 0 full)."""
    ids = rng.integers(0, vocab, (batch, length)).astype(np.int32)
    lengths = rng.integers(1, length + 1, batch)
    lengths[0] = length
    return ids, np.arange(length)[None, :] < lengths[:, None]


def torch_bert(cfg: bert.BertConfig, seed: int):
    """A transformers BertModel (no pooler) of `cfg`, weights drawn N(0, 0.3^2), eval mode."""
    hf_cfg = transformers.BertConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
        intermediate_size=cfg.intermediate_size, hidden_act=cfg.hidden_act,
        max_position_embeddings=cfg.max_position_embeddings, type_vocab_size=cfg.type_vocab_size,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(seed)
    model = transformers.BertModel(hf_cfg, add_pooling_layer=False).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    assert bert.BertConfig.from_hf(hf_cfg.to_dict()) == cfg
    return model


@st.composite
def bert_configs(draw):
    heads = draw(st.integers(1, 4))
    return bert.BertConfig(
        vocab_size=draw(st.integers(8, 64)),
        hidden_size=heads * draw(st.integers(2, 8)),
        num_hidden_layers=draw(st.integers(1, 3)),
        num_attention_heads=heads,
        intermediate_size=draw(st.integers(4, 32)),
        max_position_embeddings=48,
        type_vocab_size=draw(st.integers(1, 2)),
        hidden_act=draw(st.sampled_from(bert.ACTIVATIONS)),
    )


@settings(max_examples=20)
@given(cfg=bert_configs(), batch=st.integers(1, 3), length=st.integers(1, 48),
       seed=st.integers(0, 2**16))
def test_bert_encoder_matches_transformers(cfg, batch, length, seed):
    model = torch_bert(cfg, seed)
    params = to_mlx(model, "bert", bert.param_shapes(cfg))
    ids, mask = padded_batch(np.random.default_rng(seed), batch, length, cfg.vocab_size)
    with torch.no_grad():
        ref = model(input_ids=torch.from_numpy(ids.astype(np.int64)),
                    attention_mask=torch.from_numpy(mask.astype(np.int64))).last_hidden_state
    out = np.array(bert.encode(params, mx.array(ids), mx.array(mask), cfg))
    assert np.abs(out - ref.numpy())[mask].max() <= 1e-4


def test_gelu_erf_matches_erf_gelu_with_finite_gradients():
    x = mx.array(np.concatenate([np.linspace(-12, 12, 24001), [-1e30, -1e4, 1e4, 1e30]])
                 .astype(np.float32))

    def exact(v):
        return 0.5 * v * (1.0 + mx.erf(v / np.sqrt(2.0)))

    np.testing.assert_allclose(np.array(bert.gelu_erf(x)), np.array(exact(x)), atol=1e-6, rtol=1e-6)
    grad, ref = (np.array(mx.vmap(mx.grad(f))(x)) for f in (bert.gelu_erf, exact))
    assert np.isfinite(grad).all() and np.abs(grad - ref).max() <= 2e-6


def test_too_long_input_is_an_error():
    cfg = bert.BertConfig(vocab_size=8, hidden_size=4, num_hidden_layers=1,
                          num_attention_heads=1, intermediate_size=4, max_position_embeddings=4)
    params = to_mlx(torch_bert(cfg, 0), "bert", bert.param_shapes(cfg))
    with pytest.raises(ValueError, match="max_position_embeddings"):
        bert.encode(params, mx.zeros((1, 5), mx.int32), mx.ones((1, 5)), cfg)


MAX_LENGTH = 128  # half sentence-transformers' 256: the same code paths, half the CPU time


def mean_pool(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """sentence-transformers' mean pooling: [B, T, D], [B, T] -> [B, D]."""
    return (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)


@pytest.fixture(scope="module")
def minilm():
    return load_encoder(default_encoder_path())


@pytest.mark.slow  # ~10 s on 2 idle cores (two MiniLM forwards over 50 snippets)
def test_minilm_code_embeddings_match_transformers(minilm):
    path = str(default_encoder_path())
    texts = stdlib_snippets(50, seed=3)
    ids, mask = tokenize(minilm.tokenizer, texts, max_length=MAX_LENGTH)
    ref_tok = transformers.AutoTokenizer.from_pretrained(path)(
        texts, truncation=True, max_length=MAX_LENGTH, padding="max_length", return_tensors="np")
    width = ids.shape[1]
    assert width % 32 == 0 and mask.sum(1).max() <= width <= MAX_LENGTH
    np.testing.assert_array_equal(ids, ref_tok["input_ids"][:, :width] * mask)
    np.testing.assert_array_equal(mask, ref_tok["attention_mask"][:, :width].astype(bool))
    assert mask.sum(1).max() == MAX_LENGTH  # some snippets are long enough to be truncated

    model = transformers.BertModel.from_pretrained(path).eval()
    cosines = []
    for batch_ids, batch_mask in batches(ids, mask, batch_size=10, bucket=32):  # length-sorted
        with torch.no_grad():
            ref = model(input_ids=torch.from_numpy(batch_ids.astype(np.int64)),
                        attention_mask=torch.from_numpy(batch_mask.astype(np.int64)))
        out = hidden_states(minilm.params, mx.array(batch_ids), mx.array(batch_mask), minilm.spec)
        a, b = mean_pool(np.array(out), batch_mask), mean_pool(ref.last_hidden_state.numpy(), batch_mask)
        cosines += list((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1))
    assert len(cosines) == 50 and min(cosines) >= 0.99999, min(cosines)


def test_encode_benchmark_checks_both_sides_compute_the_same_embeddings(minilm):
    """benchmarks/encode.py times MLX against PyTorch only after their token embeddings agree;
    a changed weight on one side is caught (invalid run, no ratio)."""
    from benchmarks import encode as bench
    from mlxcore.retrieval.encoder import token_embeddings

    path = str(default_encoder_path())
    ids, mask = tokenize(minilm.tokenizer, stdlib_snippets(8, seed=5), max_length=64)
    data = batches(ids, mask, batch_size=4, bucket=32)
    model = transformers.BertModel.from_pretrained(path).eval()
    encode = mx.compile(lambda p, i, m: token_embeddings(p, i, m, minilm.spec))
    same = bench.agreement(encode, minilm.params, model, data)
    assert same["ok"] and same["max_abs_diff"] < 1e-5 and same["batches"] == 2
    with torch.no_grad():
        model.encoder.layer[5].output.dense.weight[:8].mul_(1.5)  # a few output features change
    assert not bench.agreement(encode, minilm.params, model, data)["ok"]


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 64), st.floats(0.1, 8.0), st.integers(0, 2**16))
def test_gelu_recomputed_matches_the_erf_form_and_its_autodiff(n, spread, seed):
    """bert.gelu_recomputed (the GPU activation: custom vjp recomputing Phi + x phi) against
    0.5 x (1 + erf(x / sqrt 2)) and MLX autodiff of it: values 1e-6, gradients 1e-5 (float32)."""
    import math
    x = mx.random.normal((n,), key=mx.random.key(seed)) * spread
    c = mx.random.normal((n,), key=mx.random.key(seed + 1))
    ref = lambda x: 0.5 * x * (1.0 + mx.erf(x / math.sqrt(2.0)))  # noqa: E731
    np.testing.assert_allclose(np.array(bert.gelu_recomputed(x)), np.array(ref(x)), atol=1e-6, rtol=1e-6)
    for grad in (mx.grad, lambda f: mx.compile(mx.grad(f))):
        got = grad(lambda x: (bert.gelu_recomputed(x) * c).sum())(x)
        want = mx.grad(lambda x: (ref(x) * c).sum())(x)
        np.testing.assert_allclose(np.array(got), np.array(want), atol=1e-5, rtol=1e-5)
