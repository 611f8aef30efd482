"""optim.flat_update (the update chain on one concatenated vector, used off the CPU) gives the
leaf-by-leaf chain's parameters, optimizer state (same per-leaf layout) and metrics: float32
within 1e-6 relative (the global norm is summed in another order), over several steps, with
clipping active or not, and bit-identical no-ops on a non-finite gradient."""

import mlx.core as mx
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from mlx.utils import tree_flatten

from mlxcore.train import optim
from mlxcore.train.step import update_chain


def _tree(rng, shapes, scale=1.0):
    return {"encoder": {"layer": [{"q": {"lora_a": mx.array(rng.normal(0, scale, a).astype(np.float32)),
                                         "lora_b": mx.array(rng.normal(0, scale, b).astype(np.float32))}}
                                  for a, b in shapes]},
            "projection": {"weight": mx.array(rng.normal(0, scale, (3, 5)).astype(np.float32))}}


def _close(a, b, rtol=1e-6):
    fa, fb = tree_flatten(a), tree_flatten(b)
    assert [p for p, _ in fa] == [p for p, _ in fb]
    for (path, x), (_, y) in zip(fa, fb, strict=True):
        assert x.shape == y.shape and x.dtype == y.dtype, path
        np.testing.assert_allclose(np.array(x), np.array(y), rtol=rtol, atol=1e-7, err_msg=path)


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 999), st.sampled_from([0.0, 0.05, 100.0]), st.sampled_from(["adamw", "adam"]))
def test_flat_update_equals_leaf_by_leaf(seed, clip_norm, name):
    rng = np.random.default_rng(seed)
    shapes = [((4, 2), (2, 6)), ((4, 2), (2, 6)), ((7, 3), (3, 1))]
    params = _tree(rng, shapes)
    opt = optim.make_optimizer(optim.OptimConfig(name=name, lr=1e-2, warmup_steps=2, total_steps=10))
    chain = update_chain(opt, clip_norm)
    flat = optim.flat_update(chain)
    state_a = state_b = chain.init(params)
    pa = pb = params
    for step in range(4):
        grads = _tree(np.random.default_rng(seed * 10 + step), shapes, 0.5)
        loss = mx.array(1.0)
        pa, state_a, info_a = chain.update(grads, state_a, pa, loss=loss)
        pb, state_b, info_b = flat.update(grads, state_b, pb, loss=loss)
        _close(pa, pb)
        _close(state_a, state_b)
        np.testing.assert_allclose(float(info_a["grad_norm"]), float(info_b["grad_norm"]), rtol=1e-6)


def test_flat_update_skips_non_finite_bit_identically():
    rng = np.random.default_rng(0)
    shapes = [((4, 2), (2, 6)), ((4, 2), (2, 6))]
    params = _tree(rng, shapes)
    flat = optim.flat_update(update_chain(optim.make_optimizer(optim.OptimConfig(lr=1e-2))))
    state = flat.init(params)
    grads = _tree(rng, shapes)
    grads["encoder"]["layer"][1]["q"]["lora_b"] = grads["encoder"]["layer"][1]["q"]["lora_b"] * float("nan")
    new, new_state, info = flat.update(grads, state, params, loss=mx.array(1.0))
    assert int(info["skipped"]) == 1 and int(new_state["skips"]) == 1
    for (path, x), (_, y) in zip(tree_flatten(new), tree_flatten(params), strict=True):
        assert np.array_equal(np.array(x), np.array(y)), path


def test_mixed_dtypes_take_the_leaf_by_leaf_path():
    rng = np.random.default_rng(0)
    params = _tree(rng, [((4, 2), (2, 6))])
    params["projection"]["weight"] = params["projection"]["weight"].astype(mx.bfloat16)
    chain = update_chain(optim.make_optimizer(optim.OptimConfig(lr=1e-2)))
    grads = _tree(rng, [((4, 2), (2, 6))])
    grads["projection"]["weight"] = grads["projection"]["weight"].astype(mx.bfloat16)
    a = chain.update(grads, chain.init(params), params, loss=mx.array(1.0))
    b = optim.flat_update(chain).update(grads, chain.init(params), params, loss=mx.array(1.0))
    for (path, x), (_, y) in zip(tree_flatten(a[:2]), tree_flatten(b[:2]), strict=True):
        assert np.array_equal(np.array(x.astype(mx.float32)), np.array(y.astype(mx.float32))), path


def test_flat_update_compiles_to_the_eager_result():
    rng = np.random.default_rng(1)
    shapes = [((4, 2), (2, 6)), ((5, 2), (2, 3))]
    params, grads = _tree(rng, shapes), _tree(rng, shapes, 0.5)
    flat = optim.flat_update(update_chain(optim.make_optimizer(optim.OptimConfig(lr=1e-2)), 0.1))
    state = flat.init(params)
    eager = flat.update(grads, state, params, loss=mx.array(1.0))
    compiled = mx.compile(lambda g, s, p: flat.update(g, s, p, loss=mx.array(1.0)))(grads, state, params)
    _close(eager[:2], compiled[:2])
