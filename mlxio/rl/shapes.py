"""The array shapes an RLAIF step can meet, listed before step 1.

On a GPU every new shape of a compiled step (and of the eager prefill's kernels) compiles
anew, so a step whose shapes follow its data pays a compilation - the longest prompt of the step (prefill width, and
with it the KV cache's slots), the longest prompt + completion (the update's width) and the most
completion tokens of a micro-batch (its scored positions). `plan` fixes them from the config
and the training prompts' lengths:

- prefill [prompts, prompt_width]: every prompt left-padded to the longest training prompt's
  `bucket_width` (cached tokens: a prompt's last token is fed by the first decode step);
- decode [rows, cache_slots] for rows in `decode_batches`: the rank's P x G rows, then the
  compaction ladder (`mlxcore.train.buckets.batch_ladder`: halving down to `min_decode_batch`), the
  slots `cache_length(prompt_width, max_new_tokens)`;
- update [micro, width, positions(width)] for width in `update_widths`: the `bucket_width`s
  from the shortest possible row (shortest prompt + 1 token) to the longest (longest prompt +
  max_new_tokens), each with its scored positions fixed at the most a micro-batch of that width
  can hold, rounded up to a multiple of the log-prob chunk (and the number of micro-batches k
  when the update is one graph, `memory.eval_micro_batches` false).

So a run sees at most 1 + len(decode_batches) + len(update_widths) (x accum for one graph)
shapes, whatever its data: the gpu preset 1 + 3 + 2 = 6 (`tests/mlxio/rl/test_shapes.py`
checks the bound per preset and that random steps stay inside the list). A prompt longer than
the training set's (none in a recipe run) falls back to its own bucket, a shape outside the list.
`ShapePlan.keys` are the keys `Rollouts.shapes` and `update_key` report, so the recipe counts the
shapes each step meets first (`new_shapes` in metrics.jsonl).
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs
import mlx.core as mx

from mlxcore.fields import bounded
from mlxcore.train.buckets import batch_ladder, bucket_width, cache_length
from mlxio.errors import ConfigError


@attrs.frozen(kw_only=True)
class ShapesConfig:
    """The array shapes of a step (`plan`, `warm`; `mlxio.rl.warm_up`). On a GPU each new shape compiles,
    so the prefill, update and scored-position widths are fixed before step 1."""

    # pad prompts, update rows and scored positions to shapes listed before step 1 (from the
    # training prompts' lengths and max_new_tokens). None: on a GPU
    fixed: bool | None = None
    # with `fixed`: the update pads rows to the largest N widths of the ladder (0: all of it,
    # the gpu preset's 5; 1: every step at the longest possible row, one update shape)
    update_widths: int = bounded(0, ge=0, le=64)
    # the static engine's decode batch shrinks as rows end, through N, N/2, ... down to this many
    # rows (mlxcore.train.buckets.batch_ladder; >= N: never), so ended rows stop costing compute
    min_decode_batch: int = bounded(8, ge=1, le=65536)
    # run every listed shape once before step 1 (its compilation then falls there). None: with
    # `fixed` on a GPU
    warm_up: bool | None = None


def fixed(setting: bool | None) -> bool:
    """Whether steps pad to planned shapes (`--shapes.fixed`): the setting; None: on a GPU."""
    return setting if setting is not None else mx.default_device().type == mx.gpu


def warm(setting: bool | None, plan: ShapePlan | None) -> bool:
    """Whether the planned shapes run before step 1 (`--shapes.warm_up`): the setting (True
    needs a plan); None: where there is one, on a GPU."""
    if setting and plan is None:
        raise ConfigError("shapes.warm_up: nothing to warm up without planned shapes",
                          fix="set --shapes.fixed true too (on a GPU it is on by default)")
    return setting if setting is not None else plan is not None and mx.default_device().type == mx.gpu


@attrs.frozen(kw_only=True)
class ShapePlan:
    """Every shape of a step under one config (see the module doc); keys as `Rollouts.shapes`."""

    prompts: int  # prompts per step on this rank: the prefill's rows
    prompt_width: int  # the prefill's width: cached prompt tokens (prompt - 1)
    cache_slots: int  # the static KV cache's slots
    decode_batches: tuple[int, ...]  # decode batch sizes, largest (P x G) first
    update_widths: tuple[int, ...]  # packed widths (prompt + completion tokens), ascending
    positions: tuple[int, ...]  # scored positions per micro-batch, one per update width
    micro: int  # rows per micro-batch
    accum: int  # micro-batches per step
    one_graph: bool  # the update is one compiled graph: its micro-batch count k is a shape too

    def positions_for(self, width: int) -> int | None:
        """The scored positions per micro-batch at a planned `width` (None: not planned)."""
        return dict(zip(self.update_widths, self.positions, strict=True)).get(width)

    def keys(self) -> frozenset[tuple]:
        """Every shape key a step can report under this plan."""
        ks = range(1, self.accum + 1) if self.one_graph else (None,)
        return frozenset({("prefill", self.prompts, self.prompt_width),
                          *(("decode", b, self.cache_slots) for b in self.decode_batches),
                          *(update_key_of(self.micro, w, p, k, self.one_graph)
                            for w, p in zip(self.update_widths, self.positions, strict=True) for k in ks)})


def update_key_of(micro: int, width: int, positions: int, k: int | None, one_graph: bool) -> tuple:
    return ("update", micro, width, positions, k) if one_graph else ("update", micro, width, positions)


def update_key(batch: dict, one_graph: bool) -> tuple:
    """The shape key of a step's batch (`grpo.build_batch`: tokens [k, micro, T], positions [k, P])."""
    k, micro, width = batch["tokens"].shape
    return update_key_of(micro, width, batch["positions"].shape[1], k, one_graph)


