"""Optimizers as pure `(init, update)` pairs wrapping `mlx.optimizers` (optax's shape).

`init(params) -> state` and `update(grads, state, params) -> (new_params, new_state)`; the state
is a plain tree (the wrapped optimizer's own `state`: step counter, learning rate and the
per-parameter moments), so it can be compiled over, checkpointed and restored. The math is
MLX's; this module only makes it functional.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import accumulate
from typing import NamedTuple

import attrs
import mlx.core as mx
import mlx.optimizers as optim
from mlx.utils import tree_flatten, tree_unflatten

from mlxcore.fields import MAX_STEPS, bounded
from mlxcore.train.tree import Tree, map_leaves


@attrs.frozen(kw_only=True)
class OptimConfig:
    """AdamW/Adam with linear warm-up then cosine decay to `lr * min_lr_ratio`."""

    name: str = bounded("adamw", choices=("adamw", "adam"), validator=attrs.validators.in_(("adamw", "adam")))
    lr: float = bounded(2e-5, gt=0, le=10)
    weight_decay: float = bounded(0.01, ge=0, le=10)
    beta1: float = bounded(0.9, ge=0, lt=1)
    beta2: float = bounded(0.999, ge=0, lt=1)
    eps: float = bounded(1e-8, gt=0, le=1)
    warmup_steps: int = bounded(500, ge=0, le=MAX_STEPS)
    total_steps: int = bounded(10_000, ge=1, le=MAX_STEPS)
    min_lr_ratio: float = bounded(0.0, ge=0, le=1)
    clip_norm: float = bounded(1.0, ge=0, le=1e6)  # global gradient norm; 0 disables clipping


class Optimizer(NamedTuple):
    init: Callable[[Tree], Tree]
    update: Callable[[Tree, Tree, Tree], tuple[Tree, Tree]]


def schedule(cfg: OptimConfig) -> Callable[[mx.array], mx.array]:
    """Learning rate as a function of the optimizer step: linear warm-up, cosine decay."""
    decay_steps = max(cfg.total_steps - cfg.warmup_steps, 1)
    cosine = optim.cosine_decay(cfg.lr, decay_steps, cfg.lr * cfg.min_lr_ratio)
    if cfg.warmup_steps <= 0:
        return cosine
    warmup = optim.linear_schedule(0.0, cfg.lr, cfg.warmup_steps)
    return optim.join_schedules([warmup, cosine], [cfg.warmup_steps])


def _build(cfg: OptimConfig) -> optim.Optimizer:
    betas = [cfg.beta1, cfg.beta2]
    if cfg.name == "adamw":
        return optim.AdamW(schedule(cfg), betas, cfg.eps, cfg.weight_decay)
    return optim.Adam(schedule(cfg), betas, cfg.eps)


def make_optimizer(cfg: OptimConfig) -> Optimizer:
    """Pure (init, update) around a fresh `mlx.optimizers` object per call."""

    def init(params: Tree) -> Tree:
        opt = _build(cfg)
        opt.init(params)
        return opt.state

    def update(grads: Tree, state: Tree, params: Tree) -> tuple[Tree, Tree]:
        opt = _build(cfg)
        opt.state = map_leaves(lambda x: x, state)  # fresh containers: the caller's stay intact
        new_params = opt.apply_gradients(grads, params)
        return new_params, opt.state

    return Optimizer(init, update)


def clip_by_global_norm(grads: Tree, max_norm: float) -> tuple[Tree, mx.array]:
    """(grads scaled so their global L2 norm is <= max_norm, the norm before clipping)."""
    if max_norm <= 0:
        norm = mx.sqrt(sum(mx.sum(g.astype(mx.float32) ** 2) for _, g in tree_flatten(grads)))
        return grads, norm
    return optim.clip_grad_norm(grads, max_norm)


def all_finite(loss: mx.array, grads: Tree) -> mx.array:
    """Scalar bool: the loss and every gradient entry are finite."""
    ok = mx.all(mx.isfinite(loss))
    for _, g in tree_flatten(grads):
        ok = ok & mx.all(mx.isfinite(g))
    return ok


def select_tree(pred: mx.array, on_true: Tree, on_false: Tree) -> Tree:
    """Leaf-wise `mx.where(pred, a, b)` (bit-exact copy of the chosen side)."""
    return map_leaves(lambda a, b: mx.where(pred, a, b), on_true, on_false)




# ---------------------------------------------------------------- transforms that chain
# optax's shape: a transform is `init(params) -> state` and `update(grads, state, params,
# **extra) -> (grads, state, info)`; `chain` composes them left to right. One difference:
# MLX's optimizers compute the new parameters themselves, so the last transform of a chain
# (`apply_optimizer`) hands back the new params in place of the gradients - MLX's own math,
# bit for bit, rather than updates re-added to the params. A transform with state has a
# name, its state's key in the chain's state dict (MERGED: its keys are the chain's own);
# stateless ones (clip, all-reduce) keep none. The training step's chain,
# chain(all_reduce, skip_if_non_finite(chain(clip, apply_optimizer))), so has the state
# {"optim": ..., "skips": ..., "consecutive_skips": ...}.


MERGED = "."  # a transform whose state dict's keys are the enclosing chain's own


class Transform(NamedTuple):
    init: Callable[[Tree], Tree]
    update: Callable[..., tuple[Tree, Tree, dict]]
    name: str = ""  # "" for stateless transforms, MERGED, or the state's key in a chain


def all_reduce(reduce_grads: Callable[[Tree], Tree]) -> Transform:
    """Gradients combined across data-parallel ranks (e.g. their mean) before anything else."""
    return Transform(lambda params: None, lambda grads, state, params, **_: (reduce_grads(grads), state, {}))


def clip(max_norm: float) -> Transform:
    """`clip_by_global_norm`; info {"grad_norm": the norm before clipping}."""

    def update(grads, state, params, **_):
        grads, norm = clip_by_global_norm(grads, max_norm)
        return grads, state, {"grad_norm": norm}

    return Transform(lambda params: None, update)


def apply_optimizer(optimizer: Optimizer) -> Transform:
    """The terminal transform: the `mlx.optimizers` update (see `make_optimizer`), returning the
    new params; state "optim" (its "learning_rate" is the rate of the last applied step)."""

    def update(grads, state, params, **_):
        new_params, new_state = optimizer.update(grads, state, params)
        return new_params, new_state, {}

    return Transform(optimizer.init, update, "optim")


def chain(*transforms: Transform) -> Transform:
    """Transforms applied left to right; state {name: state} of the stateful ones; info merged."""

    def init(params):
        state = {}
        for t in transforms:
            if t.name == MERGED:
                state |= t.init(params)
            elif t.name:
                state[t.name] = t.init(params)
        return state

    def update(grads, state, params, **extra):
        new_state, info = {}, {}
        for t in transforms:
            sub = state if t.name == MERGED else state.get(t.name) if t.name else None
            grads, sub, sub_info = t.update(grads, sub, params, **extra)
            if t.name == MERGED:
                new_state |= sub
            elif t.name:
                new_state[t.name] = sub
            info |= sub_info
        return grads, new_state, info

    return Transform(init, update)


def skip_if_non_finite(inner: Transform) -> Transform:
    """`inner` (ending in `apply_optimizer`) unless the loss (`extra["loss"]`), a gradient or the
    gradients' global norm (inner's info "grad_norm": finite elements whose squares overflow
    float32, e.g. a loss temperature of 1e-30) is non-finite: then params and inner state come
    back bit-identical and the skip counters rise. State: inner's plus "skips" and
    "consecutive_skips"; info {"skipped": 0 or 1, ...}."""

    def init(params):
        return {**inner.init(params), "skips": mx.array(0, mx.int32), "consecutive_skips": mx.array(0, mx.int32)}

    def update(grads, state, params, *, loss, **extra):
        finite = all_finite(loss, grads)
        inner_state = {k: v for k, v in state.items() if k not in ("skips", "consecutive_skips")}
        new_params, new_inner, info = inner.update(grads, inner_state, params, loss=loss, **extra)
        if "grad_norm" in info:
            finite = finite & mx.isfinite(info["grad_norm"])
        skipped = (~finite).astype(mx.int32)
        new_state = {**select_tree(finite, new_inner, inner_state), "skips": state["skips"] + skipped,
                     "consecutive_skips": (state["consecutive_skips"] + 1) * skipped}
        return select_tree(finite, new_params, params), new_state, {**info, "skipped": skipped}

    return Transform(init, update, MERGED)


FLAT = "flat"  # the one key of a flattened tree


def _pack(leaves: list[mx.array]) -> mx.array:
    return mx.concatenate([x.reshape(-1) for x in leaves])


def _unpack(flat: mx.array, like: list[mx.array]) -> list[mx.array]:
    """flat [sum of sizes] -> arrays shaped like `like` (views of one Split: no copies)."""
    bounds = list(accumulate(x.size for x in like[:-1]))
    return [part.reshape(x.shape) for part, x in zip(mx.split(flat, bounds), like, strict=True)]


def flat_update(inner: Transform) -> Transform:
    """`inner` (a chain whose optimizer state sits under "optim", as `apply_optimizer` keeps it)
    run on one vector instead of leaf by leaf: gradients, parameters and the optimizer's
    per-parameter moments are concatenated, updated by one pass of each elementwise step, and
    split back. The state keeps its per-leaf layout (checkpoints are unchanged); the math is
    the same elementwise, and the global norm is one sum instead of a sum of per-leaf sums.

    Why: leaf by leaf, the finiteness check, the norm, clipping, the moments, the update and the
    non-finite guard's select cost ~12 small kernels per leaf (24 LoRA leaves in MiniLM's step),
    where PyTorch's multi-tensor AdamW runs a handful.
    Leaves of different dtypes (or a single leaf) take the leaf-by-leaf path."""

    def update(grads, state, params, **extra):
        named = tree_flatten(params)
        paths, leaves = [p for p, _ in named], [x for _, x in named]
        if len(leaves) < 2 or len({x.dtype for x in leaves}) > 1:
            return inner.update(grads, state, params, **extra)
        grad_of = dict(tree_flatten(grads))
        opt = state["optim"]
        scalars = {k: v for k, v in opt.items() if isinstance(v, mx.array)}
        moments: dict[str, dict[str, mx.array]] = {}
        for path, x in tree_flatten({k: v for k, v in opt.items() if k not in scalars}):
            param, name = path.rsplit(".", 1)
            moments.setdefault(name, {})[param] = x
        flat_opt = {**scalars, FLAT: {name: _pack([by[p] for p in paths]) for name, by in moments.items()}}
        new_p, new_state, info = inner.update({FLAT: _pack([grad_of[p] for p in paths])},
                                              {**state, "optim": flat_opt}, {FLAT: _pack(leaves)}, **extra)
        new_opt = new_state["optim"]
        split = {name: _unpack(flat, leaves) for name, flat in new_opt[FLAT].items()}
        moment_tree = tree_unflatten([(f"{p}.{name}", split[name][i]) for i, p in enumerate(paths) for name in split])
        opt_tree = {k: new_opt[k] if k in scalars else moment_tree[k] for k in opt}  # the state's own order
        return (tree_unflatten(list(zip(paths, _unpack(new_p[FLAT], leaves), strict=True))),
                {**new_state, "optim": opt_tree}, info)

    return Transform(inner.init, update, inner.name)
