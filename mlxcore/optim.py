"""Optimizers as pure `(init, update)` pairs wrapping `mlx.optimizers` (optax's shape).

`init(params) -> state` and `update(grads, state, params) -> (new_params, new_state)`; the state
is a plain tree (the wrapped optimizer's own `state`: step counter, learning rate and the
per-parameter moments), so it can be compiled over, checkpointed and restored. The math is
MLX's; this module only makes it functional.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import attrs
import mlx.core as mx
import mlx.optimizers as optim
from mlx.utils import tree_flatten

from mlxcore.tree import Tree, map_leaves


@attrs.frozen(kw_only=True)
class OptimConfig:
    """AdamW/Adam with linear warm-up then cosine decay to `lr * min_lr_ratio`."""

    name: str = attrs.field(default="adamw", validator=attrs.validators.in_(("adamw", "adam")))
    lr: float = 2e-5
    weight_decay: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    warmup_steps: int = 500
    total_steps: int = 10_000
    min_lr_ratio: float = 0.0
    clip_norm: float = 1.0  # global gradient norm; <= 0 disables clipping


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


