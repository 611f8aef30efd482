"""Group-wise quantisation: packing, both variants against a NumPy reference, quantised forward
(linear, embedding, whole encoder), rules, QAT's straight-through estimator, save/load."""

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlxcore.models import bert
from mlxcore.train import lora, quant
from mlxcore.train.tree import combine, flatten, partition, unflatten
from mlxio.errors import LoadError
from mlxio.weights import quantize as qio


def rand(shape, seed=0):
    return mx.array(np.random.default_rng(seed).normal(size=shape).astype(np.float32))


@given(bits=st.sampled_from([2, 4, 8]), rows=st.integers(1, 4), words=st.integers(1, 4),
       seed=st.integers(0, 2**31))
@settings(max_examples=15)
def test_pack_unpack_round_trip(bits, rows, words, seed):
    n = words * 32 // bits
    codes = np.random.default_rng(seed).integers(0, 1 << bits, size=(rows, n)).astype(np.uint32)
    packed = quant.pack(mx.array(codes), bits)
    assert packed.shape == (rows, words) and packed.dtype == mx.uint32
    np.testing.assert_array_equal(np.array(quant.unpack(packed, bits)), codes)


def test_pack_is_mlx_layout():
    w = rand((8, 128))
    packed, scales, biases = mx.quantize(w, group_size=32, bits=4)
    codes = quant.unpack(packed, 4).astype(mx.float32).reshape(8, 4, 32)
    ours = (codes * scales[..., None] + biases[..., None]).reshape(8, 128)
    assert mx.array_equal(ours, mx.dequantize(packed, scales, biases, group_size=32, bits=4))
    assert mx.array_equal(quant.pack(quant.unpack(packed, 4), 4), packed)


def numpy_symmetric(w, bits, group):
    g = w.reshape(w.shape[0], -1, group)
    qmax = 2 ** (bits - 1) - 1
    amax = np.abs(g).max(-1, keepdims=True)
    scale = np.where(amax > 0, amax / qmax, 1.0)
    return (np.clip(np.round(g / scale), -qmax, qmax) * scale).reshape(w.shape)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group", [32, 64, 128])
def test_symmetric_matches_numpy_reference(bits, group):
    w = rand((6, 256), seed=bits + group)
    w = w.at[0, :group].add(-w[0, :group])  # an all-zero group
    layer = quant.quantize_weight(w, quant.QuantRule(pattern="*", bits=bits, group_size=group, mode="symmetric"))
    deq = np.array(quant.dequantize_layer(layer, 256))
    np.testing.assert_allclose(deq, numpy_symmetric(np.array(w), bits, group), rtol=1e-5, atol=1e-6)
    assert np.all(deq[0, :group] == 0)
    codes = np.array(quant.unpack(layer["weight"], bits)).astype(np.int64) - 2 ** (bits - 1)
    assert codes.min() >= -(2 ** (bits - 1) - 1)  # the code -2^(b-1) is never used: symmetric range


@pytest.mark.parametrize("mode", quant.MODES)
@pytest.mark.parametrize("bits", [4, 8])
def test_error_is_within_a_step(mode, bits):
    # symmetric rounds to the nearest code: half a step. MLX's affine snaps the zero point to a
    # code (zero is exact), which can leave a group's edge up to one step away.
    w = rand((16, 128), seed=3)
    layer = quant.quantize_weight(w, quant.QuantRule(pattern="*", bits=bits, group_size=64, mode=mode))
    err = np.abs(np.array(quant.dequantize_layer(layer, 128)) - np.array(w)).reshape(16, 2, 64)
    step = np.abs(np.array(layer["scales"]))[..., None]  # MLX may store a negative scale
    assert np.all(err <= (0.5 if mode == "symmetric" else 1.0) * step + 1e-6)


@pytest.mark.parametrize("mode", quant.MODES)
@pytest.mark.parametrize("bits,group", [(4, 32), (4, 64), (8, 64), (4, 128)])
def test_quantized_linear_equals_dequantized_matmul(mode, bits, group):
    w, b, x = rand((24, 128), 1), rand((24,), 2), rand((3, 5, 128), 4)
    layer = {**quant.quantize_weight(w, quant.QuantRule(pattern="*", bits=bits, group_size=group, mode=mode)),
             "bias": b}
    assert quant.layer_format(layer, 128) == (bits, group)
    expected = x @ quant.dequantize_layer(layer, 128).T + b
    np.testing.assert_allclose(np.array(quant.linear(layer, x)), np.array(expected), rtol=1e-4, atol=1e-4)


