"""A policy in training: the loaded policy, its compiled update step, the LoRA tree it trains
and the optimizer state, built in one place (`build`) for the RLAIF recipe, its worker and the
verdict judge, so a step of one equals a step of another and a checkpoint either writes the
other resumes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import attrs

from mlxcore.train.optim import OptimConfig, make_optimizer
from mlxcore.train.step import init_state, make_train_step
from mlxio.weights import llm, llm_lora


@attrs.define
class Session:
    """What a training process holds between steps.

    policy: the frozen model (LoRA layers in place) and its tokenizer; step_fn: `(params, state,
    batch, step_no) -> (params, state, metrics)` (mlxcore.train.step); params: the trained LoRA tree
    (the model is never re-pointed: the loss binds it); state: the optimizer state; run_id: what a
    checkpoint must match to be resumed; step: optimizer steps taken; claimed: run directories
    this process locked (the worker's `save` / `load`)."""

    policy: llm.Policy
    step_fn: Callable
    params: dict
    state: dict
    run_id: dict
    step: int = 0
    claimed: set[Path] = attrs.field(factory=set)

    @property
    def model(self):
        return self.policy.model


def build(policy: llm.Policy, loss: Callable, optim: OptimConfig, *, seed: int, jit: bool,
          run_id: dict, reduce_grads: Callable | None = None, eval_micro_batches: bool = False) -> Session:
    """A fresh session: `optim`'s optimizer, the compiled, clipping step over `loss(params,
    micro_batch, key) -> (loss, aux)` (`reduce_grads`: the data-parallel mean of gradients),
    the model's LoRA tree and a new optimizer state for it."""
    optimizer = make_optimizer(optim)
    step_fn = make_train_step(loss, optimizer, clip_norm=optim.clip_norm, seed=seed, jit=jit,
                              reduce_grads=reduce_grads, eval_micro_batches=eval_micro_batches)
    params = llm_lora.lora_tree(policy.model)
    return Session(policy=policy, step_fn=step_fn, params=params, state=init_state(optimizer, params), run_id=run_id)
