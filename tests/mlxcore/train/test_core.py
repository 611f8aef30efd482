"""Properties of the pure core: tree ops, LoRA, optimizer, clipping, guard, accumulation, step."""

import mlx.core as mx
import mlx.optimizers as mlx_optim
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mlxcore.train import lora, optim, step, tree

RTOL, ATOL = 1e-5, 1e-6  # float32, a handful of small matmuls


def mlp(seed: int, d_in: int, d_hidden: int, d_out: int):
    keys = mx.random.split(mx.random.key(seed), 2)
    return {
        "blocks": [
            {"up": {"weight": mx.random.normal((d_hidden, d_in), key=keys[0]) * 0.3,
                    "bias": mx.zeros((d_hidden,))}},
            {"down": {"weight": mx.random.normal((d_out, d_hidden), key=keys[1]) * 0.3}},
        ]
    }


def forward(params, x, scale):
    h = mx.tanh(lora.linear(params["blocks"][0]["up"], x, scale))
    return lora.linear(params["blocks"][1]["down"], h, scale)


def with_adapters(params, seed, rank=3, nonzero_b=True):
    dims = lora.target_dims(params, ("up", "down"))
    adapters = lora.init(mx.random.key(seed), dims, rank)
    if nonzero_b:  # B = 0 at init; give it values so the delta is not trivially zero
        adapters = tree.map_leaves(lambda x: x + 0.1 * mx.random.normal(x.shape, key=mx.random.key(seed + 1)), adapters)
    return tree.combine(params, adapters)


def mse_loss(scale):
    def loss_fn(params, batch, key):
        err = forward(params, batch["x"], scale) - batch["y"]
        loss = mx.mean(err**2)
        return loss, {"mse": loss}
    return loss_fn


def batch_of(seed, accum, micro, d_in=5, d_out=2):
    k1, k2 = mx.random.split(mx.random.key(seed), 2)
    return {"x": mx.random.normal((accum, micro, d_in), key=k1),
            "y": mx.random.normal((accum, micro, d_out), key=k2)}


dims_strategy = st.tuples(st.integers(1, 6), st.integers(1, 8), st.integers(1, 4))


@given(seed=st.integers(0, 2**16), dims=dims_strategy)
def test_partition_combine_round_trip(seed, dims):
    params = with_adapters(mlp(seed, *dims), seed)
    selected, rest = tree.partition(params, lora.is_lora_path)
    assert all(lora.is_lora_path(p) for p in tree.flatten(selected))
    assert not any(lora.is_lora_path(p) for p in tree.flatten(rest))
    again = tree.flatten(tree.combine(selected, rest))
    original = tree.flatten(params)
    assert again.keys() == original.keys()
    assert all(mx.array_equal(again[k], original[k]) for k in original)


def test_combine_refuses_overlap():
    params = mlp(0, 2, 3, 1)
    with pytest.raises(ValueError, match="more than one tree"):
        tree.combine(params, params)


@given(seed=st.integers(0, 2**16), dims=dims_strategy, rslora=st.booleans())
def test_merged_lora_forward_equals_unmerged(seed, dims, rslora):
    cfg = lora.LoraConfig(rank=3, alpha=6.0, targets=("up", "down"), rslora=rslora)
    params = with_adapters(mlp(seed, *dims), seed, rank=cfg.rank)
    x = mx.random.normal((4, dims[0]), key=mx.random.key(seed + 7))
    merged, count = lora.merge(params, cfg.scale)
    assert count == 2
    assert not any(lora.is_lora_path(p) for p in tree.flatten(merged))
    np.testing.assert_allclose(forward(merged, x, cfg.scale), forward(params, x, cfg.scale), rtol=1e-4, atol=1e-5)
    adapters, _ = tree.partition(params, lora.is_lora_path)
    base, count = lora.unmerge(merged, adapters, cfg.scale)
    assert count == 2
    original, _ = tree.partition(params, lambda p, _: not lora.is_lora_path(p))
    for path, value in tree.flatten(original).items():
        np.testing.assert_allclose(tree.flatten(base)[path], value, rtol=1e-5, atol=1e-6)


def test_fresh_adapter_is_identity_and_init_is_deterministic():
    params = mlp(3, 4, 6, 2)
    dims = lora.target_dims(params, ("up", "down"))
    a = lora.init(mx.random.key(1), dims, 4)
    b = lora.init(mx.random.key(1), dict(reversed(dims.items())), 4)
    for path, leaf in tree.flatten(a).items():
        assert mx.array_equal(leaf, tree.flatten(b)[path])
    x = mx.random.normal((3, 4))
    assert mx.array_equal(forward(tree.combine(params, a), x, 2.0), forward(params, x, 2.0))
    assert tree.flatten(a)["blocks.0.up.lora_a"].shape == (4, 4)
    assert tree.flatten(a)["blocks.0.up.lora_b"].shape == (4, 6)


