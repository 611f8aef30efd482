"""Gradient checkpointing, bf16 mixed precision, the lazy eval interval and QAT wiring: each
changes memory or speed, never the math beyond what its dtype implies."""

import attrs
import mlx.core as mx
import numpy as np
import pytest

from mlxcore.models import bert, t5
from mlxcore.retrieval import objective
from mlxcore.retrieval.encoder import EncoderSpec
from mlxcore.train import lora, precision, quant
from mlxcore.train.optim import OptimConfig, make_optimizer
from mlxcore.train.step import init_state, make_train_step
from mlxcore.train.tree import combine, flatten, partition, unflatten
from mlxio.run.batch_probe import synthetic_batch
from mlxio.weights.quantize import parse_rules

BERT = bert.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                       intermediate_size=64, max_position_embeddings=32)
T5 = t5.T5Config(vocab_size=64, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                 feed_forward_proj="gated-gelu")


def random_tree(shapes, seed=0):
    rng = np.random.default_rng(seed)
    return unflatten({k: mx.array(rng.normal(0, 0.1, s).astype(np.float32)) for k, s in shapes.items()})


def with_adapters(params, targets):
    adapters = flatten(lora.init(mx.random.key(1), lora.target_dims(params, targets), 4))
    adapters = {k: v + 0.05 if k.endswith("lora_b") else v for k, v in adapters.items()}  # non-zero B
    return combine(params, unflatten(adapters))


CASES = {"bert": (bert, BERT, bert.param_shapes(BERT), ("query", "value")),
         "t5": (t5, T5, t5.param_shapes(T5), ("q", "v"))}


@pytest.mark.parametrize("kind,dropout", [("bert", 0.0), ("bert", 0.1), ("t5", 0.1)])
def test_checkpointing_gives_the_same_gradients(kind, dropout):
    module, cfg, shapes, targets = CASES[kind]
    params = with_adapters(random_tree(shapes), targets)
    train, frozen = partition(params, lora.is_lora_path)
    ids = mx.array([[3, 9, 1, 4, 0], [5, 2, 8, 0, 0]])
    mask = (ids > 0).astype(mx.int32)

    def grads(model_cfg):
        def loss(t):
            return module.encode(combine(t, frozen), ids, mask, model_cfg, 2.0, dropout, mx.random.key(7)).sum()
        return flatten(mx.compile(mx.grad(loss))(train))

    plain, checkpointed = grads(cfg), grads(attrs.evolve(cfg, gradient_checkpointing=True))
    for key in plain:
        np.testing.assert_allclose(np.array(checkpointed[key]), np.array(plain[key]), rtol=1e-5, atol=1e-6)


def tiny_setup(dtype="float32", qat=()):
    params = with_adapters(random_tree(bert.param_shapes(BERT)), ("query", "value"))
    params = precision.cast_frozen(params, lora.is_lora_path, dtype)
    spec = EncoderSpec(kind="bert", model=BERT, lora_scale=2.0)
    loss_fn = objective.contrastive_loss_fn(spec)
    if qat:
        loss_fn = objective.with_fake_quant(loss_fn, parse_rules(qat, "qat"), 2.0)
    optimizer = make_optimizer(OptimConfig(lr=1e-2, warmup_steps=1, total_steps=10))
    step = make_train_step(loss_fn, optimizer)
    batch = synthetic_batch(BERT.vocab_size, 4, 2, 6, 10)
    return params, step, init_state(optimizer, params), batch


def test_bf16_keeps_lora_and_optimizer_state_in_float32():
    params, step, opt_state, batch = tiny_setup("bfloat16")
    flat = flatten(params)
    assert flat["encoder.layer.0.attention.self.query.weight"].dtype == mx.bfloat16
    assert flat["encoder.layer.0.attention.self.query.lora_a"].dtype == mx.float32
    for i in range(2):
        params, opt_state, metrics = step(params, opt_state, batch, mx.array(i))
    mx.eval(params, opt_state, metrics)
    assert np.isfinite(float(metrics["loss"])) and int(metrics["skipped"]) == 0
    assert all(v.dtype == mx.float32 for k, v in flatten(params).items() if lora.is_lora_path(k))
    assert all(v.dtype == mx.float32 for v in flatten(opt_state["optim"]).values()
               if mx.issubdtype(v.dtype, mx.floating))
    float_params, *_ = tiny_setup("float32")
    restored = flatten(precision.restore_frozen(params, float_params, lora.is_lora_path))
    assert restored["encoder.layer.0.attention.self.query.weight"].dtype == mx.float32
    assert mx.array_equal(restored["encoder.layer.0.attention.self.query.lora_a"],
                          flatten(params)["encoder.layer.0.attention.self.query.lora_a"])
    with pytest.raises(ValueError, match="compute dtype"):
        precision.cast_frozen(params, lora.is_lora_path, "float8")


