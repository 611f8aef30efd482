"""Shape bucketing: the few widths, batch sizes and chunk lengths that compiled steps see.

MLX traces a compiled function once per input shape, and on a GPU every new shape also
compiles new kernels (NVRTC, seconds each on a fresh CUDA machine). So each length that varies
from call to call - a batch's padded width, a decode batch that shrinks as rows end, a prompt
prefilled in pieces, a KV cache's slots - is rounded up to one of a handful of values here.
Plain integer arithmetic: every function is exact and cheap.
"""

from __future__ import annotations

PAD_MULTIPLE = 32  # packed RLAIF widths are bucket multiples of this (`bucket_width`)
PREFILL_CHUNK = 2048  # prompt tokens per prefill forward pass (bounds activation memory)
LENGTH_STEP = 256  # a static KV cache's slots are a multiple of this (mlx-lm's KVCache.step)


def padded_length(longest: int, bucket: int) -> int:
    """`longest` rounded up to a multiple of `bucket` (at least one bucket)."""
    return max(1, -(-longest // bucket)) * bucket


def bucket_width(length: int, multiple: int = PAD_MULTIPLE) -> int:
    """The packed width for `length` tokens: the smallest of `multiple` x (1, 2, 3, 4, 6, 8, 12,
    16, 24, ...) that holds it - multiples of 32 up to 128, then steps of 1.5x / 2x - so a run's
    compiled steps (and, on a GPU, its kernels) see a handful of widths, not one per 32 tokens
    (at most 2x the tokens of the longest row; padded positions are masked out)."""
    units = max(1, -(-length // multiple))
    if units <= 4:
        return units * multiple
    power = 1 << ((units - 1).bit_length() - 1)  # the largest power of two below units
    return (power * 3 // 2 if units <= power * 3 // 2 else power * 2) * multiple


def cache_length(prompt_len: int, new_tokens: int, step: int = LENGTH_STEP) -> int:
    """Slots for a prompt of `prompt_len` cached tokens plus `new_tokens` decode steps."""
    return -(-(prompt_len + new_tokens) // step) * step


def decode_buckets(n: int) -> list[int]:
    """The decode batch sizes used for N sequences: N and the powers of two below it."""
    return sorted({n} | {1 << k for k in range(max(n - 1, 1).bit_length()) if 1 << k < n})


def prefill_chunks(n: int, bucketed: bool) -> list[int]:
    """Chunk lengths a prompt of n tokens is prefilled in: PREFILL_CHUNK-sized pieces, or with
    `bucketed` powers of two, largest first (300 -> 256, 32, 8, 4), so prompts of any length
    run at most log2(PREFILL_CHUNK) + 1 prefill shapes instead of one per prompt length."""
    if not bucketed:
        return [min(PREFILL_CHUNK, n - start) for start in range(0, n, PREFILL_CHUNK)]
    out = [PREFILL_CHUNK] * (n // PREFILL_CHUNK)
    rest = n % PREFILL_CHUNK
    out += [1 << k for k in reversed(range(rest.bit_length())) if rest >> k & 1]
    return out


def batch_ladder(n: int, smallest: int) -> tuple[int, ...]:
    """The decode batch sizes a batch of n rows compacts through: n, then the powers of two
    below it down to `smallest` (64, 8 -> 64, 32, 16, 8; 24, 8 -> 24, 16, 8; smallest >= n:
    n alone, no compaction)."""
    return (n, *sorted((1 << k for k in range(n.bit_length()) if smallest <= 1 << k < n), reverse=True))


def prefill_width(longest: int, bucketed: bool, width: int | None = None) -> int:
    """The width `mlxio.rl.rollout.prefill_batch` pads a batch whose longest prompt has `longest` tokens to:
    `width` where that fits, else the longest's `bucket_width` (`bucketed`) or the longest."""
    if width is not None and longest <= width:
        return width
    return bucket_width(longest) if bucketed else longest
