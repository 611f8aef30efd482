"""Batched group sampling for RLAIF, on mlx-lm's model definitions and samplers.

`generate_group` decodes G completions for each of P prompts as one batch of N = P * G
sequences, with a sampler from `mlx_lm.sample_utils.make_sampler`. Each prompt is prefilled once
and its KV cache handed to all G of its sequences. Two decode engines: "static"
(`mlxio.rl.decode` over `mlxcore.models.decode_step`: one compiled step over a preallocated KV cache,
the same shapes every step, EOS / stops checked every 16 steps, ended rows compacted away at a
few batch sizes with `min_decode_batch`; the default on a GPU, where it removes the per-token
host work and shape changes that bound "batch") and "batch" (`mlx_lm.generate.BatchGenerator`: its
growing batched KV cache, per-sequence EOS stop, ended rows dropped; the default on the CPU). With `stop_at_code_end` a sequence also stops once
its first fenced code block has closed (`CodeBlockStop`): a small instruct model answers with
one ```python block and then keeps talking, and that talk costs decode time and trains nothing
the rewards look at. Per-token log-probabilities are those of the policy at temperature 1
(log-softmax of the raw logits), the quantity a policy-gradient loss and its KL term need;
`completion_logprobs` recomputes them by teacher forcing.

Decode batch buckets (`bucket_decode`, "batch" engine, on by default on a GPU): mlx-lm drops a sequence from
the batch as soon as it ends, so the decode batch takes every size from N down to 1, and on a
fresh GPU each new size compiles new kernels (an evaluation of 128 sequences spent minutes
compiling). With buckets, ended sequences stay in the batch (their tokens
are ignored) until the live ones fit the next smaller bucket (N, then powers of two below it),
so a run compiles a handful of batch shapes. The sampler draws only for the live rows, in their
order, so every draw has the shape it has without buckets: the same texts for the same seed.
Prompts are then also prefilled in power-of-two chunks (`mlxcore.train.buckets.prefill_chunks`): a few prefill shapes
for prompts of any length (the same KV cache up to float rounding).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from functools import partial

import attrs
import mlx.core as mx
import numpy as np
from mlx_lm.generate import BatchGenerator
from mlx_lm.models.cache import BatchKVCache, make_prompt_cache
from mlx_lm.sample_utils import make_sampler

from mlxcore.models import decode_step
from mlxcore.train.buckets import (
    batch_ladder,
    cache_length,
    decode_buckets,
    prefill_chunks,
    prefill_width,
)
from mlxio.rl import decode
from mlxio.rl.problems import code_block_end


@attrs.frozen(kw_only=True)
class Rollouts:
    """N = P * G sampled completions, prompt-major (sequence i answers prompt i // G).

    prompt_tokens: P token lists (prompt p's, chat template applied).
    completion_tokens: N token lists; a finished one ends with its EOS token.
    logprobs: N float32 arrays, log p(token) of each completion token at temperature 1.
    texts: N decoded completions (EOS left out).
    prompt_index: [N] int, the prompt each completion answers.
    finished: [N] bool, True where the sequence stopped at EOS or, with `stop_at_code_end`, at
        the closing ``` of its first code block (its last token; the text ends at that fence);
        False where it hit max_new_tokens.
    gen_tokens_per_s: completion tokens / wall seconds of the whole call (prefill included).
    decode_batch_sizes: with `bucket_decode`, the decode batch sizes the call ran (else None).
    decode_stats: with the "static" engine, `mlxio.rl.decode.decode`'s stats (steps, rows
        computed, batch sizes, host syncs, host seconds queueing steps and reading tokens), else None.
    shapes: with the "static" engine, the array shapes the call ran, as `mlxio.rl.shapes` keys:
        ("prefill", prompts, width) and ("decode", rows, cache slots) per batch size; else ().
    """

    prompt_tokens: list[list[int]]
    completion_tokens: list[list[int]]
    logprobs: list[np.ndarray]
    texts: list[str]
    prompt_index: np.ndarray
    finished: np.ndarray
    gen_tokens_per_s: float
    group_size: int
    decode_batch_sizes: list[int] | None = None  # the decode batch sizes run (with bucket_decode)
    decode_stats: dict | None = None  # the "static" engine's step / sync counts and host times
    shapes: tuple = ()  # the "static" engine's prefill and decode shapes (`mlxio.rl.shapes` keys)

    @property
    def sequence_prompt_tokens(self) -> list[list[int]]:
        """The N per-sequence prompts (prompt_tokens[prompt_index[i]])."""
        return [self.prompt_tokens[p] for p in self.prompt_index]


def encode_prompt(tokenizer, prompt: str, use_chat_template: bool = True) -> list[int]:
    """Token ids of `prompt`, as a user turn of the chat template when there is one."""
    if use_chat_template and tokenizer.has_chat_template:
        return list(tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                                  add_generation_prompt=True))
    return list(tokenizer.encode(prompt))


class _PieceStop:
    """Per-sequence text fed one piece (a token's own decoding) at a time; `add` is True on the
    piece after which `_closes` first holds for that sequence, and False for it from then on."""

    def __init__(self, n: int) -> None:
        self.texts = [""] * n
        self.closed = [False] * n

    def add(self, i: int, piece: str) -> bool:
        """Append `piece` to sequence i; True when the sequence has just closed."""
        if self.closed[i]:
            return False
        self.texts[i] += piece
        self.closed[i] = self._closes(i, piece)
        return self.closed[i]

    def _closes(self, i: int, piece: str) -> bool:
        raise NotImplementedError


class CodeBlockStop(_PieceStop):
    """Stop at the end of the first fenced code block.

    Per-token pieces of a byte-level BPE can split a multi-byte character, but backticks and
    newlines, all the fence test reads, are single bytes and come out whole. The text is
    re-scanned only when a piece holds a backtick."""

    def _closes(self, i: int, piece: str) -> bool:
        return "`" in piece and code_block_end(self.texts[i]) is not None


class StopStrings(_PieceStop):
    """Stop once the text contains any of `stop` (OpenAI's `stop`). Only the tail a new piece
    can complete is searched. A stop string holding a multi-byte character can be missed where
    a byte-level BPE token splits that character."""

    def __init__(self, n: int, stop: tuple[str, ...]) -> None:
        super().__init__(n)
        self.stop = tuple(s for s in stop if s)
        self.longest = max(map(len, self.stop), default=0)

    def _closes(self, i: int, piece: str) -> bool:
        tail = self.texts[i][-(len(piece) + self.longest - 1):] if piece else ""
        return any(s in tail for s in self.stop)


def cut_at_stop(text: str, stop: tuple[str, ...]) -> str:
    """`text` up to (not including) the first occurrence of any stop string."""
    ends = [i for s in stop if s and (i := text.find(s)) >= 0]
    return text[:min(ends)] if ends else text


def code_block_stop_index(pieces: list[str]) -> int | None:
    """Index of the piece that closes the first fenced block of "".join(pieces), or None: where
    generation with `stop_at_code_end` stops (that token kept, the rest never sampled)."""
    stop = CodeBlockStop(1)
    return next((i for i, piece in enumerate(pieces) if stop.add(0, piece)), None)


class _Buckets:
    """Keeps mlx-lm's generation batch at sizes from `decode_buckets(n)` (see the module doc).

    Wraps the BatchGenerator's GenerationBatch: `filter` (called when sequences end or are
    removed) only shrinks the batch once the live rows fit a smaller bucket, padding it with
    ended rows to exactly that size; `next` drops the responses of ended rows; the sampler
    samples the live rows only and gives ended rows token 0."""

    def __init__(self, gen: BatchGenerator, sampler, n: int) -> None:
        self.batch = gen._generation_batch
        self.buckets = decode_buckets(n)
        self.dead: set[int] = set()
        self.sizes: set[int] = set()
        self.sampler = sampler
        self._filter, self._next = self.batch.filter, self.batch.next
        self.batch.filter, self.batch.next = self.filter, self.next

    def live_rows(self) -> list[int]:
        return [i for i, uid in enumerate(self.batch.uids) if uid not in self.dead]

    def sample(self, logprobs: mx.array) -> mx.array:
        rows = len(self.batch.uids)
        if not self.dead or logprobs.shape[0] != rows:  # prefill, or nothing ended yet
            return self.sampler(logprobs)
        live = self.live_rows()
        drawn = self.sampler(logprobs[mx.array(live)])
        where = np.full(rows, len(live), np.int32)  # ended rows read the appended 0
        where[live] = np.arange(len(live))
        return mx.concatenate([drawn, mx.zeros((1,), drawn.dtype)])[mx.array(where)]

    def filter(self, keep: list[int]) -> None:
        keep = set(keep)
        self.dead.update(uid for i, uid in enumerate(self.batch.uids) if i not in keep)
        live = self.live_rows()
        size = next((b for b in self.buckets if b >= len(live)), len(self.batch.uids)) if live else 0
        if size >= len(self.batch.uids):
            return  # stay at this size: the ended rows ride along
        pad = [i for i, uid in enumerate(self.batch.uids) if uid in self.dead][: size - len(live)]
        self._filter(sorted(live + pad))

    def next(self):
        ended = set(self.dead)
        self.sizes.add(len(self.batch.uids))
        return [r for r in self._next() if r.uid not in ended]


def _prefill(model, tokens: list[int], bucketed: bool = False) -> list:
    """KV cache of `model` after `tokens` (batch 1), fed in `prefill_chunks`."""
    cache = make_prompt_cache(model)
    ids = mx.array(tokens)[None]
    start = 0
    for size in prefill_chunks(len(tokens), bucketed):
        model(ids[:, start:start + size], cache=cache)
        mx.eval([c.state for c in cache])
        start += size
    return cache


class _PrefillCache(BatchKVCache):
    """mlx-lm's `BatchKVCache` whose mask also lets a left-padding position see its own slot.
    With mlx-lm's mask its row is empty; where a kernel adds -inf for masked slots (MLX turns a
    boolean mask into one on CUDA) that row's softmax is NaN, its keys in the next layers NaN,
    and a real query's score on them NaN + -inf = NaN. Real rows' masks are unchanged."""

    def make_mask(self, N: int, return_array: bool = False, **kwargs):
        mask = super().make_mask(N, return_array=return_array, **kwargs)
        own = mx.arange(self._idx + N)[None] == (self._idx + mx.arange(N))[:, None]  # [N, slots]
        return mask | own


def prefill_batch(model, prompts: list[list[int]], bucketed: bool = False,
                  width: int | None = None) -> list[BatchKVCache]:
    """mlx-lm's per-layer `BatchKVCache`s after feeding all `prompts` (token lists, some may be
    empty) as one left-padded batch, in `prefill_chunks`: one forward pass per chunk for the
    whole batch instead of per prompt (8 prompts of 127 tokens, bucketed: 8 x 7 passes -> 1).
    `bucketed`: the batch is padded to a `bucket_width` (few shapes on a GPU). `width`: the
    batch is padded to this many tokens whenever its longest prompt fits (one shape for every
    call: `mlxio.rl.shapes`). Only the transformer runs (no [P, T, vocab] logits)."""
    width = prefill_width(max(map(len, prompts)), bucketed, width)
    padding = [width - len(p) for p in prompts]
    ids = mx.array([[0] * pad + p for pad, p in zip(padding, prompts, strict=True)], mx.int32)
    cache = [_PrefillCache(padding) for _ in range(len(model.layers))]
    body = getattr(model, "model", model)
    start = 0
    for size in prefill_chunks(width, bucketed):
        body(ids[:, start:start + size], cache=cache)
        mx.eval([c.state for c in cache])
        start += size
    return cache


ENGINES = ("auto", "static", "batch")


def resolve_engine(engine: str) -> str:
    """The decode engine "auto" stands for here: "static" on a GPU, "batch" on the CPU."""
    if engine == "auto":
        return "static" if mx.default_device().type == mx.gpu else "batch"
    return engine


def generate_group(policy, prompts: list[str], group_size: int = 8, temperature: float = 1.0,
                   top_p: float = 1.0, max_new_tokens: int = 256, seed: int = 0,
                   use_chat_template: bool = True, stop_at_code_end: bool = False,
                   stop: tuple[str, ...] = (), bucket_decode: bool | None = None,
                   engine: str = "auto", compiled: bool = True, prompt_width: int | None = None,
                   min_decode_batch: int | None = None,
                   on_row_end: Callable[[int, str], None] | None = None) -> Rollouts:
    """Sample `group_size` completions per prompt, all N = len(prompts) * group_size decoded
    together; deterministic for a given `seed` (mlx-lm's samplers draw from MLX's global PRNG,
    which is seeded here). temperature 0 is greedy. `stop_at_code_end`: a sequence also ends
    on the token that closes its first fenced code block (removed from the batch there).
    `stop`: strings that end a sequence likewise, on the token completing one (kept in its
    tokens; its text is cut before the stop string, as OpenAI's `stop`).
    `engine`: "static" (`mlxio.rl.decode`: a compiled step over a fixed-size KV cache, EOS and
    stops checked every few steps) or "batch" (mlx-lm's BatchGenerator). Greedy decoding gives
    the same tokens with either; sampling draws from the same distributions (different draws).
    "auto": "static" on a GPU (where "batch" is launch- and host-bound), "batch" on the CPU
    (where the step's compute dominates, and "batch" drops ended rows and attends over the
    filled slots only).
    `compiled` ("static" only): `mx.compile` the decode step; False runs the same step eagerly
    (same distributions; on a fresh CUDA machine no fused kernels to compile first).
    `prompt_width` ("static" only): prompts are prefilled left-padded to this many cached
    tokens (prompt - 1) whenever they fit, so every call has the same prefill and KV cache
    shapes (`mlxio.rl.shapes.plan`). `min_decode_batch` ("static" only): as rows end, the
    decode batch shrinks through `mlxcore.train.buckets.batch_ladder(N, min_decode_batch)` (N, halving);
    None keeps N rows to the end. `on_row_end(row, text)`: called once per completion (row =
    prompt index * group_size + sample) as soon as it is final, with the text it gets in the
    result, while the other rows decode (`mlxio.rl.reward_overlap`). Rows sample the same tokens
    either way (`mlxcore.models.decode_step.row_sampler`,
    up to the float rounding of the forward at another batch size).
    `bucket_decode` ("batch" only): keep the decode batch at a few sizes (see the module doc);
    None: on when the default device is a GPU (where each new size compiles kernels), off on the
    CPU (where the ended rows would only cost time). The texts and tokens are the same either way."""
    if not prompts:
        raise ValueError("generate_group needs at least one prompt")
    if group_size < 1 or max_new_tokens < 1:
        raise ValueError(f"group_size={group_size} and max_new_tokens={max_new_tokens} must be >= 1")
    if engine not in ENGINES:
        raise ValueError(f"engine={engine!r} is not one of {ENGINES}")
    model, tokenizer = policy.model, policy.tokenizer
    prompt_tokens = [encode_prompt(tokenizer, p, use_chat_template) for p in prompts]
    for i, tokens in enumerate(prompt_tokens):
        if not tokens:
            raise ValueError(f"prompt {i} encodes to no tokens")
    was_training = model.training
    model.eval()  # no LoRA dropout while sampling
    start = time.perf_counter()
    try:
        mx.random.seed(seed)
        sampler = make_sampler(temp=temperature, top_p=top_p)
        stoppers = lambda n: ([CodeBlockStop(n)] if stop_at_code_end else []) + (  # noqa: E731
            [StopStrings(n, tuple(stop))] if any(stop) else [])
        text_of = partial(completion_text, tokenizer, set(tokenizer.eos_token_ids), stop_at_code_end, tuple(stop))
        on_end = None if on_row_end is None else (lambda i, tokens, done: on_row_end(i, text_of(tokens, done)))
        engine = resolve_engine(engine)
        if engine == "static" and all(len(t) == 1 for t in prompt_tokens):
            engine = "batch"  # nothing to cache before the first step: mlx-lm's path does it
        shapes = ()
        if engine == "static":
            completions, logprobs, finished, stats, shapes = _decode_static(
                model, tokenizer, prompt_tokens, group_size, max_new_tokens, stoppers,
                (float(temperature), float(top_p)), compiled, prompt_width, min_decode_batch, on_end)
            decode_sizes = None
        else:
            stats = None
            completions, logprobs, finished, decode_sizes = _decode_batch(
                model, tokenizer, sampler, prompt_tokens, group_size, max_new_tokens, stoppers,
                bucket_decode, on_end)
    finally:
        model.train(was_training)
    seconds = time.perf_counter() - start
    texts = [text_of(c, done) for c, done in zip(completions, finished, strict=True)]
    return Rollouts(
        prompt_tokens=prompt_tokens, completion_tokens=completions,
        logprobs=[np.asarray(lp, np.float32) for lp in logprobs], texts=texts,
        prompt_index=np.repeat(np.arange(len(prompts)), group_size), finished=finished,
        gen_tokens_per_s=sum(map(len, completions)) / max(seconds, 1e-9), group_size=group_size,
        decode_batch_sizes=decode_sizes, decode_stats=stats, shapes=shapes)


def completion_text(tokenizer, eos: set[int], stop_at_code_end: bool, stop: tuple[str, ...],
                    tokens: list[int], done: bool) -> str:
    """A completion's text from its tokens (`done`: it ended, an ending EOS is dropped): cut at
    its first code block's end and at the first `stop` string, as `generate_group` asks."""
    text = tokenizer.decode(tokens[:-1] if done and tokens and tokens[-1] in eos else tokens)
    if stop_at_code_end and (end := code_block_end(text)) is not None:  # the closing token may carry more text
        text = text[:end]
    return cut_at_stop(text, stop) if any(stop) else text


def _decode_static(model, tokenizer, prompt_tokens, group_size, max_new_tokens, stoppers,
                   settings: tuple[float, float], compiled: bool = True, prompt_width: int | None = None,
                   min_decode_batch: int | None = None, on_end=None):
    """`generate_group`'s "static" engine: (completions, logprobs, finished, stats, shapes) of N
    sequences; settings: (temperature, top_p); shapes: `Rollouts.shapes`; on_end: `decode.decode`'s."""
    n = len(prompt_tokens) * group_size
    prefilled = prefill_batch(model, [t[:-1] for t in prompt_tokens], mx.default_device().type == mx.gpu,
                              prompt_width)
    width = prefilled[0].size()
    slots = cache_length(width, max_new_tokens)
    caches = decode_step.static_cache_rows(prefilled, [i // group_size for i in range(n)], slots)
    del prefilled  # (the P-row prefill caches: copied into the N-row static ones)
    eos = set(tokenizer.eos_token_ids)
    stops = stoppers(n)
    pieces: dict[int, str] = {}  # token -> its own decoding (the host reads a block between device steps)

    def is_done(i: int, new: list[int]) -> int | None:
        at_eos = next((j for j, token in enumerate(new) if token in eos), None)
        last = len(new) if at_eos is None else at_eos + 1  # EOS ends it (kept)
        for j, token in enumerate(new[:last] if stops else ()):
            if (piece := pieces.get(token)) is None:
                piece = pieces[token] = tokenizer.decode([token])
            if any([s.add(i, piece) for s in stops]):  # (a list: every stopper sees it)
                return j + 1
        return None if at_eos is None else last

    first = [prompt_tokens[i // group_size][-1] for i in range(n)]
    batches = batch_ladder(n, min_decode_batch) if min_decode_batch else None
    out = decode.decode(model, decode_step.row_sampler(*settings, n), first, caches, max_new_tokens, is_done,
                        sampler_key=(*settings, n), compiled=compiled, batches=batches, on_end=on_end)
    shapes = (("prefill", len(prompt_tokens), width), *(("decode", b, slots) for b in out[3]["batches"]))
    return (*out, shapes)


def _decode_batch(model, tokenizer, sampler, prompt_tokens, group_size, max_new_tokens, stoppers,
                  bucket_decode, on_end=None):
    """`generate_group`'s "batch" engine (mlx-lm's BatchGenerator): (completions, logprobs,
    finished, decode batch sizes or None); on_end(row, tokens, ended) once a row is final."""
    n = len(prompt_tokens) * group_size
    if bucket_decode is None:
        bucket_decode = mx.default_device().type == mx.gpu
    buckets = None
    # On the CPU, decode on the default stream: mlx-lm's own generation stream is a second
    # scheduler thread, and two threads inside the pthreads OpenBLAS at once (Debian's
    # 0.3.21) can leave its caller spinning in exec_blas_async_wait forever (seen here: a
    # prefill stuck for 9 minutes after a batched decode). One stream = one BLAS caller.
    on_cpu = mx.default_device().type == mx.cpu
    gen = BatchGenerator(model, max_tokens=max_new_tokens,
                         stop_tokens=[[t] for t in sorted(tokenizer.eos_token_ids)],
                         sampler=(lambda lp: buckets.sample(lp)) if bucket_decode else sampler,
                         completion_batch_size=n, prefill_batch_size=n,
                         stream=mx.default_stream(mx.cpu) if on_cpu else None)
    if bucket_decode:
        buckets = _Buckets(gen, sampler, n)
    # One prefill per prompt; its G sequences continue from copies of that cache.
    sequences, caches = [], []
    for tokens in prompt_tokens:
        cache = (_prefill(model, tokens[:-1], bool(bucket_decode)) if len(tokens) > 1
                 else make_prompt_cache(model))
        for _ in range(group_size):
            sequences.append(tokens[-1:] if len(tokens) > 1 else tokens)
            caches.append(copy.deepcopy(cache))
    shared = all(len(t) > 1 for t in prompt_tokens)
    uids = gen.insert(sequences if shared else [prompt_tokens[i // group_size] for i in range(n)],
                      caches=caches if shared else None)
    row = {uid: i for i, uid in enumerate(uids)}
    completions = [[] for _ in range(n)]
    logprobs = [[] for _ in range(n)]
    finished = np.zeros(n, bool)
    stops = stoppers(n)
    while responses := gen.next_generated():
        picked = mx.stack([r.logprobs[r.token] for r in responses]).tolist()
        closed = []
        for r, lp in zip(responses, picked, strict=True):
            i = row[r.uid]
            completions[i].append(r.token)
            logprobs[i].append(lp)
            finished[i] |= r.finish_reason == "stop"
            if stops and r.finish_reason != "stop":
                piece = tokenizer.decode([r.token])
                if any([s.add(i, piece) for s in stops]):  # (a list: every stopper sees it)
                    finished[i] = True
                    if r.finish_reason is None:  # (at max_new_tokens it is out already)
                        closed.append(r.uid)
            if on_end is not None and (r.finish_reason is not None or r.uid in closed):
                on_end(i, completions[i], bool(finished[i]))
        if closed:  # out of the batch: no more tokens (nor decode work) for them
            with mx.stream(gen.stream):
                gen.remove(closed)
    gen.close()
    return completions, logprobs, finished, sorted(buckets.sizes) if buckets else None