def test_target_selection_by_suffix_and_regex():
    params = {"layer": [{"attention": {"self": {n: {"weight": mx.zeros((4, 4))} for n in ("query", "key", "value")}}}]}
    assert set(lora.target_dims(params, ("query", "value"))) == {
        "layer.0.attention.self.query", "layer.0.attention.self.value"}
    assert set(lora.target_dims(params, ("re:self\\.(key|query)$",))) == {
        "layer.0.attention.self.query", "layer.0.attention.self.key"}
    with pytest.raises(ValueError, match="no linear layer"):
        lora.target_dims(params, ("q_proj",))


def test_lora_dropout_needs_key_and_scales_kept_units():
    x = mx.ones((64, 8))
    a, b = mx.eye(8)[:, :4], mx.eye(4, 8)
    with pytest.raises(ValueError, match="key"):
        lora.delta(x, a, b, 1.0, dropout=0.5)
    out = lora.delta(x, a, b, 1.0, dropout=0.5, key=mx.random.key(0))
    values = set(np.unique(np.array(out)).tolist())
    assert values <= {0.0, 2.0} and len(values) == 2


@given(seed=st.integers(0, 2**16), max_norm=st.floats(0.01, 10.0))
def test_clipping_bounds_global_norm(seed, max_norm):
    grads = tree.flatten(mlp(seed, 3, 5, 2))
    clipped, norm = optim.clip_by_global_norm(tree.unflatten(grads), max_norm)
    new_norm = float(mx.sqrt(sum(mx.sum(g**2) for g in tree.flatten(clipped).values())))
    assert new_norm <= max_norm * (1 + 1e-5)
    assert new_norm == pytest.approx(min(float(norm), max_norm), rel=1e-4)


@given(seed=st.integers(0, 2**16), lr=st.floats(1e-4, 1e-1), wd=st.floats(0.0, 0.1))
def test_adamw_update_equals_mlx_optimizer(seed, lr, wd):
    cfg = optim.OptimConfig(lr=lr, weight_decay=wd, warmup_steps=0, total_steps=10**9)
    opt = optim.make_optimizer(cfg)
    params = mlp(seed, 3, 4, 2)
    grads = mlp(seed + 1, 3, 4, 2)
    state = opt.init(params)
    ours, _ = opt.update(grads, state, params)
    ours, _ = opt.update(grads, _, ours)
    ref = mlx_optim.AdamW(learning_rate=mlx_optim.cosine_decay(lr, 10**9, 0.0), weight_decay=wd)
    theirs = ref.apply_gradients(grads, params)
    theirs = ref.apply_gradients(grads, theirs)
    for path, value in tree.flatten(theirs).items():
        np.testing.assert_array_equal(tree.flatten(ours)[path], value)


def test_update_leaves_callers_state_untouched():
    opt = optim.make_optimizer(optim.OptimConfig(lr=0.1, warmup_steps=0))
    params = mlp(0, 2, 3, 1)
    state = opt.init(params)
    before = {k: mx.array(v) for k, v in tree.flatten(state).items()}
    opt.update(mlp(1, 2, 3, 1), state, params)
    for path, value in tree.flatten(state).items():
        assert mx.array_equal(value, before[path]), path


def test_schedule_warms_up_then_decays():
    sched = optim.schedule(optim.OptimConfig(lr=1.0, warmup_steps=10, total_steps=110, min_lr_ratio=0.1))
    lrs = [float(sched(mx.array(s))) for s in (0, 5, 10, 60, 110)]
    assert lrs[0] == 0.0 and lrs[1] == pytest.approx(0.5) and lrs[2] == pytest.approx(1.0)
    assert lrs[3] == pytest.approx(0.55, rel=1e-4) and lrs[4] == pytest.approx(0.1, rel=1e-4)


def make(accum_seed=0, jit=True, clip=1.0, eval_micro_batches=False):
    cfg = optim.OptimConfig(lr=1e-2, warmup_steps=0, total_steps=100, clip_norm=clip)
    opt = optim.make_optimizer(cfg)
    params = with_adapters(mlp(accum_seed, 5, 7, 2), accum_seed)
    fn = step.make_train_step(mse_loss(2.0), opt, clip_norm=cfg.clip_norm, jit=jit,
                              eval_micro_batches=eval_micro_batches)
    return fn, params, step.init_state(opt, params)