def test_quantized_embedding_gathers_dequantized_rows():
    table = rand((50, 64), 5)
    layer = quant.quantize_weight(table, quant.QuantRule(pattern="*", bits=8, group_size=32))
    ids = mx.array([[0, 7, 49], [3, 3, 1]])
    expected = quant.dequantize_layer(layer, 64)[ids]
    assert mx.array_equal(quant.embed(layer, ids, 64), expected)
    assert mx.array_equal(quant.embed({"weight": table}, ids, 64), table[ids])


def test_parse_rule_and_first_match_wins():
    rules = tuple(quant.parse_rule(t) for t in ("*embeddings*=8/32", "encoder.layer.1.*=float",
                                                "*attention*=4/64/symmetric", "re:dense$=4/128"))
    assert rules[0] == quant.QuantRule(pattern="*embeddings*", bits=8, group_size=32)
    assert quant.rule_for("encoder.layer.1.attention.self.query", rules).bits is None
    assert quant.rule_for("encoder.layer.0.attention.self.query", rules).mode == "symmetric"
    assert quant.rule_for("encoder.layer.0.output.dense", rules).group_size == 128
    assert quant.rule_for("pooler.thing", rules) is None
    for bad, match in [("nopattern", "PATTERN="), ("*=x", "integers"), ("*=4/48", "group_size"),
                       ("*=3/64/symmetric", "bits"), ("*=4/64/nf4", "mode"), ("*=4/64/affine/1", "too many")]:
        with pytest.raises(ValueError, match=match):
            quant.parse_rule(bad)


CFG = bert.BertConfig(vocab_size=96, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=128, max_position_embeddings=32)


def tiny_bert(seed=0):
    keys = sorted(bert.param_shapes(CFG))
    return unflatten({k: rand(s, seed + i) * 0.1 for i, (k, s) in enumerate(
        (k, bert.param_shapes(CFG)[k]) for k in keys)})


def test_quantize_tree_rules_report_and_encoder_runs():
    params = tiny_bert()
    rules = tuple(quant.parse_rule(t) for t in ("*position_embeddings=float", "*embeddings*=8/32",
                                                "encoder.layer.1.output.dense=float", "*=4/64"))
    qtree, report = quant.quantize_tree(params, rules)
    layers = report["layers"]
    assert layers["embeddings.word_embeddings"] == {"bits": 8, "group_size": 32, "mode": "affine"}
    assert layers["encoder.layer.0.attention.self.query"]["bits"] == 4
    assert "encoder.layer.1.output.dense" in report["kept_float"]
    assert "embeddings.position_embeddings" in report["kept_float"]
    # token types: [2, 64] is quantised by *embeddings* (width 64 divides by 32)
    assert "embeddings.token_type_embeddings" in layers
    ids, mask = mx.array([[1, 5, 9, 0]]), mx.array([[1, 1, 1, 0]])
    deq = quant.dequantize_tree(qtree, layers)
    assert flatten(deq).keys() == flatten(params).keys()
    np.testing.assert_allclose(np.array(bert.encode(qtree, ids, mask, CFG)),
                               np.array(bert.encode(deq, ids, mask, CFG)), atol=2e-4)


def test_four_bit_compression_of_linear_weights():
    w = rand((384, 1536))
    layer = quant.quantize_weight(w, quant.QuantRule(pattern="*", bits=4, group_size=64))
    ratio = w.nbytes / quant.packed_bytes(layer)
    assert ratio >= 3.5  # float32 / (4 bits + fp32 scale and bias per 64) = 6.4
    assert ratio == pytest.approx(32 / (4 + 64 / 64), rel=1e-6)


def test_fake_quantize_forward_and_straight_through_gradient():
    rule = quant.QuantRule(pattern="*", bits=4, group_size=32)
    w = rand((8, 64), 6)
    fq = quant.fake_quantize(w, rule)
    assert mx.array_equal(fq, quant.dequantize_layer(quant.quantize_weight(w, rule), 64))
    upstream = rand((8, 64), 7)
    grad = mx.grad(lambda v: mx.sum(quant.fake_quantize(v, rule) * upstream))(w)
    assert mx.array_equal(grad, upstream)


