"""mlxcore.rl.logprobs (chunked log-probs and entropy from hidden states) against the plain
computation from full logits: values and gradients, hypothesis-drawn shapes, chunk sizes,
padding and dtypes; and the causal LM's hidden-state / head split it is used with.

Tolerances: float32 values 1e-5 (absolute and relative), gradients 1e-5 of max(their largest
entry, 1) (the entries are sums over the vocabulary of O(1) terms that can cancel).
bfloat16 hidden states and head: the logits are the same bf16 matmul on both sides, so values
agree to 1e-5 as well; the gradient is rounded to bf16 at a different point (the plain VJP
scales d logits by the cotangent before its bf16 matmul, the chunked one after: cotangent x
J), so 2e-2 of max(the largest entry, 1) (a few bf16 ulps)."""

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlxcore.rl import packing, policy
from mlxcore.rl.logprobs import gathered_logprobs, head_logprobs

DTYPES = {"float32": mx.float32, "bfloat16": mx.bfloat16}
GRAD_TOL = {"float32": 1e-5, "bfloat16": 2e-2}


def plain(head, hidden, targets):
    """The plain computation: full logits, float32 log-softmax (policy.token_logprobs), and the
    entropy of the same softmax."""
    z = head(hidden).astype(mx.float32)
    log_p = z - mx.logsumexp(z, axis=-1, keepdims=True)
    return policy.token_logprobs(z, targets), -(mx.exp(log_p) * log_p).sum(-1)


@st.composite
def problems(draw):
    m, h, v = draw(st.integers(1, 40)), draw(st.integers(1, 16)), draw(st.integers(2, 64))
    seed = draw(st.integers(0, 2**16))
    dtype = draw(st.sampled_from(sorted(DTYPES)))
    rng = np.random.default_rng(seed)
    w = mx.array(rng.normal(0, 1.5, (v, h)).astype(np.float32)).astype(DTYPES[dtype])
    hidden = mx.array(rng.normal(0, 1, (m, h)).astype(np.float32)).astype(DTYPES[dtype])
    targets = mx.array(rng.integers(0, v, m).astype(np.int32))
    cot = [mx.array(rng.normal(0, 1, m).astype(np.float32)) for _ in range(2)]
    return (lambda x: x @ w.T), hidden, targets, cot, dtype, draw(st.integers(1, 50))


def assert_close(got, want, rel):
    got, want = np.array(got.astype(mx.float32)), np.array(want.astype(mx.float32))
    scale = max(float(np.abs(want).max()), 1.0)
    np.testing.assert_allclose(got, want, rtol=rel, atol=rel * scale)


@given(problems(), st.booleans())
def test_values_and_gradients_match_plain(problem, entropy):
    head, hidden, targets, (c1, c2), dtype, chunk = problem
    lp, ent = head_logprobs(head, hidden, targets, chunk=chunk, entropy=entropy)
    want_lp, want_ent = plain(head, hidden, targets)
    assert lp.dtype == mx.float32 and lp.shape == targets.shape
    np.testing.assert_allclose(np.array(lp), np.array(want_lp), rtol=1e-5, atol=1e-5)
    if entropy:
        np.testing.assert_allclose(np.array(ent), np.array(want_ent), rtol=1e-5, atol=1e-5)
    else:
        assert ent is None

    def ours(h):
        lp, ent = head_logprobs(head, h, targets, chunk=chunk, entropy=entropy)
        return (lp * c1).sum() + ((ent * c2).sum() if entropy else 0.0)

    def reference(h):
        lp, ent = plain(head, h, targets)
        return (lp * c1).sum() + ((ent * c2).sum() if entropy else 0.0)

    want = mx.grad(reference)(hidden)
    assert_close(mx.grad(ours)(hidden), want, GRAD_TOL[dtype])
    assert_close(mx.compile(mx.grad(ours))(hidden), want, GRAD_TOL[dtype])