@given(seed=st.integers(0, 2**16))
def test_compiled_step_equals_eager_step(seed):
    compiled, params, state = make(seed, jit=True)
    eager, _, _ = make(seed, jit=False)
    p1, s1, p2, s2 = params, state, params, state
    for i in range(3):
        batch = batch_of(seed + i, 2, 4)
        p1, s1, m1 = compiled(p1, s1, batch, mx.array(i))
        p2, s2, m2 = eager(p2, s2, batch, mx.array(i))
        np.testing.assert_allclose(m1["loss"], m2["loss"], rtol=RTOL, atol=ATOL)
    for path, value in tree.flatten(p2).items():
        np.testing.assert_allclose(tree.flatten(p1)[path], value, rtol=RTOL, atol=ATOL)


@given(seed=st.integers(0, 2**16), accum=st.integers(1, 4), micro=st.integers(1, 4))
def test_accumulation_equals_concatenated_batch(seed, accum, micro):
    fn, params, state = make(seed, clip=0.0)
    batch = batch_of(seed, accum, micro)
    whole = tree.map_leaves(lambda x: x.reshape(1, accum * micro, *x.shape[2:]), batch)
    p_acc, s_acc, m_acc = fn(params, state, batch, mx.array(0))
    p_one, s_one, m_one = fn(params, state, whole, mx.array(0))
    np.testing.assert_allclose(m_acc["loss"], m_one["loss"], rtol=1e-5, atol=1e-6)
    for path, value in tree.flatten(p_one).items():
        np.testing.assert_allclose(tree.flatten(p_acc)[path], value, rtol=1e-4, atol=1e-6)


@given(seed=st.integers(0, 2**16), accum=st.integers(1, 4), jit=st.booleans())
def test_micro_batch_evaluation_equals_one_graph(seed, accum, jit):
    """eval_micro_batches (one graph per micro-batch) trains the same as the fused step."""
    fused, params, state = make(seed)
    split, _, _ = make(seed, jit=jit, eval_micro_batches=True)
    p1, s1, p2, s2 = params, state, params, state
    for i in range(2):
        batch = batch_of(seed + i, accum, 3)
        p1, s1, m1 = fused(p1, s1, batch, mx.array(i))
        p2, s2, m2 = split(p2, s2, batch, mx.array(i))
        for name in ("loss", "grad_norm", "skipped"):
            np.testing.assert_allclose(m1[name], m2[name], rtol=RTOL, atol=ATOL)
    for path, value in tree.flatten(p1).items():
        np.testing.assert_allclose(tree.flatten(p2)[path], value, rtol=RTOL, atol=ATOL)
    for path, value in tree.flatten(s1).items():
        np.testing.assert_allclose(tree.flatten(s2)[path], value, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("poison", [float("nan"), float("inf")])
def test_non_finite_gradient_skips_update_bit_identically(poison):
    fn, params, state = make(0)
    batch = batch_of(0, 2, 3)
    params, state, _ = fn(params, state, batch, mx.array(0))  # one real step first
    bad = {"x": batch["x"], "y": mx.where(mx.arange(2)[:, None, None] == 1, poison, batch["y"])}
    new_params, new_state, metrics = fn(params, state, bad, mx.array(1))
    assert int(metrics["skipped"]) == 1
    assert int(new_state["skips"]) == 1 and int(new_state["consecutive_skips"]) == 1
    for path, value in tree.flatten(params).items():
        assert mx.array_equal(tree.flatten(new_params)[path], value), path
    for path, value in tree.flatten(state["optim"]).items():
        assert mx.array_equal(tree.flatten(new_state["optim"])[path], value), path
    again, again_state, _ = fn(new_params, new_state, bad, mx.array(2))
    assert int(again_state["consecutive_skips"]) == 2
    _, ok_state, _ = fn(again, again_state, batch, mx.array(3))
    assert int(ok_state["consecutive_skips"]) == 0 and int(ok_state["skips"]) == 2


def test_step_trains_only_lora_leaves():
    fn, params, state = make(0)
    new_params, _, _ = fn(params, state, batch_of(0, 1, 4), mx.array(0))
    for path, value in tree.flatten(params).items():
        changed = not mx.array_equal(tree.flatten(new_params)[path], value)
        assert changed == lora.is_lora_path(path), path
