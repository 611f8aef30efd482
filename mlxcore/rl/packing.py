"""Rollouts as training batches: right-padded prompt + completion rows at a few bucket widths
(`pack_tokens`, `pack`; `mlxcore.train.buckets.bucket_width`), and the completions' log-probabilities
under a model by teacher forcing (`completion_logprobs`). Used by the RLAIF recipe, its worker
and the evaluation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import mlx.core as mx
import numpy as np

from mlxcore.rl.policy import sequence_logprobs
from mlxcore.train.buckets import bucket_width


class Rollouts(Protocol):
    """What `pack` reads of sampled completions (`mlxio.rl.rollout.Rollouts` has these fields)."""

    @property
    def prompt_tokens(self) -> Sequence[Sequence[int]]: ...  # P prompts' tokens
    @property
    def completion_tokens(self) -> Sequence[Sequence[int]]: ...  # N = P * G completions' tokens
    @property
    def logprobs(self) -> Sequence[np.ndarray]: ...  # N: each completion token's log-probability
    @property
    def prompt_index(self) -> np.ndarray: ...  # [N] the prompt each completion answers

LOGITS_BUDGET = 1 << 26  # floats of [rows, T, vocab] logits per teacher-forced chunk (256 MiB)


def _per_sequence(prompt_tokens: list[list[int]], n: int) -> list[list[int]]:
    if len(prompt_tokens) == n:
        return prompt_tokens
    if not prompt_tokens or n % len(prompt_tokens):
        raise ValueError(f"{len(prompt_tokens)} prompts do not group {n} completions")
    group = n // len(prompt_tokens)
    return [prompt_tokens[i // group] for i in range(n)]


def pack_tokens(prompt_tokens: list[list[int]], completion_tokens: list[list[int]],
                pad_id: int = 0, widths: tuple[int, ...] = ()) -> dict[str, np.ndarray]:
    """Right-padded prompt + completion rows.

    prompt_tokens: N lists (or P lists, one per group of N / P prompt-major completions).
    Returns tokens [N, T] int32, completion_mask [N, T] float32 (1 where the token is a
    completion token, i.e. a target), lengths [N] and prompt_lengths [N] int32;
    T = the smallest of `widths` that holds the longest row (widths chosen beforehand:
    `mlxio.rl.shapes`), else the `bucket_width` of the longest row (a multiple of 32 from a few
    bucket widths).
    """
    n = len(completion_tokens)
    prompts = _per_sequence(prompt_tokens, n)
    lengths = np.array([len(p) + len(c) for p, c in zip(prompts, completion_tokens, strict=True)],
                       np.int32)
    longest = int(lengths.max()) if n else 1
    width = min((w for w in widths if w >= longest), default=bucket_width(longest))
    tokens = np.full((n, width), pad_id, np.int32)
    mask = np.zeros((n, width), np.float32)
    for i, (p, c) in enumerate(zip(prompts, completion_tokens, strict=True)):
        tokens[i, : len(p) + len(c)] = p + c
        mask[i, len(p): len(p) + len(c)] = 1.0
    return {"tokens": tokens, "completion_mask": mask, "lengths": lengths,
            "prompt_lengths": np.array([len(p) for p in prompts], np.int32)}


def target_positions(mask: np.ndarray, micro: int, chunk: int, width: int | None = None) -> np.ndarray:
    """Flat indices of each micro-batch's scored targets, for `mlxcore.rl.logprobs.gathered_logprobs`.

    mask [N, S] (1 on the targets to score); returns [N / micro, P] int32: row b lists the
    indices i * S + s (i within micro-batch b) of its ones in order, padded with micro * S. P is
    the same for every micro-batch: `width` when the largest count fits it (chosen beforehand:
    `mlxio.rl.shapes`), else that count rounded up by `bucket_width` to a few multiples of
    `chunk` (so the compiled step sees a handful of sizes), at most micro * S.
    """
    n, s = mask.shape
    if micro < 1 or n % micro:
        raise ValueError(f"micro-batch {micro} must divide the {n} rows")
    flat = (np.asarray(mask) > 0).reshape(n // micro, micro * s)
    count = int(flat.sum(axis=1).max()) if n else 0
    width = width if width is not None and count <= width else min(bucket_width(max(count, 1), chunk), micro * s)
    out = np.full((n // micro, width), micro * s, np.int32)
    for b, row in enumerate(flat):
        idx = np.flatnonzero(row)
        out[b, :len(idx)] = idx
    return out


def pack(rollouts: Rollouts, pad_id: int = 0, widths: tuple[int, ...] = ()) -> dict[str, np.ndarray]:
    """Training arrays of `pack_tokens` (at one of `widths` where the rows fit), plus the
    sampling-time `logprobs` [N, T] float32 at the completion positions (0 elsewhere) and
    `prompt_index` [N]."""
    packed = pack_tokens(rollouts.prompt_tokens, rollouts.completion_tokens, pad_id, widths)
    logprobs = np.zeros_like(packed["completion_mask"])
    for i, lp in enumerate(rollouts.logprobs):
        start = packed["prompt_lengths"][i]
        logprobs[i, start: start + len(lp)] = lp
    packed["logprobs"] = logprobs
    packed["prompt_index"] = np.asarray(rollouts.prompt_index, np.int32)
    return packed


def completion_logprobs(model, prompt_tokens: list[list[int]],
                        completion_tokens: list[list[int]]) -> list[np.ndarray]:
    """Per-token log-probabilities of each completion under `model`, by one teacher-forced
    forward pass per chunk of rows (chunks bound the [rows, T, vocab] logits)."""
    packed = pack_tokens(prompt_tokens, completion_tokens)
    tokens, width = packed["tokens"], packed["tokens"].shape[1]
    vocab = model.args.vocab_size
    rows = max(1, LOGITS_BUDGET // (width * vocab))
    out = []
    for start in range(0, len(tokens), rows):
        batch = mx.array(tokens[start: start + rows])
        lp = np.array(sequence_logprobs(model, batch))
        for j in range(batch.shape[0]):
            i = start + j
            first = packed["prompt_lengths"][i] - 1  # logit at t - 1 predicts token t
            out.append(lp[j, first: first + len(completion_tokens[i])].astype(np.float32))
    return out