@given(problems())
def test_frozen_path_equals_differentiable_values(problem):
    head, hidden, targets, _, _, chunk = problem
    a, _ = head_logprobs(head, hidden, targets, chunk=chunk, differentiable=False)
    b, _ = head_logprobs(head, hidden, targets, chunk=chunk)
    np.testing.assert_array_equal(np.array(a), np.array(b))


@st.composite
def padded_batches(draw):
    n, s, h, v = draw(st.integers(1, 4)), draw(st.integers(1, 9)), draw(st.integers(1, 8)), draw(st.integers(2, 32))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    mask = draw(st.lists(st.booleans(), min_size=n * s, max_size=n * s))
    mask = np.array(mask, np.float32).reshape(n, s)
    return (rng.normal(0, 1, (n, s, h)).astype(np.float32), rng.normal(0, 1, (v, h)).astype(np.float32),
            rng.integers(0, v, (n, s)).astype(np.int32), mask, draw(st.integers(1, 8)))


@given(padded_batches())
def test_gathered_scores_only_positions_and_padding_changes_nothing(batch):
    hidden, w, targets, mask, chunk = batch
    n, s = mask.shape
    head = lambda x: x @ mx.array(w).T  # noqa: E731
    positions = packing.target_positions(mask, n, chunk)[0]  # one micro-batch, padded with n * s
    assert positions.shape[0] >= int(mask.sum()) and (positions[int(mask.sum()):] == n * s).all()
    cot = mx.array(np.random.default_rng(1).normal(size=(n, s)).astype(np.float32))

    def ours(h):
        lp, ent = gathered_logprobs(head, h, mx.array(targets), mx.array(mask), mx.array(positions), chunk=chunk,
                                    entropy=True)
        return (lp * cot).sum() + (ent * cot).sum(), (lp, ent)

    def reference(h):
        lp, ent = plain(head, h, mx.array(targets))
        m = mx.array(mask)
        return ((lp * m) * cot).sum() + ((ent * m) * cot).sum(), (lp * m, ent * m)

    (_, got), g_got = mx.value_and_grad(ours)(mx.array(hidden))
    (_, want), g_want = mx.value_and_grad(reference)(mx.array(hidden))
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(np.array(a), np.array(b), rtol=1e-5, atol=1e-5)
    assert_close(g_got, g_want, 1e-5)
    # rows that are not scored get exactly zero gradient; garbage in padded slots changes nothing
    assert np.all(np.array(g_got)[mask == 0] == 0.0)
    extra = np.concatenate([positions, np.full(3, n * s + 7, np.int32)])
    again, _ = gathered_logprobs(head, mx.array(hidden), mx.array(targets), mx.array(mask), mx.array(extra),
                                 chunk=chunk)
    np.testing.assert_array_equal(np.array(again), np.array(got[0]))


def test_no_full_logits_in_memory():
    """Value and gradient in chunks of 32 rows of a 4096 vocabulary: the peak does not grow with
    the number of rows (a chunk's few [32, V] buffers) and stays below a quarter of one
    [rows, V] float32 array at 4096 rows, while the plain computation's grows with them."""
    rng = np.random.default_rng(0)
    h, v = 32, 4096
    w = mx.array(rng.normal(0, 0.1, (v, h)).astype(np.float32))
    head = lambda x: x @ w.T  # noqa: E731

    def peak(rows, fn):
        hidden = mx.array(rng.normal(0, 1, (rows, h)).astype(np.float32))
        targets = mx.array(rng.integers(0, v, rows).astype(np.int32))
        mx.eval(w, hidden, targets)
        step = mx.grad(lambda x: fn(x, targets).sum())
        mx.eval(step(hidden))
        mx.reset_peak_memory()
        base = mx.get_active_memory()
        mx.eval(step(hidden))
        return mx.get_peak_memory() - base

    def chunked(x, t):
        return head_logprobs(head, x, t, chunk=32)[0]

    def full(x, t):
        return plain(head, x, t)[0]

    small, large = peak(512, chunked), peak(4096, chunked)
    assert large < 1.5 * small
    assert large < 4096 * v * 4 / 4
    assert peak(4096, full) > 3 * peak(512, full)