def width_ladder(shortest: int, longest: int) -> tuple[int, ...]:
    """The `bucket_width`s from the one holding `shortest` tokens to the one holding `longest`."""
    out, width = [], bucket_width(shortest)
    while True:
        out.append(width)
        if width >= longest:
            return tuple(out)
        width = bucket_width(width + 1)


def scored_positions(width: int, micro: int, shortest_prompt: int, max_new_tokens: int, chunk: int) -> int:
    """The most completion tokens a micro-batch of rows `width` wide can hold (each row at most
    max_new_tokens of them after a prompt of at least `shortest_prompt`), rounded up to a
    multiple of `chunk`, at most micro x (width - 1) (every target position)."""
    most = micro * max(1, min(max_new_tokens, width - shortest_prompt))
    return min(-(-most // chunk) * chunk, micro * (width - 1))


def plan(cfg: ShapesConfig, *, prompt_lengths: Iterable[int], prompts: int, rows: int, max_new_tokens: int,
         accum: int, logprob_chunk: int, one_graph: bool) -> ShapePlan:
    """The shapes of a step for training prompts of `prompt_lengths` tokens (chat template
    applied; their shortest and longest are read), `prompts` prompts and `rows` completions per
    step on this rank, at most `max_new_tokens` each, `accum` micro-batches, log-probs scored
    `logprob_chunk` positions at a time, and the update one graph (`one_graph`) or one per
    micro-batch. `cfg`: the ladders' ends (update_widths, min_decode_batch)."""
    lengths = list(prompt_lengths)
    shortest_prompt, longest_prompt = min(lengths), max(lengths)
    if shortest_prompt < 1:
        raise ValueError(f"a prompt of {shortest_prompt} tokens: every prompt needs one")
    prompt_width = bucket_width(max(longest_prompt - 1, 1))
    widths = width_ladder(shortest_prompt + 1, longest_prompt + max_new_tokens)
    if cfg.update_widths:
        widths = widths[-cfg.update_widths:]
    micro = rows // accum
    return ShapePlan(
        prompts=prompts, prompt_width=prompt_width, cache_slots=cache_length(prompt_width, max_new_tokens),
        decode_batches=batch_ladder(rows, cfg.min_decode_batch), update_widths=widths,
        positions=tuple(scored_positions(w, micro, shortest_prompt, max_new_tokens, logprob_chunk) for w in widths),
        micro=micro, accum=accum, one_graph=one_graph)