def test_fake_quantize_tree_folds_adapters_and_trains_them():
    params = tiny_bert()
    adapters = lora.init(mx.random.key(0), lora.target_dims(params, ("query", "value")), 4)
    adapters = {k: v for k, v in flatten(adapters).items()}
    adapters = unflatten({k: (v + 0.05 if k.endswith("lora_b") else v) for k, v in adapters.items()})
    full = combine(params, adapters)
    rules = (quant.parse_rule("*=4/32"),)
    fq = quant.fake_quantize_tree(full, rules, lora_scale=2.0)
    assert not any(lora.is_lora_path(p) for p in flatten(fq))
    merged, _ = lora.merge(full, 2.0)
    ptq, report = quant.quantize_tree(merged, rules)
    deq = quant.dequantize_tree(ptq, report["layers"])
    np.testing.assert_allclose(np.array(fq["encoder"]["layer"][0]["attention"]["self"]["query"]["weight"]),
                               np.array(deq["encoder"]["layer"][0]["attention"]["self"]["query"]["weight"]),
                               atol=1e-6)
    only = quant.fake_quantize_tree(full, rules, 2.0, adapted_only=True)
    assert mx.array_equal(only["encoder"]["layer"][0]["attention"]["self"]["key"]["weight"],
                          params["encoder"]["layer"][0]["attention"]["self"]["key"]["weight"])
    train, frozen = partition(full, lora.is_lora_path)
    ids, mask = mx.array([[1, 5, 9, 2]]), mx.ones((1, 4))

    def loss(train):
        p = quant.fake_quantize_tree(combine(train, frozen), rules, 2.0)
        return bert.encode(p, ids, mask, CFG).sum()

    grads = flatten(mx.grad(loss)(train))
    assert set(grads) == set(flatten(train))
    assert all(float(mx.abs(g).max()) > 0 for g in grads.values())


def test_qlora_dims_and_training_on_quantized_base():
    params = tiny_bert()
    qtree, report = quant.quantize_tree(params, (quant.parse_rule("*=4/32"),))
    with pytest.raises(ValueError, match="quantised"):
        lora.target_dims(qtree, ("query",))
    dims = quant.linear_dims(qtree, report["layers"], ("query", "value"))
    assert dims == {f"encoder.layer.{i}.attention.self.{n}": (64, 64) for i in (0, 1) for n in ("query", "value")}
    full = combine(qtree, lora.init(mx.random.key(1), dims, 4))
    train, frozen = partition(full, lora.is_lora_path)
    ids, mask = mx.array([[1, 5, 9, 2]]), mx.ones((1, 4))
    grads = mx.grad(lambda t: bert.encode(combine(t, frozen), ids, mask, CFG).sum())(train)
    assert any(float(mx.abs(g).max()) > 0 for g in flatten(grads).values())


def test_save_load_round_trip(tmp_path):
    params = tiny_bert()
    qtree, report = quant.quantize_tree(params, (quant.parse_rule("*attention*=4/32/symmetric"),
                                                 quant.parse_rule("*=8/64")))
    qio.save_quantized(tmp_path / "q", qtree, report, extra={"model": "tiny"})
    loaded, loaded_report = qio.load_quantized(tmp_path / "q")
    assert loaded_report["layers"] == report["layers"]
    assert loaded_report["extra"] == {"model": "tiny"}
    a, b = flatten(qtree), flatten(loaded)
    assert a.keys() == b.keys() and all(mx.array_equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)
    summary = qio.compression_summary(params, qtree, report["layers"])
    assert summary["quantized_layers"] == len(report["layers"])
    assert summary["linear_ratio"] > 3.5


def test_load_refuses_inconsistent_files(tmp_path):
    params = tiny_bert()
    qtree, report = quant.quantize_tree(params, (quant.parse_rule("*=4/32"),))
    qio.save_quantized(tmp_path / "q", qtree, report)
    cfg_path = tmp_path / "q" / qio.CONFIG_NAME
    text = cfg_path.read_text()
    cfg_path.write_text(text.replace('"bits": 4', '"bits": 8', 1))
    with pytest.raises(LoadError, match="bits"):
        qio.load_quantized(tmp_path / "q")
    cfg_path.write_text("{not json")
    with pytest.raises(LoadError, match=qio.CONFIG_NAME):
        qio.load_quantized(tmp_path / "q")
