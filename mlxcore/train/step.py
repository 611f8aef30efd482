"""The training step: gradient accumulation as a fold, then one chained update (all-reduce,
non-finite guard, clipping, the optimizer: `update_chain`).

`make_train_step` returns `step(params, opt_state, batch, step_no) -> (params, opt_state,
metrics)`, `mx.compile`d by default. Everything it needs that is not an array (the loss, the
optimizer config, accumulation count, which leaves train) is closed over; the step number is
an `mx.array`, so one compilation serves every step.
"""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx
from mlx.utils import tree_flatten

from mlxcore.train.grad_cache import EmbedFn, LossOnFn, cached_value_and_grad
from mlxcore.train.lora import is_lora_path
from mlxcore.train.optim import (
    Optimizer,
    Transform,
    all_reduce,
    apply_optimizer,
    chain,
    clip,
    flat_update,
    skip_if_non_finite,
)
from mlxcore.train.tree import Tree, combine, map_leaves, partition

# loss_fn(params, micro_batch, key) -> (scalar loss, {name: scalar metric})
LossFn = Callable[[Tree, Tree, mx.array], tuple[mx.array, dict[str, mx.array]]]


def step_key(seed: int, step_no: mx.array) -> mx.array:
    """A PRNG key for step `step_no` of a run seeded with `seed` (shape [2], uint32)."""
    return mx.random.key(seed) + step_no.astype(mx.uint32)


def accumulate(grad_fn: Callable, params: Tree, batch: Tree, keys: mx.array,
               eval_each: bool = False):
    """Fold `grad_fn(params, micro_batch, key) -> ((loss, aux), grads)` over the leading axis.

    batch: every leaf [k, micro, ...]; keys: [k, 2]. Returns the mean over the k micro-batches
    of (loss, aux, grads) - for a loss that is a mean over independent samples this equals one
    step on the concatenated batch. eval_each: evaluate the running sum after each micro-batch
    (outside `mx.compile` only), so one micro-batch's graph is alive at a time.

    Without eval_each the k micro-batches are one graph, and each one's inputs depend on the
    running sum before it (`mx.depends`: no value changes), so its forward pass starts only
    once the previous backward pass has finished: the graph holds one micro-batch's activations
    at a time, not all k (MLX may otherwise run every forward pass first; measured by
    `dev/rlaif_step_memory.py`).
    """
    k = keys.shape[0]
    total = None
    for i in range(k):
        micro = map_leaves(lambda x, i=i: x[i], batch)
        if total is not None and not eval_each:
            micro = after(micro, total)
        (loss, aux), grads = grad_fn(params, micro, keys[i])
        if total is None:
            total = (loss, aux, grads)
        else:
            total = map_leaves(mx.add, total, (loss, aux, grads))
        if eval_each:
            mx.eval(total)
    return total if k == 1 else map_leaves(lambda x: x / k, total)  # (/ 1 would be a kernel a leaf)


def after(tree: Tree, dependencies: Tree) -> Tree:
    """`tree` with every leaf made to depend on every leaf of `dependencies` (same values): it
    is computed only after them."""
    leaves = [leaf for _, leaf in tree_flatten(tree)]
    deps = [leaf for _, leaf in tree_flatten(dependencies)]
    if not leaves or not deps:
        return tree
    waiting = iter(mx.depends(leaves, deps))
    return map_leaves(lambda _: next(waiting), tree)  # (map_leaves walks leaves in tree_flatten's order)


def update_chain(optimizer: Optimizer, clip_norm: float = 1.0,
                 reduce_grads: Callable[[Tree], Tree] | None = None) -> Transform:
    """The step's parameter update as chained transforms (mlxcore.train.optim): the data-parallel
    all-reduce, then - unless the loss or a reduced gradient is non-finite - global-norm
    clipping and the optimizer. State {"optim", "skips", "consecutive_skips"}; info
    {"grad_norm", "skipped"}."""
    guarded = skip_if_non_finite(chain(clip(clip_norm), apply_optimizer(optimizer)))
    whole = chain(all_reduce(reduce_grads), guarded) if reduce_grads is not None else guarded
    # off the CPU, one vector for all leaves (optim.flat_update): a few kernels, not ~12 a leaf
    return whole if mx.default_device() == mx.cpu else flat_update(whole)


