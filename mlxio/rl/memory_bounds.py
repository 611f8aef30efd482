"""A causal LM's rollout and policy update that cannot fit, refused before the work starts: lower
bounds of the KV cache of a batched generation (`rollout_bytes`) and of an update micro-batch's
logits (`update_bytes`), checked against the machine's memory for the RLAIF recipe's step and
evaluation (`check_rlaif`) and for the worker's requests (`mlxio.run.budget.require`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mlxio.run.budget import FLOAT, require

if TYPE_CHECKING:
    from mlxio.rl.evaluation import EvalConfig


def model_dims(config: dict) -> dict[str, int]:
    """{layers, hidden, kv_dim, vocab} of a causal LM's HF / mlx-lm config (0 where absent)."""
    hidden = int(config.get("hidden_size") or 0)
    heads = int(config.get("num_attention_heads") or 1)
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or (hidden // max(heads, 1)))
    return {"layers": int(config.get("num_hidden_layers") or 0), "hidden": hidden,
            "kv_dim": kv_heads * head_dim, "vocab": int(config.get("vocab_size") or 0)}


def rollout_bytes(rows: int, tokens: int, config: dict) -> int:
    """Lower bound of a batched generation: the KV cache of `rows` sequences of `tokens`, plus
    one decode step's logits."""
    d = model_dims(config)
    return rows * (d["layers"] * 2 * d["kv_dim"] * tokens + d["vocab"]) * FLOAT


def update_bytes(rows: int, tokens: int, config: dict) -> int:
    """Lower bound of one policy-update micro-batch of `rows` sequences: its logits and their
    log-softmax ([rows, tokens, vocab] each) and one hidden state per layer kept for backward."""
    d = model_dims(config)
    return rows * tokens * (2 * d["vocab"] + d["layers"] * d["hidden"]) * FLOAT


def check_rlaif(config: dict, *, prompts_per_step: int, group_size: int, max_new_tokens: int, accum: int,
                ev: EvalConfig, world_size: int = 1, where: str | None = None,
                available: int | None = None) -> None:
    """The RLAIF recipe's per-step memory (prompts_per_step x group_size sequences of at least
    max_new_tokens tokens, the update in `accum` micro-batches) against the machine (`config`:
    the model's): the rollout's KV cache and an update micro-batch's logits, and the
    evaluation's (`ev`) KV cache. ConfigError naming group_size (or max_new_tokens) when either
    cannot fit."""
    rows = prompts_per_step * group_size // max(world_size, 1)
    tokens = max_new_tokens + 16  # a prompt has some tokens: 16 keeps the bound a lower bound
    per_micro = max(rows // accum, 1)
    option, value = ("group_size", group_size) if group_size >= prompts_per_step else (
        "prompts_per_step", prompts_per_step)
    fix = f"lower --{option} or --max_new_tokens (the update splits into --train.accum micro-batches: raise it too)"
    require(rollout_bytes(rows, tokens, config), option, value,
            f"{rows} sequences x {tokens} tokens of generation (KV cache)", fix, where, available)
    require(update_bytes(per_micro, tokens, config), option, value,
            f"the update's micro-batches of {per_micro} sequences x {tokens} tokens x {model_dims(config)['vocab']} "
            "logits", fix, where, available)
    if (ev.before or ev.after) and ev.samples:
        rows = ev.batch * ev.samples  # the evaluation decodes `batch` prompts x `samples` completions together
        require(rollout_bytes(rows, ev.max_new_tokens + 16, config), "eval.batch", ev.batch,
                f"the evaluation's {ev.batch} prompts x {ev.samples} samples x {ev.max_new_tokens + 16} tokens "
                "(KV cache)", "lower --eval.batch, --eval.samples or --eval.max_new_tokens", where, available)
