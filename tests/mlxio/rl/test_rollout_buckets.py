"""Decode batch buckets (issue 19 item 2a): with `bucket_decode` the decode batch only takes the
sizes of `mlxcore.train.buckets.decode_buckets(N)`, and the completions are exactly those of mlx-lm's shrinking batch
for the same seed (the sampler draws for the live rows only)."""

import numpy as np
import pytest

from mlxcore.train.buckets import decode_buckets
from mlxio.rl.rollout import generate_group
from mlxio.weights import llm

PROMPTS = ["Write add(a, b).", "hi", "Reverse a string in Python, please."]


def _ended_policy(n_eos: int):
    """A tiny policy with `n_eos` of the tokens its unbucketed run samples made EOS, so the
    sequences end at many different steps."""
    policy = llm.tiny_policy("llama", seed=1)
    free = generate_group(policy, PROMPTS, group_size=4, max_new_tokens=20, seed=3, bucket_decode=False)
    counts = np.bincount(np.concatenate([c[2:] for c in free.completion_tokens]))
    for tok in np.argsort(-counts)[:n_eos]:
        policy.tokenizer.add_eos_token(policy.tokenizer.convert_ids_to_tokens(int(tok)))
    return policy


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_buckets_give_the_same_completions(temperature):
    policy = _ended_policy(6)
    kw = dict(group_size=4, max_new_tokens=20, seed=3, temperature=temperature)
    plain = generate_group(policy, PROMPTS, bucket_decode=False, **kw)
    bucketed = generate_group(policy, PROMPTS, bucket_decode=True, **kw)
    lengths = sorted(map(len, plain.completion_tokens))
    if temperature:  # ends spread over steps (greedy decoding of the tiny model repeats itself)
        assert plain.finished.sum() >= 4 and len(set(lengths)) >= 4, lengths
    assert bucketed.completion_tokens == plain.completion_tokens
    assert bucketed.texts == plain.texts
    np.testing.assert_array_equal(bucketed.finished, plain.finished)
    for a, b in zip(bucketed.logprobs, plain.logprobs, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    assert plain.decode_batch_sizes is None
    assert set(bucketed.decode_batch_sizes) <= set(decode_buckets(12))
    assert 12 in bucketed.decode_batch_sizes
    if temperature:  # without buckets the batch had a size per distinct number of live sequences
        live = {sum(len(c) > k for c in plain.completion_tokens) for k in range(max(lengths))}
        assert len(live) > len(bucketed.decode_batch_sizes) >= 2, (live, bucketed.decode_batch_sizes)


def test_buckets_with_code_block_stop():
    """Sequences removed by the caller (stop_at_code_end / stop strings) ride along as well."""
    policy = _ended_policy(2)
    kw = dict(group_size=4, max_new_tokens=20, seed=4, stop=("a", "e"))
    plain = generate_group(policy, PROMPTS, bucket_decode=False, **kw)
    bucketed = generate_group(policy, PROMPTS, bucket_decode=True, **kw)
    assert bucketed.completion_tokens == plain.completion_tokens and bucketed.texts == plain.texts
    assert set(bucketed.decode_batch_sizes) <= set(decode_buckets(12))
