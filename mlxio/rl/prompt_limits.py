"""Prompts checked against the model's positions before any generation: a prompt whose tokens
plus the completion's cannot fit `max_position_embeddings` is found without tokenising it when
its characters alone cannot fit (a 4.5 MB prompt: at once), else after tokenising it."""

from __future__ import annotations

from collections.abc import Callable, Sequence


def longest_token_chars(tokenizer) -> int:
    """The most characters one token of `tokenizer` stands for (its longest vocabulary entry; a
    byte-level BPE entry has one character per byte), at least 1; 64 when it has no vocabulary view."""
    hf = getattr(tokenizer, "_tokenizer", tokenizer)
    try:
        return max((len(t) for t in hf.get_vocab()), default=1) or 1
    except Exception:  # noqa: BLE001 - a tokenizer without get_vocab
        return 64


def position_limit(model_config: dict) -> int | None:
    """The model's `max_position_embeddings` when it is a whole number >= 1, else None."""
    limit = model_config.get("max_position_embeddings")
    return limit if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0 else None


def prompt_overflow(model_config: dict, tokenizer, prompts: Sequence[str], max_tokens: int,
                    encode: Callable[[str], list[int]]) -> tuple[int, tuple[int, str] | None]:
    """(the longest prompt's token count, None) when every prompt plus `max_tokens` fits the
    model's positions; else (so far, (index of the first that does not, why))."""
    limit = position_limit(model_config)
    room = None if limit is None else limit - max_tokens
    widest = longest_token_chars(tokenizer) if limit is not None else 0
    longest = 0
    for i, prompt in enumerate(prompts):
        if room is not None and len(prompt) > room * widest:
            return longest, (i, f"{len(prompt)} characters cannot fit in the model's {limit} positions with "
                                f"{max_tokens} new tokens (at most {widest} characters a token)")
        count = len(encode(prompt))
        if room is not None and count > room:
            return longest, (i, f"{count} tokens + {max_tokens} new tokens is more than the model's "
                                f"max_position_embeddings ({limit})")
        longest = max(longest, count)
    return longest, None


def check_problems(model_config: dict, tokenizer, sets: dict[str, tuple[Sequence, int]],
                   text: Callable, encode: Callable[[str], list[int]], where: str) -> None:
    """Every problem of `sets` ({name: (problems, new tokens)}) fits the model's positions with
    its prompt as generation sees it (`text(problem)`, `encode`); else a DataError naming the
    first problem that does not (a run would fail, or grow past memory, at the step sampling it)."""
    from mlxio.errors import DataError

    for name, (problems, max_tokens) in sets.items():
        _, over = prompt_overflow(model_config, tokenizer, [text(p) for p in problems], max_tokens, encode)
        if over is not None:
            i, why = over
            raise DataError(f"problem {str(getattr(problems[i], 'task_id', i))[:60]!r} ({name}): {why}", where=where,
                            fix="shorten its prompt, leave it out, or lower --max_new_tokens / --eval.max_new_tokens")
