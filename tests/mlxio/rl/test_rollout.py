"""Batched group generation on a tiny random llama / qwen2: shapes, determinism, EOS stop,
log-probabilities against teacher forcing."""

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten, tree_unflatten

from mlxcore.rl.packing import completion_logprobs
from mlxcore.train.lora import LoraConfig
from mlxio.rl.rollout import generate_group
from mlxio.weights import llm, llm_lora

PROMPTS = ["Write add(a, b).", "hi", "Reverse a string in Python, please."]


def test_group_shapes_and_grouping():
    policy = llm.tiny_policy("llama")
    ro = generate_group(policy, PROMPTS, group_size=4, max_new_tokens=12, seed=0)
    n = len(PROMPTS) * 4
    assert len(ro.prompt_tokens) == len(PROMPTS)
    assert len(ro.completion_tokens) == len(ro.logprobs) == len(ro.texts) == n
    np.testing.assert_array_equal(ro.prompt_index, np.repeat([0, 1, 2], 4))
    assert ro.finished.shape == (n,) and ro.gen_tokens_per_s > 0
    chat = policy.tokenizer.decode(ro.prompt_tokens[1])
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    for c, lp, done in zip(ro.completion_tokens, ro.logprobs, ro.finished, strict=True):
        assert len(lp) == len(c) and (done or len(c) == 12) and np.all(lp <= 0)
    assert ro.sequence_prompt_tokens[5] == ro.prompt_tokens[1]
    # G completions of one prompt are distinct samples, not copies.
    assert len({tuple(c) for c in ro.completion_tokens[:4]}) > 1
    plain = generate_group(policy, ["hi"], group_size=1, max_new_tokens=2, use_chat_template=False)
    assert plain.prompt_tokens == [list(b"hi")]


def test_deterministic_per_seed():
    policy = llm.tiny_policy("qwen2")
    a = generate_group(policy, PROMPTS[:2], group_size=3, max_new_tokens=10, seed=5)
    b = generate_group(policy, PROMPTS[:2], group_size=3, max_new_tokens=10, seed=5)
    c = generate_group(policy, PROMPTS[:2], group_size=3, max_new_tokens=10, seed=6)
    assert a.completion_tokens == b.completion_tokens
    assert all(np.array_equal(x, y) for x, y in zip(a.logprobs, b.logprobs, strict=True))
    assert a.completion_tokens != c.completion_tokens


def test_stops_at_eos_per_sequence():
    """Make a token sampled mid-way in sequence 0 an EOS: the same seed then stops sequence 0
    right after it (EOS kept as its last token, left out of the text), the rest run on."""
    policy = llm.tiny_policy("llama", seed=1)
    first = generate_group(policy, PROMPTS[:2], group_size=2, max_new_tokens=16, seed=3)
    assert not first.finished.any()
    stop = first.completion_tokens[0][5]
    cut = first.completion_tokens[0].index(stop)
    policy.tokenizer.add_eos_token(policy.tokenizer.convert_ids_to_tokens(stop))
    again = generate_group(policy, PROMPTS[:2], group_size=2, max_new_tokens=16, seed=3)
    assert again.completion_tokens[0] == first.completion_tokens[0][: cut + 1]
    assert again.finished[0] and again.texts[0] == policy.tokenizer.decode(again.completion_tokens[0][:-1])
    for tokens, done in zip(again.completion_tokens, again.finished, strict=True):
        assert (stop in tokens) == bool(done)
        assert tokens.count(stop) <= 1 and (not done or tokens[-1] == stop)
        assert done or len(tokens) == 16


@pytest.mark.parametrize("kind,quantize,lora", [("llama", False, False), ("qwen2", False, True),
                                                ("llama", True, True)])
def test_logprobs_match_teacher_forcing(kind, quantize, lora):
    policy = llm.tiny_policy(kind, quantize=quantize)
    if lora:
        lora = llm_lora.apply_lora(policy.model, LoraConfig(rank=4, targets=("q_proj", "v_proj")), None,
                                   mx.random.key(0))
        flat = [(k, mx.random.normal(v.shape, key=mx.random.key(i)) if k.endswith("lora_b") else v)
                for i, (k, v) in enumerate(tree_flatten(lora))]
        policy = llm_lora.bound_policy(policy, tree_unflatten(flat))  # generation on the bound view
    ro = generate_group(policy, PROMPTS, group_size=2, max_new_tokens=20, seed=2)
    forced = completion_logprobs(policy.model, ro.prompt_tokens, ro.completion_tokens)
    for got, want in zip(ro.logprobs, forced, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-3)


def test_temperature_zero_is_greedy():
    policy = llm.tiny_policy("llama")
    ro = generate_group(policy, PROMPTS[:1], group_size=2, temperature=0.0, max_new_tokens=8)
    assert ro.completion_tokens[0] == ro.completion_tokens[1]
    tokens = ro.prompt_tokens[0] + ro.completion_tokens[0]
    logits = policy.model(mx.array([tokens]))[0, len(ro.prompt_tokens[0]) - 1: -1]
    assert mx.argmax(logits, axis=-1).tolist() == ro.completion_tokens[0]


def test_bad_arguments():
    policy = llm.tiny_policy("llama")
    with pytest.raises(ValueError, match="prompt"):
        generate_group(policy, [])
    with pytest.raises(ValueError, match="group_size"):
        generate_group(policy, ["x"], group_size=0)
