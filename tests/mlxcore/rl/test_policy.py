"""mlxcore.rl.policy against NumPy references (each loss type and GRPO control against its formula), and the LoRA-off reference on a real (tiny) llama."""

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from mlx.utils import tree_flatten

from mlxcore.rl import policy
from mlxcore.train.optim import OptimConfig, make_optimizer
from mlxcore.train.step import init_state, make_train_step

finite = st.floats(-5, 5, allow_nan=False, width=32)


def np_group_adv(r, g, eps, normalise=True):
    r = r.astype(np.float64).reshape(-1, g)
    centred = r - r.mean(axis=1, keepdims=True)
    if normalise:
        centred = centred / (r.std(axis=1, keepdims=True) + eps)
    return centred.reshape(-1)


@st.composite
def grouped_rewards(draw):
    g = draw(st.integers(1, 6))
    groups = draw(st.integers(1, 5))
    r = draw(hnp.arrays(np.float32, g * groups, elements=st.sampled_from([0.0, 0.2, 1.0, 1.2]) | finite))
    return r, g


@given(grouped_rewards())
def test_group_advantages_match_numpy(data):
    r, g = data
    got = np.array(policy.group_advantages(mx.array(r), g, eps=1e-4))
    np.testing.assert_allclose(got, np_group_adv(r, g, 1e-4), rtol=1e-4, atol=1e-3)
    base = np.array(policy.baseline_advantages(mx.array(r), g))
    np.testing.assert_allclose(base, np_group_adv(r, g, 0, normalise=False), rtol=1e-5, atol=1e-5)


def test_group_ids_equal_consecutive_groups_and_constant_group_is_zero():
    r = mx.array([1.0, 0.0, 1.0, 1.0, 0.5, 0.5])
    ids = mx.array([0, 1, 0, 1, 2, 2])  # interleaved labels
    got = np.array(policy.group_advantages(r, group_ids=ids))
    ref = np.zeros(6)
    ref[[0, 2]] = np_group_adv(np.array([1.0, 1.0]), 2, 1e-4)
    ref[[1, 3]] = np_group_adv(np.array([0.0, 1.0]), 2, 1e-4)
    np.testing.assert_allclose(got, ref, atol=1e-4)
    assert got[4] == 0.0 and got[5] == 0.0  # identical rewards carry no signal
    with pytest.raises(ValueError, match="group_size"):
        policy.group_advantages(r, 4)


@given(hnp.arrays(np.float32, st.tuples(st.integers(1, 3), st.integers(1, 5), st.integers(2, 9)),
                  elements=finite), st.data())
def test_token_logprobs_match_numpy(logits, data):
    n, t, v = logits.shape
    targets = data.draw(hnp.arrays(np.int32, (n, t), elements=st.integers(0, v - 1)))
    got = np.array(policy.token_logprobs(mx.array(logits), mx.array(targets)))
    x = logits.astype(np.float64)
    logz = np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1)) + x.max(-1)
    ref = np.take_along_axis(x, targets[..., None], -1)[..., 0] - logz
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def np_aggregate(x, m, kind, micro, max_len):
    """Each loss type's formula, written out (not through weights)."""
    n = len(x)
    if kind == "grpo":
        seqs = m.sum(1) > 0
        return ((x * m).sum(1)[seqs] / m.sum(1)[seqs]).sum() / max(seqs.sum(), 1)
    if kind == "dr_grpo":
        return (x * m).sum() / (n * max_len)
    if kind == "dapo":
        return (x * m).sum() / max(m.sum(), 1)
    parts = [(x[i:i + micro] * m[i:i + micro]).sum() / max(m[i:i + micro].sum(), 1) for i in range(0, n, micro)]
    return np.mean(parts)


