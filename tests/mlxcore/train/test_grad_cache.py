"""The cached contrastive loss (mlxcore/train/grad_cache.py) against the plain one.

On a batch that fits, the loss and the LoRA gradients of k chunks of m pairs computed GradCache's
way equal `mx.value_and_grad` of the contrastive loss of the k x m pairs as one batch (float32:
loss rtol 1e-5; each gradient leaf within rtol 1e-4 and 1e-4 x its largest magnitude - the
encoder rounds a chunk's rows differently from the whole batch's, ~1e-7, and the contrastive
gradient amplifies that; weights drawn with std 0.5 so MaxSim scores spread, as a trained
model's do: with std 0.1 every score is ~0.9998 and the gradient is rounding noise), on BERT
and T5 encoders, with and without hard negatives, compiled or not; with LoRA dropout (no plain
counterpart: its masks follow the batch's shape) they equal the gradient of the same chunked
forward as one graph. A training step with `grad_cache` equals one from those gradients.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from mlx.utils import tree_map
from test_memory_options import BERT, T5, with_adapters  # tests/ helpers

from mlxcore.models import bert, t5
from mlxcore.retrieval import objective
from mlxcore.retrieval.encoder import EncoderSpec
from mlxcore.train import lora
from mlxcore.train.grad_cache import cached_value_and_grad, flat_batch
from mlxcore.train.optim import OptimConfig, make_optimizer
from mlxcore.train.step import init_state, make_train_step
from mlxcore.train.tree import combine, flatten, partition, unflatten

KINDS = {"bert": (BERT, bert.param_shapes(BERT), ("query", "value")),
         "t5": (T5, t5.param_shapes(T5), ("q", "v"))}


def setup(kind: str, dropout: float = 0.0, seed: int = 0):
    cfg, shapes, targets = KINDS[kind]
    rng = np.random.default_rng(seed)
    params = with_adapters(unflatten({k: mx.array(rng.normal(0, 0.5, s).astype(np.float32))
                                      for k, s in shapes.items()}), targets)
    spec = EncoderSpec(kind=kind, model=cfg, lora_scale=2.0, lora_dropout=dropout)
    return params, spec


def random_batch(rng, k: int, m: int, tq: int, td: int, negatives: int) -> dict:
    """Leaves [k, m, T]; padded tails (at least one real token per row)."""
    def ids_mask(*shape):
        ids = rng.integers(1, 64, shape).astype(np.int32)
        real = rng.integers(1, shape[-1] + 1, shape[:-1])
        mask = (np.arange(shape[-1]) < real[..., None]).astype(np.int32)
        return mx.array(ids * mask), mx.array(mask)

    out = {}
    out["query_ids"], out["query_mask"] = ids_mask(k, m, tq)
    out["doc_ids"], out["doc_mask"] = ids_mask(k, m, td)
    if negatives:
        out["neg_ids"], out["neg_mask"] = ids_mask(k, m, negatives, td)
    return out


def assert_trees_close(got: dict, want: dict, rtol=1e-4, scale_tol=1e-4):
    """Each leaf within rtol, or within scale_tol of the tree's largest gradient (float32 rounding
    in a gradient is relative to the terms it sums, which a leaf small by cancellation understates)."""
    got, want = flatten(got), flatten(want)
    assert got.keys() == want.keys()
    scale = max(float(np.abs(np.array(w)).max()) for w in want.values())
    for key in want:
        np.testing.assert_allclose(np.array(got[key]), np.array(want[key]), rtol=rtol, atol=scale_tol * scale,
                                   err_msg=key)


@settings(max_examples=12, deadline=None)
@given(kind=st.sampled_from(["bert", "t5"]), k=st.integers(1, 4), m=st.integers(1, 4), negatives=st.integers(0, 2),
       temperature=st.sampled_from([0.03, 0.07, 1.0]), seed=st.integers(0, 2**16), jit=st.booleans())
def test_cached_loss_and_grads_equal_the_plain_loss(kind, k, m, negatives, temperature, seed, jit):
    """In float64 on the CPU: the two paths sum in other orders, and in float32 their gradients
    differed by up to 2.4e-3 of the largest one under OpenBLAS's Haswell kernels (1 / temperature
    amplifies the similarities' rounding; a gradient small by cancellation shows it most), by far
    less under Sandybridge's. In float64 the same sums differ by ~1e-15 of it on any kernels, so
    1e-9 leaves room while a real difference between the paths would still show."""
    assume(k * m + negatives >= 2)  # the margin loss needs a negative
    params, spec = setup(kind, seed=seed)
    params = tree_map(lambda a: a.astype(mx.float64) if a.dtype == mx.float32 else a, params)
    train, frozen = partition(params, lora.is_lora_path)
    loss_cfg = objective.LossConfig(temperature=temperature)
    batch = random_batch(np.random.default_rng(seed), k, m, 5, 7, negatives)
    keys = mx.random.split(mx.random.key(seed), k)
    plain_fn = objective.contrastive_loss_fn(spec, loss_cfg)
    with mx.stream(mx.cpu):  # float64: CPU only
        (loss, aux), grads = mx.value_and_grad(lambda t: plain_fn(combine(t, frozen), flat_batch(batch), keys[0]))(train)
        c_loss, c_aux, c_grads = cached_value_and_grad(*objective.contrastive_parts(spec, loss_cfg), jit=jit)(
            train, frozen, batch, keys)
        assert all(g.dtype == mx.float64 for g in flatten(grads).values())
        np.testing.assert_allclose(float(c_loss), float(loss), rtol=1e-5)
        for name in aux:
            np.testing.assert_allclose(float(c_aux[name]), float(aux[name]), rtol=1e-5, atol=1e-7)
        assert_trees_close(c_grads, grads, rtol=1e-7, scale_tol=1e-9)


@pytest.mark.parametrize("kind", ["bert", "t5"])
def test_cached_grads_with_dropout_equal_the_chunked_graph(kind):
    params, spec = setup(kind, dropout=0.1)
    train, frozen = partition(params, lora.is_lora_path)
    embed, loss_on = objective.contrastive_parts(spec)
    batch = random_batch(np.random.default_rng(3), 3, 2, 5, 6, 1)
    keys = mx.random.split(mx.random.key(5), 3)

    def chunked(t):
        parts = [embed(combine(t, frozen), {n: v[j] for n, v in batch.items()}, keys[j]) for j in range(3)]
        return loss_on(tuple(mx.concatenate(p) for p in zip(*parts, strict=True)), flat_batch(batch))

    (loss, _), grads = mx.value_and_grad(chunked)(train)
    c_loss, _, c_grads = cached_value_and_grad(embed, loss_on)(train, frozen, batch, keys)
    np.testing.assert_allclose(float(c_loss), float(loss), rtol=1e-5)
    assert_trees_close(c_grads, grads)


def test_grad_cache_step_equals_a_step_on_its_gradients():
    params, spec = setup("bert")
    optimizer = make_optimizer(OptimConfig(lr=1e-2, warmup_steps=1, total_steps=10))
    batch = random_batch(np.random.default_rng(1), 4, 3, 5, 7, 0)
    step = make_train_step(None, optimizer, grad_cache=objective.contrastive_parts(spec), seed=0)
    new, state, metrics = step(params, init_state(optimizer, params), batch, mx.array(0))
    # the reference: the plain loss of all 12 pairs as one micro-batch (accum 1)
    plain = make_train_step(objective.contrastive_loss_fn(spec), optimizer, seed=0)
    one = {n: v.reshape(1, -1, *v.shape[2:]) for n, v in batch.items()}
    want, _, want_metrics = plain(params, init_state(optimizer, params), one, mx.array(0))
    np.testing.assert_allclose(float(metrics["loss"]), float(want_metrics["loss"]), rtol=1e-5)
    assert_trees_close(partition(new, lora.is_lora_path)[0], partition(want, lora.is_lora_path)[0])
    assert int(metrics["skipped"]) == 0
