"""The chained update (mlxcore.train.optim transforms, mlxcore.train.step.update_chain) equals the update it
replaced - reduce, finite check, clip, mlx.optimizers step, select - bit for bit, skips included."""

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from mlxcore.train.optim import (
    OptimConfig,
    all_finite,
    chain,
    clip,
    clip_by_global_norm,
    make_optimizer,
    select_tree,
)
from mlxcore.train.step import update_chain


def old_apply(optimizer, clip_norm, reduce_grads, train, opt_state, loss, grads):
    """mlxcore.train.step's update before the chain (verbatim)."""
    if reduce_grads is not None:
        grads = reduce_grads(grads)
    finite = all_finite(loss, grads)
    grads, grad_norm = clip_by_global_norm(grads, clip_norm)
    new_train, new_optim = optimizer.update(grads, opt_state["optim"], train)
    new_train = select_tree(finite, new_train, train)
    new_optim = select_tree(finite, new_optim, opt_state["optim"])
    skipped = (~finite).astype(mx.int32)
    new_state = {"optim": new_optim, "skips": opt_state["skips"] + skipped,
                 "consecutive_skips": (opt_state["consecutive_skips"] + 1) * skipped}
    return new_train, new_state, {"grad_norm": grad_norm, "skipped": skipped}


@pytest.mark.parametrize("clip_norm,reduce", [(1.0, False), (0.0, False), (0.5, True)])
def test_chain_equals_the_old_update_bit_for_bit(clip_norm, reduce):
    rng = np.random.default_rng(0)
    optimizer = make_optimizer(OptimConfig(lr=1e-2, warmup_steps=2, total_steps=8, weight_decay=0.01))
    reduce_grads = (lambda g: {k: v * 0.5 for k, v in g.items()}) if reduce else None
    params = {"a": mx.array(rng.normal(size=(3, 4)).astype(np.float32)), "b": mx.array(rng.normal(size=5).astype(np.float32))}
    tx = update_chain(optimizer, clip_norm, reduce_grads)
    state_new = tx.init(params)
    state_old = {"optim": optimizer.init(params), "skips": mx.array(0, mx.int32),
                 "consecutive_skips": mx.array(0, mx.int32)}
    assert list(state_new) == list(state_old)
    p_new = p_old = params
    for i in range(6):
        grads = {k: mx.array(rng.normal(size=v.shape).astype(np.float32) * 3) for k, v in params.items()}
        if i == 3:
            grads["b"] = grads["b"] * float("nan")
        loss = mx.array(float("inf") if i == 4 else 1.5)
        p_new, state_new, info_new = mx.compile(tx.update)(grads, state_new, p_new, loss=loss)
        p_old, state_old, info_old = old_apply(optimizer, clip_norm, reduce_grads, p_old, state_old, loss, grads)
        for k in params:
            assert mx.array_equal(p_new[k], p_old[k]), (i, k)
        flat_new, flat_old = tree_flatten(state_new), tree_flatten(state_old)
        assert [k for k, _ in flat_new] == [k for k, _ in flat_old]
        assert all(mx.array_equal(a, b) for (_, a), (_, b) in zip(flat_new, flat_old, strict=True))
        for k in info_old:
            assert mx.array_equal(info_new[k], info_old[k], equal_nan=True), (i, k)
    assert int(state_new["skips"]) == 2


def test_chain_composes_left_to_right():
    doubled = chain(clip(0.0), clip(1.0))
    grads = {"g": mx.array([3.0, 4.0])}
    out, state, info = doubled.update(grads, doubled.init(grads), grads)
    assert state == {} and abs(float(info["grad_norm"]) - 5.0) < 1e-6  # the last clip's norm
    assert np.allclose(np.array(out["g"]), [0.6, 0.8])