def test_bad_inputs_give_one_clear_error():
    head = lambda x: x  # noqa: E731
    with pytest.raises(ValueError, match="chunk must be >= 1"):
        head_logprobs(head, mx.zeros((3, 4)), mx.zeros((3,), mx.int32), chunk=0)
    with pytest.raises(ValueError, match=r"hidden must be \[M, H\]"):
        head_logprobs(head, mx.zeros((2, 3, 4)), mx.zeros((2, 3), mx.int32))
    with pytest.raises(ValueError, match="do not match"):
        gathered_logprobs(head, mx.zeros((2, 5, 4)), mx.zeros((2, 4), mx.int32), mx.ones((2, 4)),
                          mx.zeros((3,), mx.int32))
    with pytest.raises(ValueError, match="must divide"):
        packing.target_positions(np.ones((5, 3)), 2, 4)


def test_target_positions_pad_to_few_sizes():
    mask = np.zeros((4, 100), np.float32)
    mask[0, 10:90] = 1
    mask[3, 50:60] = 1
    pos = packing.target_positions(mask, 2, 32)
    assert pos.shape == (2, 96)  # 80 scored rows in the first micro-batch -> bucket 3 x 32
    np.testing.assert_array_equal(pos[0, :80], np.arange(10, 90))
    np.testing.assert_array_equal(pos[1, :10], 100 + np.arange(50, 60))
    assert (pos[0, 80:] == 200).all() and (pos[1, 10:] == 200).all()
    assert packing.target_positions(mask[:1, :3], 1, 512).shape == (1, 3)  # never wider than the rows


# --- the causal LM split into hidden states and a frozen head --------------------------------

@settings(max_examples=6)
@given(st.sampled_from(["llama", "qwen2"]), st.booleans(), st.booleans())
def test_hidden_states_and_head_are_the_forward(kind, quantize, checkpoint):
    """head(hidden(lora, ids)) == forward(lora, ids) and so are the LoRA gradients, with a
    quantised base (QLoRA) and with checkpointed blocks."""
    from mlx.utils import tree_flatten, tree_unflatten

    from mlxcore.train.lora import LoraConfig
    from mlxio.weights import llm, llm_lora

    model = llm.tiny_policy(kind, seed=0, quantize=quantize).model
    tree = llm_lora.apply_lora(model, LoraConfig(rank=4, alpha=8.0, targets=("q_proj", "v_proj")), None,
                               mx.random.key(1))
    tree = tree_unflatten([(k, mx.random.normal(v.shape, key=mx.random.key(i)) * 0.1)
                           for i, (k, v) in enumerate(tree_flatten(tree))])
    ids = mx.array(np.random.default_rng(0).integers(0, 250, (2, 9)))
    head, hidden = llm_lora.lm_head(model), llm_lora.hidden_states(model, checkpoint)
    forward = llm_lora.forward(model)
    np.testing.assert_array_equal(np.array(head(hidden(tree, ids))), np.array(forward(tree, ids)))
    got = mx.grad(lambda t: policy.token_logprobs(head(hidden(t, ids)), ids).sum())(tree)
    want = mx.grad(lambda t: policy.token_logprobs(forward(t, ids), ids).sum())(tree)
    for (path, a), (_, b) in zip(tree_flatten(got), tree_flatten(want), strict=True):
        np.testing.assert_allclose(np.array(a), np.array(b), rtol=1e-4, atol=1e-6, err_msg=path)


def test_unknown_model_type_is_refused():
    from mlxio.weights import llm_lora

    class Odd:
        model_type = "gemma2"

    with pytest.raises(ValueError, match="model type 'gemma2'"):
        llm_lora.lm_head(Odd())