def test_bf16_loss_tracks_float32_loss():
    p32, step32, s32, batch = tiny_setup("float32")
    p16, step16, s16, _ = tiny_setup("bfloat16")
    _, _, m32 = step32(p32, s32, batch, mx.array(0))
    _, _, m16 = step16(p16, s16, batch, mx.array(0))
    assert float(m16["loss"]) == pytest.approx(float(m32["loss"]), rel=0.05)


def test_lazy_eval_interval_gives_identical_results():
    params, step, opt_state, batch = tiny_setup()
    eager = (params, opt_state)
    for i in range(4):
        eager = step(*eager, batch, mx.array(i))[:2]
        mx.eval(eager)
    lazy = (params, opt_state)
    for i in range(4):
        lazy = step(*lazy, batch, mx.array(i))[:2]
    mx.eval(lazy)
    a, b = flatten(eager), flatten(lazy)
    assert all(mx.array_equal(a[k], b[k]) for k in a)


def test_qat_step_trains_through_fake_quantisation():
    params, step, opt_state, batch = tiny_setup(qat=("*=4/32",))
    before = flatten(params)
    for i in range(2):  # the first update has the warm-up's learning rate 0
        params, opt_state, metrics = step(params, opt_state, batch, mx.array(i))
    mx.eval(params, metrics)
    after = flatten(params)
    assert int(metrics["skipped"]) == 0
    assert any(not mx.array_equal(before[k], after[k]) for k in after if k.endswith("lora_b"))
    assert all(mx.array_equal(before[k], after[k]) for k in after if not lora.is_lora_path(k))
    # the loss it trains on is the loss of the fake-quantised model
    _, step_plain, _, _ = tiny_setup()
    fq = quant.fake_quantize_tree(params, (quant.parse_rule("*=4/32"),), 2.0)
    loss_fn = objective.contrastive_loss_fn(EncoderSpec(kind="bert", model=BERT, lora_scale=2.0))
    micro = {k: v[0] for k, v in batch.items()}
    wrapped = objective.with_fake_quant(loss_fn, (quant.parse_rule("*=4/32"),), 2.0)
    assert float(wrapped(params, micro, mx.random.key(0))[0]) == pytest.approx(
        float(loss_fn(fq, micro, mx.random.key(0))[0]), rel=1e-6)


def _activation_heavy_step(jit: bool):
    """A step whose loss keeps ~8 MB of activations per micro-batch of 4 x 65,536 (the inputs of
    its matmuls and tanh's outputs, saved for the backward pass) against 1 kB of parameters."""
    def loss(params, micro, key):
        h = micro["x"]
        for w in params["w"]:
            h = h + mx.tanh(h @ w) @ w.T
        return (h * h).mean(), {}

    return make_train_step(loss, make_optimizer(OptimConfig(lr=1e-2, warmup_steps=0, total_steps=10)),
                           trainable=lambda path, _: path.startswith("w"), jit=jit)


def live_peak(fn) -> int:
    """Peak bytes allocated while `fn()` is evaluated, MLX's run-ahead off: with a memory limit
    of 1 byte, evaluation waits for each queued op before the next (otherwise the host queues up
    to ~50 ops on the CPU, ~1,000 on an H100, ahead of those running, and their buffers count:
    `dev/rlaif_step_memory.py`), so this is what the graph itself keeps alive."""
    old = mx.set_memory_limit(1)
    try:
        mx.clear_cache()
        mx.reset_peak_memory()
        before = mx.get_active_memory()
        mx.eval(fn())
        return mx.get_peak_memory() - before
    finally:
        mx.set_memory_limit(old)


@pytest.mark.parametrize("jit", [True, False])
def test_one_graph_accumulation_holds_one_micro_batch_of_activations(jit):
    """One graph over k micro-batches (`mlxcore.train.step.accumulate`) runs them one after another:
    its peak memory stays near one micro-batch's, not k times it."""
    params = {"w": [mx.random.normal((32, 128), key=mx.random.key(i)) * 0.1 for i in range(3)]}
    step = _activation_heavy_step(jit)
    state = init_state(make_optimizer(OptimConfig(lr=1e-2, warmup_steps=0, total_steps=10)), params,
                       lambda path, _: path.startswith("w"))

    def peak(accum):
        batch = {"x": mx.random.uniform(shape=(accum, 4096, 32), key=mx.random.key(accum))}
        mx.eval(batch, params, state)
        mx.eval(step(params, state, batch, mx.array(0)))  # compiled before measuring
        return live_peak(lambda: step(params, state, batch, mx.array(0)))

    one, four = peak(1), peak(4)
    assert four < 1.3 * one, (one, four)