def init_state(optimizer: Optimizer, params: Tree, trainable: Callable = is_lora_path) -> Tree:
    """Step state: the optimizer's state over the trainable leaves plus skip counters."""
    train, _ = partition(params, trainable)
    return update_chain(optimizer).init(train)


def make_train_step(
    loss_fn: LossFn,
    optimizer: Optimizer,
    *,
    trainable: Callable = is_lora_path,
    clip_norm: float = 1.0,
    seed: int = 0,
    reduce_grads: Callable[[Tree], Tree] | None = None,
    jit: bool = True,
    eval_micro_batches: bool = False,
    grad_cache: tuple[EmbedFn, LossOnFn] | None = None,
):
    """Build `step(params, opt_state, batch, step_no) -> (params, opt_state, metrics)`.

    params: the full tree; only leaves picked by `trainable(path, leaf)` are differentiated and
    updated. batch: leaves [accum, micro, ...] (accum may be 1). step_no: scalar integer array.
    reduce_grads: e.g. `mlx.nn.average_gradients` for data-parallel runs (applied before
    clipping). A non-finite loss or gradient skips the update: params and optimizer state come
    back bit-identical and the skip counters rise.

    eval_micro_batches: one compiled graph per micro-batch, evaluated before the next starts,
    instead of one graph for the whole step (whose micro-batches also run one after another,
    `accumulate`): the host waits at each micro-batch's end, so no work of the next one is
    queued (and allocated) while the previous one runs. Same sums in the same order, so the same
    update up to kernel rounding.

    grad_cache: (embed, loss_on) (`mlxcore.retrieval.objective.contrastive_parts`): the accum x micro
    pairs of a step are ONE contrastive batch (every query against all their documents),
    computed micro-batch by micro-batch (`mlxcore.train.grad_cache`): peak memory of one micro-batch,
    one host sync per micro-batch; `loss_fn` is not used.
    """

    def grad_of_trainable(train: Tree, frozen: Tree, micro: Tree, key: mx.array):
        return loss_fn(combine(train, frozen), micro, key)

    value_and_grad = mx.value_and_grad(grad_of_trainable)
    update = update_chain(optimizer, clip_norm, reduce_grads).update

    def apply(train: Tree, frozen: Tree, opt_state: Tree, loss, aux, grads):
        """The chained update (reduce, guard, clip, optimizer) from the step's mean loss and grads."""
        new_train, new_state, info = update(grads, opt_state, train, loss=loss)
        metrics = {"loss": loss, "grad_norm": info["grad_norm"], "lr": new_state["optim"]["learning_rate"],
                   "skipped": info["skipped"], **aux}
        return combine(new_train, frozen), new_state, metrics

    def step_keys(batch: Tree, step_no: mx.array) -> mx.array:
        accum = tree_flatten(batch)[0][1].shape[0]
        return mx.random.split(step_key(seed, step_no), accum)

    def step(params: Tree, opt_state: Tree, batch: Tree, step_no: mx.array):
        train, frozen = partition(params, trainable)
        loss, aux, grads = accumulate(
            lambda p, micro, key: value_and_grad(p, frozen, micro, key), train, batch,
            step_keys(batch, step_no)
        )
        return apply(train, frozen, opt_state, loss, aux, grads)

    if grad_cache is not None:
        cached, apply_fn = cached_value_and_grad(*grad_cache, jit=jit), mx.compile(apply) if jit else apply

        def cached_step(params: Tree, opt_state: Tree, batch: Tree, step_no: mx.array):
            train, frozen = partition(params, trainable)
            loss, aux, grads = cached(train, frozen, batch, step_keys(batch, step_no))
            return apply_fn(train, frozen, opt_state, loss, aux, grads)

        return cached_step
    if not eval_micro_batches:
        return mx.compile(step) if jit else step

    grads_fn, apply_fn = (mx.compile(value_and_grad), mx.compile(apply)) if jit else (value_and_grad, apply)

    def stepwise(params: Tree, opt_state: Tree, batch: Tree, step_no: mx.array):
        train, frozen = partition(params, trainable)
        loss, aux, grads = accumulate(
            lambda p, micro, key: grads_fn(p, frozen, micro, key), train, batch,
            step_keys(batch, step_no), eval_each=True
        )
        return apply_fn(train, frozen, opt_state, loss, aux, grads)

    return stepwise