def np_entropy_term(ent, m, kind, micro, max_len, target):
    """The entropy term, written out: the mean over micro-batches b of M_b * f(H_b), H_b the
    micro-batch's mean entropy as the loss type weighs its tokens (grpo: the mean over its
    sequences with a token of each one's token mean; else its token mean) and M_b its share of
    the step (k x its part of the normaliser; bnpo: 1); f = -H (bonus) or max(target - H, 0)."""
    n, k = len(m), len(m) // micro
    lengths = m.sum(1)
    terms = []
    for i in range(0, n, micro):
        e, mb, lb = ent[i:i + micro], m[i:i + micro], lengths[i:i + micro]
        tokens = mb.sum()
        if kind == "grpo":
            rows = lb > 0
            mass = k * rows.sum() / max((lengths > 0).sum(), 1)
            h = ((e * mb).sum(1)[rows] / lb[rows]).mean() if rows.any() else 0.0
        else:
            mass = {"dr_grpo": k * tokens / (n * max_len), "dapo": k * tokens / max(m.sum(), 1),
                    "bnpo": float(tokens > 0)}[kind]
            h = (e * mb).sum() / tokens if tokens else 0.0
        terms.append(mass * (-h if target is None else max(target - h, 0.0)))
    return np.mean(terms)


def np_loss(logp, old, ref, adv, mask, beta, clip, clip_high, level, ent, coef, target, kind, micro, max_len):
    logp, old, ref = (a.astype(np.float64) for a in (logp, old, ref))
    a = adv.astype(np.float64)[:, None]
    m = mask.astype(np.float64)
    if clip is None:
        per = -(logp * a)
    else:
        if level == "token":
            ratio = np.exp(logp - old)
        else:  # GSPO: exp of the mean log-ratio over the sequence's tokens
            ratio = np.exp(((logp - old) * m).sum(1, keepdims=True) / np.maximum(m.sum(1, keepdims=True), 1))
        high = clip if clip_high is None else clip_high
        per = -np.minimum(ratio * a, np.clip(ratio, 1 - clip, 1 + high) * a)
    d = ref - logp
    k3 = np.exp(d) - d - 1

    def agg(x):
        return np_aggregate(np.broadcast_to(x, m.shape), m, kind, micro, max_len)

    loss = agg(per) + beta * agg(k3)
    if ent is not None:
        loss += coef * np_entropy_term(ent.astype(np.float64), m, kind, micro, max_len, target)
    return loss, agg(k3), agg(-logp)


def check_policy_loss(kind, clip, clip_high, level, beta, target, micro, logp, old, ref, adv, mask, ent):
    """The step's loss (mean over micro-batches of `policy_loss` with `loss_weights`), kl and
    Monte-Carlo entropy against `np_loss`; coef 0.01 on the entropy (target 0.0: no entropy)."""
    n, t = mask.shape
    coef = 0.0 if target == 0.0 else 0.01
    use_ent = target != 0.0
    w = policy.loss_weights(mx.array(mask), kind, micro, max_len=t + 2)
    losses, kls, ents = [], [], []
    for b in range(n // micro):
        rows = slice(b * micro, (b + 1) * micro)
        loss, m = policy.policy_loss(
            *(mx.array(x[rows]) for x in (logp, old, ref, adv, mask)), w[rows], beta, clip,
            clip_eps_high=clip_high, importance_ratio=level, entropy=mx.array(ent[rows]) if use_ent else None,
            entropy_coef=coef, entropy_target=target)
        losses.append(float(loss))
        kls.append(float(m["kl"]))
        ents.append(float(m["entropy"]))
        assert float(m["kl"]) >= -1e-6
    want, kl, mc_ent = np_loss(logp, old, ref, adv, mask, beta, clip, clip_high, level, ent if use_ent else None,
                               coef, target, kind, micro, t + 2)
    np.testing.assert_allclose(np.mean(losses), want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.mean(kls), kl, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.mean(ents), mc_ent, rtol=1e-4, atol=1e-5)


@settings(max_examples=60)
@given(st.data(), st.sampled_from(policy.LOSS_TYPES), st.sampled_from([None, 0.2]), st.sampled_from([None, 0.28]),
       st.sampled_from(policy.RATIO_LEVELS), st.floats(0, 0.5), st.sampled_from([None, 0.0, 0.5]))
def test_policy_loss_matches_each_formula(data, kind, clip, clip_high, level, beta, target):
    """The step's loss equals each loss type's formula with clip / clip-higher, token or
    sequence (GSPO) ratios, an entropy bonus (target None) or target; metrics too; rows with no
    completion token included. Tolerance 1e-4 (float32 sums of <= 24 terms)."""
    if clip is None and (level == "sequence" or clip_high is not None):
        return  # the recipe refuses these (tested in test_grpo_options_are_checked)
    k, micro, t = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3)), data.draw(st.integers(1, 6))
    n = k * micro
    logp_el = st.floats(-4, 0, width=32)
    logp, old, ref = (data.draw(hnp.arrays(np.float32, (n, t), elements=logp_el)) for _ in range(3))
    old = np.clip(logp + data.draw(hnp.arrays(np.float32, (n, t), elements=st.floats(-0.5, 0.5, width=32))), -9, 0)
    adv = data.draw(hnp.arrays(np.float32, n, elements=finite))
    mask = data.draw(hnp.arrays(np.int32, (n, t), elements=st.integers(0, 1)))
    ent = data.draw(hnp.arrays(np.float32, (n, t), elements=st.floats(0, 3, width=32)))
    check_policy_loss(kind, clip, clip_high, level, beta, target, micro, logp, old, ref, adv, mask, ent)


