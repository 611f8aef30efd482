"""Rollouts as training rows (mlxcore.rl.packing): prompt + completion right-padded to a bucket
width, the completion mask, sampling-time log-probs at the completion positions."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlxcore.rl.packing import pack, pack_tokens
from mlxio.rl.rollout import generate_group
from mlxio.weights import llm

PROMPTS = ["Write add(a, b).", "hi", "Reverse a string in Python, please."]


def test_pack_rollouts():
    policy = llm.tiny_policy("llama")
    ro = generate_group(policy, PROMPTS, group_size=2, max_new_tokens=9, seed=1)
    packed = pack(ro, pad_id=256)
    n = len(ro.completion_tokens)
    assert packed["tokens"].shape[0] == n and packed["tokens"].shape[1] % 32 == 0
    for i in range(n):
        p, c = ro.sequence_prompt_tokens[i], ro.completion_tokens[i]
        row = packed["tokens"][i]
        assert list(row[: len(p) + len(c)]) == p + c and np.all(row[len(p) + len(c):] == 256)
        assert packed["completion_mask"][i].sum() == len(c)
        np.testing.assert_array_equal(packed["logprobs"][i][packed["completion_mask"][i] > 0],
                                      ro.logprobs[i])
    np.testing.assert_array_equal(packed["prompt_index"], ro.prompt_index)


ragged = st.lists(st.lists(st.integers(0, 300), min_size=1, max_size=40), min_size=1, max_size=6)


@settings(max_examples=15)
@given(prompts=ragged, data=st.data())
def test_pack_tokens_property(prompts, data):
    """Rows are prompt + completion right-padded to a multiple of 32; the mask marks exactly
    the completion positions; P prompts broadcast over N = P * G prompt-major completions."""
    group = data.draw(st.integers(1, 3))
    completions = data.draw(st.lists(st.lists(st.integers(0, 300), max_size=40),
                                     min_size=len(prompts) * group, max_size=len(prompts) * group))
    packed = pack_tokens(prompts, completions)
    width = packed["tokens"].shape[1]
    assert width % 32 == 0 and width - 32 < max(packed["lengths"].max(), 1) <= width
    for i, c in enumerate(completions):
        p = prompts[i // group]
        mask = packed["completion_mask"][i]
        assert packed["lengths"][i] == len(p) + len(c) and packed["prompt_lengths"][i] == len(p)
        assert list(np.nonzero(mask)[0]) == list(range(len(p), len(p) + len(c)))
        assert list(packed["tokens"][i][: len(p) + len(c)]) == p + c


def test_prompts_must_group_the_completions():
    with pytest.raises(ValueError, match="group"):
        pack_tokens([[1], [2]], [[3], [4], [5]])
