"""Ended rows stop costing decode steps (issue 33 item 5): the static engine compacts its live
rows into the smaller batches of `buckets.batch_ladder`, and every row samples the same tokens
with or without compaction (`decode_step.row_sampler`: a row's Gumbel noise does not depend on the
rows beside it), greedy and seeded sampling, fused step and mlx-lm forward; the rows computed
(`row_steps`) fall when rows end early."""

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mlx_lm.sample_utils import make_sampler

from mlxcore.models import decode_step
from mlxcore.train import buckets
from mlxio.rl import decode, rollout
from mlxio.rl.rollout import generate_group
from mlxio.weights import llm

PROMPTS = ["Write add(a, b).", "hi", "Reverse a string in Python, please."]


@pytest.fixture(autouse=True)
def _fused_on_cpu(monkeypatch):
    """The fused step is the GPU default; `fused=None` runs it on the CPU too."""
    monkeypatch.setattr(decode, "FUSED_DEVICES", {mx.cpu, mx.gpu})


def test_batch_ladder():
    assert buckets.batch_ladder(64, 8) == (64, 32, 16, 8)
    assert buckets.batch_ladder(24, 8) == (24, 16, 8)
    assert buckets.batch_ladder(16, 1) == (16, 8, 4, 2, 1)
    assert buckets.batch_ladder(8, 8) == buckets.batch_ladder(8, 64) == (8,)
    assert buckets.batch_ladder(1, 1) == (1,)


@pytest.mark.parametrize(("temperature", "top_p"), [(0.8, 0.95), (1.0, 1.0), (0.6, 0.5), (0.0, 1.0)])
def test_row_sampler_is_make_samplers_draw_for_any_rows(temperature, top_p):
    """Over the full batch the draw of mlx-lm's sampler, bit for bit; over some of its rows the
    same tokens those rows drew in the full batch."""
    logits = 3 * mx.random.normal((12, 300), key=mx.random.key(0))
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    sample = decode_step.row_sampler(temperature, top_p, 12)
    mx.random.seed(5)
    want = make_sampler(temp=temperature, top_p=top_p)(logprobs)
    mx.random.seed(5)
    full = sample(logprobs, mx.arange(12, dtype=mx.int32))
    assert mx.array_equal(full, want) and full.dtype == want.dtype
    rows = mx.array([1, 4, 5, 11], mx.int32)
    mx.random.seed(5)
    assert mx.array_equal(sample(logprobs[rows], rows), want[rows])
    if temperature:
        assert not mx.array_equal(sample(logprobs, mx.arange(12, dtype=mx.int32)), want)  # a fresh draw