@pytest.mark.parametrize("kind", policy.LOSS_TYPES)
@pytest.mark.parametrize(("mask", "ent"), [
    ([[0], [1]], [[1.0], [1.0]]),  # shrunk by hypothesis: a row (here a micro-batch) with no token
    ([[1], [1]], [[0.0], [3.0]]),  # micro-batches on either side of the target
    ([[0, 0], [0, 0], [1, 1], [1, 0]], [[2.0, 2.0], [2.0, 2.0], [0.1, 0.2], [2.0, 0.0]]),
], ids=["empty-row", "straddling-target", "empty-micro-batch"])
def test_entropy_target_pinned_cases(kind, mask, ent):
    """Shrunk failures, pinned: with an entropy target the penalty acts on each micro-batch's
    own mean entropy, weighted by its share of the step; a micro-batch with no scored token
    adds nothing (it used to count as entropy 0, below any target)."""
    mask, ent = np.array(mask, np.int32), np.array(ent, np.float32)
    zeros = np.zeros(mask.shape, np.float32)
    adv = np.ones(len(mask), np.float32)
    for micro in (1, 2):
        check_policy_loss(kind, 0.2, None, "token", 0.0, 0.5, micro, zeros - 1, zeros - 1, zeros - 1, adv, mask, ent)


@pytest.mark.parametrize("kind", policy.LOSS_TYPES)
@pytest.mark.parametrize(("clip", "level", "target"), [(None, "token", None), (0.2, "token", 0.5),
                                                       (0.2, "sequence", 0.5), (0.2, "sequence", None)])
def test_unscored_positions_contribute_nothing(kind, clip, level, target):
    """inf / NaN where the mask is 0 (a row with no completion token, padding) changes no loss,
    metric or gradient, and an all-masked micro-batch gives a finite, zero loss and gradient."""
    rng = np.random.default_rng(0)
    mask = np.array([[1, 1, 0], [0, 0, 0], [1, 0, 0], [0, 0, 0]], np.int32)
    logp, old, ref = (mx.array(-rng.random(mask.shape).astype(np.float32) * mask) for _ in range(3))
    ent = mx.array(rng.random(mask.shape).astype(np.float32) * mask)
    adv = mx.array([1.0, 2.0, -1.0, 0.5])
    off = mx.array(mask == 0)
    bad = {name: mx.where(off, mx.array(fill), x) for name, x, fill in
           (("old", old, np.nan), ("ref", ref, -np.inf), ("ent", ent, np.inf))}
    bad_adv = mx.array([1.0, np.nan, -1.0, np.inf])
    w = policy.loss_weights(mx.array(mask), kind, 2, 3)

    def run(lp, o, r, a, e, rows):
        def f(lp):
            loss, m = policy.policy_loss(lp[rows], o[rows], r[rows], a[rows], mx.array(mask[rows]), w[rows], 0.1,
                                         clip, importance_ratio=level, entropy=e[rows], entropy_coef=0.1,
                                         entropy_target=target)
            return loss, m
        (loss, m), g = mx.value_and_grad(f)(lp)
        return float(loss), {k: float(v) for k, v in m.items()}, np.array(g)

    for rows in (slice(0, 2), slice(2, 4), slice(1, 2)):
        clean = run(logp, old, ref, adv, ent, rows)
        dirty = run(mx.where(off, mx.array(np.nan), logp), bad["old"], bad["ref"], bad_adv, bad["ent"], rows)
        assert np.isfinite(dirty[0]) and np.isfinite(dirty[2]).all()
        assert dirty[0] == clean[0] and dirty[1] == clean[1]
        np.testing.assert_array_equal(dirty[2], clean[2])
    loss, metrics, grad = run(logp, old, ref, adv, ent, slice(1, 2))  # the all-masked row alone
    assert loss == 0.0 and not grad.any() and all(v == 0.0 for v in metrics.values())