def _run(model, prompts, group, max_new, ends, temperature, batches, seed=3, fused=None):
    """decode.decode over `prompts` x `group` rows, row i ending at ends[i] tokens (None: never)."""
    n = len(prompts) * group
    prefilled = rollout.prefill_batch(model, [p[:-1] for p in prompts])
    caches = decode_step.static_cache_rows(prefilled, [i // group for i in range(n)],
                                      buckets.cache_length(prefilled[0].size(), max_new))
    got = [0] * n

    def is_done(i, new):
        before, got[i] = got[i], got[i] + len(new)
        return ends[i] - before if ends[i] is not None and got[i] >= ends[i] else None

    mx.random.seed(seed)
    first = [prompts[i // group][-1] for i in range(n)]
    return decode.decode(model, decode_step.row_sampler(temperature, 1.0, n), first, caches, max_new, is_done,
                         sync_every=4, sampler_key=(temperature, 1.0, n, "test"), fused=fused, batches=batches)


def _same_rows(a, b):
    assert a[0] == b[0]  # tokens
    np.testing.assert_array_equal(a[2], b[2])  # ended
    for x, y in zip(a[1], b[1], strict=True):
        np.testing.assert_allclose(x, y, atol=1e-5)


@pytest.fixture(scope="module")
def tiny():
    return llm.tiny_policy("llama", seed=1).model


@settings(max_examples=12)
@given(ends=st.lists(st.one_of(st.none(), st.integers(1, 24)), min_size=8, max_size=8),
       temperature=st.sampled_from([0.0, 1.0]), smallest=st.sampled_from([1, 2, 4]), fused=st.booleans())
def test_compaction_keeps_every_rows_tokens(tiny, ends, temperature, smallest, fused):
    prompts = [[5, 6, 7, 8], [9, 10]]
    plain = _run(tiny, prompts, 4, 24, ends, temperature, None, fused=fused)
    ladder = buckets.batch_ladder(8, smallest)
    compact = _run(tiny, prompts, 4, 24, ends, temperature, ladder, fused=fused)
    _same_rows(compact, plain)
    assert [len(t) for t in plain[0]] == [e if e is not None else 24 for e in ends]
    assert set(compact[3]["batches"]) <= set(ladder) and compact[3]["batches"][0] == 8
    assert compact[3]["batches"] == sorted(compact[3]["batches"], reverse=True)
    assert plain[3]["row_steps"] == 8 * plain[3]["steps"] and plain[3]["batches"] == [8]
    assert compact[3]["row_steps"] <= plain[3]["row_steps"]
    assert compact[3]["steps"] == plain[3]["steps"]


def test_rows_computed_fall_when_rows_end_early(tiny):
    """6 of 8 rows end after 2 tokens, 1 after 9, 1 runs to 32: blocks of 4 steps, the host one
    block behind, so the batch is 8 rows for 2 blocks, 2 rows for 2, then 1."""
    ends = [2, 2, 9, 2, 2, None, 2, 2]
    plain = _run(tiny, [[5, 6, 7, 8], [9, 10]], 4, 32, ends, 1.0, None)
    compact = _run(tiny, [[5, 6, 7, 8], [9, 10]], 4, 32, ends, 1.0, buckets.batch_ladder(8, 1))
    _same_rows(compact, plain)
    assert plain[3]["row_steps"] == 8 * 32
    assert compact[3]["batches"] == [8, 2, 1]
    assert compact[3]["row_steps"] == 8 * 8 + 2 * 8 + 1 * 16
    assert compact[3]["steps_by_batch"] == {8: 8, 2: 8, 1: 16} and plain[3]["steps_by_batch"] == {8: 32}
    assert set(compact[3]["seconds_by_batch"]) == {8, 2, 1} and min(compact[3]["seconds_by_batch"].values()) > 0


def _ended_policy(kind: str, n_eos: int):
    """A tiny policy with `n_eos` of the tokens a free run samples made EOS: rows end at many steps."""
    policy = llm.tiny_policy(kind, seed=1)
    free = generate_group(policy, PROMPTS, group_size=4, max_new_tokens=24, seed=3, engine="static")
    counts = np.bincount(np.concatenate([c[2:] for c in free.completion_tokens]))
    for tok in np.argsort(-counts)[:n_eos]:
        policy.tokenizer.add_eos_token(policy.tokenizer.convert_ids_to_tokens(int(tok)))
    return policy


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_generate_group_compacted_gives_the_same_completions(kind, temperature):
    policy = _ended_policy(kind, 6)
    kw = dict(group_size=4, max_new_tokens=40, seed=3, temperature=temperature, engine="static",
              stop_at_code_end=True)
    plain = generate_group(policy, PROMPTS, **kw)
    compact = generate_group(policy, PROMPTS, min_decode_batch=2, **kw)
    assert compact.completion_tokens == plain.completion_tokens
    assert compact.texts == plain.texts
    np.testing.assert_array_equal(compact.finished, plain.finished)
    for a, b in zip(compact.logprobs, plain.logprobs, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)
    stats = compact.decode_stats
    assert set(stats["batches"]) <= set(buckets.batch_ladder(12, 2))
    assert stats["row_steps"] <= plain.decode_stats["row_steps"] == 12 * plain.decode_stats["steps"]
    if temperature:  # the sampled rows end at many steps: the batch shrank
        assert plain.finished.sum() >= 6 and len(stats["batches"]) >= 2
        assert stats["row_steps"] < plain.decode_stats["row_steps"]
    slots = plain.shapes[1][2]
    assert compact.shapes == (plain.shapes[0], *(("decode", b, slots) for b in stats["batches"]))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_fixed_prompt_width_changes_no_token(temperature):
    """Prompts left-padded to a fixed width (`prompt_width`: one prefill and cache shape for
    every call) decode as without; a longer prompt than the width falls back to its own."""
    policy = llm.tiny_policy("llama", seed=1)
    kw = dict(group_size=2, max_new_tokens=12, seed=5, temperature=temperature, engine="static")
    plain = generate_group(policy, PROMPTS, **kw)
    wide = generate_group(policy, PROMPTS, prompt_width=96, **kw)
    assert wide.completion_tokens == plain.completion_tokens
    for a, b in zip(wide.logprobs, plain.logprobs, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)
    longest = max(map(len, plain.prompt_tokens)) - 1
    assert plain.shapes[0] == ("prefill", 3, longest) and wide.shapes[0] == ("prefill", 3, 96)
    assert wide.shapes[1] == ("decode", 6, buckets.cache_length(96, 12))
    assert generate_group(policy, PROMPTS, prompt_width=4, **kw).shapes[0] == plain.shapes[0]