@given(hnp.arrays(np.int32, st.tuples(st.integers(1, 6), st.integers(1, 5)), elements=st.integers(0, 1)),
       st.sampled_from(["grpo", "dr_grpo", "dapo"]))
def test_global_weights_make_accumulation_exact(mask, kind):
    """Every micro-batch split of the step gives the same loss weights (x k / k'), so gradient
    accumulation equals one big batch for the global loss types (not bnpo, by its definition)."""
    n = mask.shape[0]
    whole = np.array(policy.loss_weights(mx.array(mask), kind, n, 7))
    for micro in (d for d in range(1, n + 1) if n % d == 0):
        split = np.array(policy.loss_weights(mx.array(mask), kind, micro, 7))
        np.testing.assert_allclose(split / (n // micro), whole, rtol=1e-6)


@settings(max_examples=40)
@given(st.data(), st.sampled_from(policy.LOSS_TYPES), st.sampled_from([None, 0.2]),
       st.sampled_from(policy.RATIO_LEVELS), st.sampled_from([None, 0.0, 0.5]))
def test_ranks_with_step_normalisers_equal_one_rank(data, kind, clip, level, target):
    """Data-parallel: R ranks, each with `loss_weights` over every rank's row lengths and
    `across_ranks` (here: the other ranks' values, recorded in a first pass), averaged as the
    step averages them (losses, metrics and gradients over ranks, then micro-batches), equal
    one rank whose micro-batch b holds every rank's b-th: loss, metrics and the gradient with
    respect to every row's log-probs and entropies. Rows with no token included."""
    if clip is None and level == "sequence":
        return
    ranks, k, micro, t = (data.draw(st.integers(lo, hi)) for lo, hi in ((1, 3), (1, 3), (1, 2), (1, 4)))
    n = k * micro  # rows per rank
    shape = (ranks * n, t)
    logp, old, ref = (data.draw(hnp.arrays(np.float32, shape, elements=st.floats(-4, 0, width=32))) for _ in range(3))
    adv = data.draw(hnp.arrays(np.float32, ranks * n, elements=finite))
    mask = data.draw(hnp.arrays(np.int32, shape, elements=st.integers(0, 1)))
    ent = data.draw(hnp.arrays(np.float32, shape, elements=st.floats(0, 3, width=32)))
    use_ent, coef = target != 0.0, 0.05
    max_len = t + 1

    def micro_loss(lp, e, rows, w, across=None):
        at = mx.array(rows)
        return policy.policy_loss(lp[at], mx.array(old[rows]), mx.array(ref[rows]), mx.array(adv[rows]),
                                  mx.array(mask[rows]), w, 0.1, clip, importance_ratio=level,
                                  entropy=e[at] if use_ent else None, entropy_coef=coef, entropy_target=target,
                                  across_ranks=across)

    # one rank: rows ordered as the ranks' micro-batches (rank 0's first, rank 1's first, ...)
    order = np.arange(ranks * n).reshape(ranks, k, micro).transpose(1, 0, 2).reshape(k, ranks * micro)
    w_one = policy.loss_weights(mx.array(mask[order.reshape(-1)]), kind, ranks * micro, max_len)

    def one_rank(lp, e):
        parts = [micro_loss(lp, e, order[b], w_one[b * ranks * micro:(b + 1) * ranks * micro]) for b in range(k)]
        return sum(p[0] for p in parts) / k, {name: sum(p[1][name] for p in parts) / k for name in parts[0][1]}

    # R ranks: rank r holds rows [r n, (r + 1) n), its micro-batch b rows r n + [b micro, (b + 1) micro)
    lengths = mx.array(mask.sum(1).reshape(ranks, n))
    w_rank = [policy.loss_weights(mx.array(mask[r * n:(r + 1) * n]), kind, micro, max_len, lengths)
              for r in range(ranks)]

    def rows_of(r, b):
        return np.arange(r * n + b * micro, r * n + (b + 1) * micro)

    seen = {}  # (rank, b) -> what that rank's loss passed to across_ranks, in order
    for r in range(ranks):
        for b in range(k):
            calls = seen[r, b] = []
            micro_loss(mx.array(logp), mx.array(ent), rows_of(r, b), w_rank[r][b * micro:(b + 1) * micro],
                       lambda x, calls=calls: calls.append(x) or x)

    def rank_mean(b):
        index = iter(range(len(seen[0, b])))

        def mean(x):
            i = next(index)
            return mx.stop_gradient(sum(seen[r, b][i] for r in range(ranks)) / ranks - x) + x
        return mean

    def all_ranks(lp, e):
        parts = [micro_loss(lp, e, rows_of(r, b), w_rank[r][b * micro:(b + 1) * micro], rank_mean(b))
                 for r in range(ranks) for b in range(k)]
        return sum(p[0] for p in parts) / (k * ranks), {
            name: sum(p[1][name] for p in parts) / (k * ranks) for name in parts[0][1]}

    inputs = (mx.array(logp), mx.array(ent))
    (loss1, m1), g1 = mx.value_and_grad(one_rank, argnums=(0, 1))(*inputs)
    (loss_r, m_r), g_r = mx.value_and_grad(all_ranks, argnums=(0, 1))(*inputs)
    np.testing.assert_allclose(float(loss_r), float(loss1), rtol=1e-5, atol=1e-6)
    for name in m1:
        np.testing.assert_allclose(float(m_r[name]), float(m1[name]), rtol=1e-5, atol=1e-6, err_msg=name)
    for a, b in zip(g_r, g1, strict=True):
        np.testing.assert_allclose(np.array(a), np.array(b), rtol=1e-5, atol=1e-6)


def test_loss_weights_and_policy_loss_refuse_bad_options():
    with pytest.raises(ValueError, match="loss_type 'ppo'"):
        policy.loss_weights(mx.ones((2, 3)), "ppo", 1, 4)
    with pytest.raises(ValueError, match="must divide"):
        policy.loss_weights(mx.ones((3, 3)), "grpo", 2, 4)
    with pytest.raises(ValueError, match=r"step_lengths \(2, 4\): expected \[ranks, 3\]"):
        policy.loss_weights(mx.ones((3, 3)), "grpo", 1, 4, mx.ones((2, 4)))
    x = mx.zeros((1, 2))
    with pytest.raises(ValueError, match="needs clip_eps"):
        policy.policy_loss(x, x, x, mx.zeros(1), x, x, 0.0, None, importance_ratio="sequence")
    with pytest.raises(ValueError, match="importance_ratio 'tok'"):
        policy.policy_loss(x, x, x, mx.zeros(1), x, x, 0.0, 0.2, importance_ratio="tok")


def test_equal_reward_rows():
    r = mx.array([1.0, 1.0, 0.0, 1.0, 0.5, 0.5, 0.5])
    ids = mx.array([0, 0, 1, 1, 2, 2, 3])  # group 3 has one member: trivially equal
    assert np.array(policy.equal_reward_rows(r, ids)).tolist() == [True, True, False, False, True, True, True]


def test_clip_fraction_clip_higher_and_first_epoch_gradient_equal_reinforce():
    logp = mx.array([[-1.0, -2.0, -0.5, -0.7]])
    old = mx.array([[-1.0, -1.0, -0.5, -1.0]])  # ratios 1, e^-1 (below 0.8), 1, e^0.3 = 1.35
    mask = mx.array([[1, 1, 0, 1]])
    adv = mx.array([2.0])
    w = policy.loss_weights(mask, "grpo", 1, 4)
    _, m = policy.policy_loss(logp, old, logp, adv, mask, w, 0.0, 0.2)
    assert float(m["clip_frac"]) == pytest.approx(2 / 3)
    _, m = policy.policy_loss(logp, old, logp, adv, mask, w, 0.0, 0.2, clip_eps_high=0.4)  # 1.35 < 1.4
    assert float(m["clip_frac"]) == pytest.approx(1 / 3)

    def grad(clip, level="token"):
        f = lambda lp: policy.policy_loss(lp, mx.stop_gradient(lp), lp, adv, mask, w, 0.0, clip,  # noqa: E731
                                          importance_ratio=level)[0]
        return np.array(mx.grad(f)(logp))
    np.testing.assert_allclose(grad(0.2), grad(None), rtol=1e-6)
    np.testing.assert_allclose(grad(0.2, "sequence"), grad(None), rtol=1e-6)  # grpo weights: 1/|o| each


def test_kl_k3_is_nonnegative_and_zero_on_equal():
    a = mx.array([[-0.1, -3.0, -7.0]])
    assert np.all(np.array(policy.kl_k3(a, a)) == 0.0)
    assert np.all(np.array(policy.kl_k3(a, a - 0.5)) > 0.0)


# --- the reference is the same weights with LoRA off --------------------------------------

def tiny_llama(seed=0, lora=True):
    """(model, LoRA tree): a tiny random llama with LoRA on q/v of both blocks (B = 0)."""
    from mlxcore.train.lora import LoraConfig
    from mlxio.weights import llm, llm_lora

    model = llm.tiny_policy("llama", seed=seed).model
    tree = None
    if lora:
        tree = llm_lora.apply_lora(model, LoraConfig(rank=4, alpha=8.0, targets=("q_proj", "v_proj")), 2,
                                   mx.random.key(seed + 1))
    return model, tree


def logprobs(model, params, tokens):
    from mlxio.weights import llm_lora

    return policy.sequence_logprobs(lambda ids: llm_lora.forward(model)(params, ids), tokens)


def test_kl_is_exactly_zero_with_lora_b_zero():
    model, params = tiny_llama()
    assert all(float(mx.abs(v).max()) == 0 for k, v in tree_flatten(params) if k.endswith("lora_b"))
    tokens = mx.array(np.random.default_rng(0).integers(0, 250, (3, 7)))
    lp = logprobs(model, params, tokens)
    ref = logprobs(model, policy.reference_params(params), tokens)
    assert float(mx.abs(policy.kl_k3(lp, ref)).max()) == 0.0


def test_reference_stays_lora_off_after_training():
    model, params = tiny_llama()
    base, _ = tiny_llama(lora=False)  # same seed: the same base weights, no adapters
    base_flat = dict(tree_flatten(base.parameters()))
    for k, v in tree_flatten(model.parameters()):
        if "lora_" not in k:
            np.testing.assert_array_equal(np.array(v), np.array(base_flat[k.replace(".linear.", ".")]))
    tokens = mx.array(np.random.default_rng(1).integers(0, 250, (4, 9)))
    mask = mx.ones((4, 8))
    adv = mx.array([1.0, -1.0, 0.5, -0.5])

    def loss_fn(params, batch, key):
        lp = logprobs(model, params, batch["tokens"])
        w = policy.loss_weights(batch["mask"], "grpo", 4, 8)
        return policy.policy_loss(lp, lp, lp, batch["adv"], batch["mask"], w, 0.0)

    optimizer = make_optimizer(OptimConfig(lr=1e-2, warmup_steps=0, total_steps=10))
    step = make_train_step(loss_fn, optimizer, clip_norm=1.0)
    state = init_state(optimizer, params)
    batch = {"tokens": tokens[None], "mask": mask[None], "adv": adv[None]}
    for i in range(3):
        params, state, _ = step(params, state, batch, mx.array(i))
    mx.eval(params, state)
    assert any(float(mx.abs(v).max()) > 0 for k, v in tree_flatten(params) if k.endswith("lora_b"))
    want = policy.sequence_logprobs(base, tokens)
    ref = logprobs(model, policy.reference_params(params), tokens)
    pol = logprobs(model, params, tokens)
    np.testing.assert_array_equal(np.array(ref), np.array(want))
    assert float(mx.abs(pol - want).max()) > 1e-4


@settings(max_examples=5)
@given(st.integers(0, 3))
def test_reference_params_touch_only_lora_b(seed):
    model, _ = tiny_llama(seed)
    ref = dict(tree_flatten(policy.reference_params(model.parameters())))
    for k, v in tree_flatten(model.parameters()):
        if k.endswith("lora_b"):
            assert float(mx.abs(ref[k]).max()) == 0.0
        else:
            assert ref[k] is v
