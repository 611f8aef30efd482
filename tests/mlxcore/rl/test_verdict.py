"""mlxcore.rl.verdict: the judge's loss, P(yes), balanced batches and AUC (with its problem bootstrap)
against independent references."""

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy.stats import mannwhitneyu

from mlxcore.rl import verdict
from mlxcore.rl.passk import bootstrap_indices


@given(st.lists(st.tuples(st.integers(0, 6), st.booleans()), min_size=2, max_size=40))
def test_roc_auc_is_the_mann_whitney_statistic(rows):
    scores = np.array([s / 6 for s, _ in rows])  # few distinct values: ties happen
    labels = np.array([y for _, y in rows])
    got = verdict.roc_auc(scores, labels)
    if labels.all() or not labels.any():
        assert got is None
        return
    u = mannwhitneyu(scores[labels], scores[~labels]).statistic  # ties count 1/2
    assert got == pytest.approx(u / (labels.sum() * (~labels).sum()))


def test_roc_auc_extremes():
    assert verdict.roc_auc(np.array([0.9, 0.8, 0.1]), np.array([True, True, False])) == 1.0
    assert verdict.roc_auc(np.array([0.1, 0.8, 0.9]), np.array([True, True, False])) == 0.0
    assert verdict.roc_auc(np.array([0.5, 0.5]), np.array([True, False])) == 0.5


@given(st.integers(0, 2**31 - 1))
def test_auc_bootstrap_is_the_auc_of_each_resampled_set(seed):
    rng = np.random.default_rng(seed)
    groups = np.repeat(np.arange(6), 3)  # six problems, three completions each
    labels = rng.random(18) < 0.5
    scores = {"a": rng.random(18), "b": np.round(rng.random(18), 1)}
    boot = verdict.auc_bootstrap(scores, labels, groups, resamples=20, seed=seed)
    for r, draw in enumerate(bootstrap_indices(6, 20, seed)):
        rows = np.concatenate([np.flatnonzero(groups == g) for g in draw])  # whole problems, repeats kept
        for name, s in scores.items():
            want = verdict.roc_auc(s[rows], labels[rows])
            assert (np.isnan(boot[name][r]) if want is None else boot[name][r] == pytest.approx(want)), (r, name)


def test_interval_skips_one_class_resamples():
    assert verdict.interval(np.array([np.nan, np.nan])) is None
    lo, hi = verdict.interval(np.array([np.nan, 0.2, 0.4, 0.6]))
    assert 0.2 <= lo <= hi <= 0.6


@given(st.integers(1, 4), st.integers(1, 9), st.integers(1, 9), st.integers(0, 5))
def test_balanced_indices_walk_each_class_per_epoch(per_class, positives, negatives, seed):
    steps = [verdict.balanced_indices(s, per_class, positives, negatives, seed) for s in range(12)]
    for idx in steps:
        assert (idx[:per_class] < positives).all() and (idx[per_class:] >= positives).all()
        assert (idx < positives + negatives).all()
    pos = np.concatenate([i[:per_class] for i in steps])
    for epoch in range(len(pos) // positives):  # every whole epoch of the positives: each one once
        assert sorted(pos[epoch * positives:(epoch + 1) * positives]) == list(range(positives))
    again = verdict.balanced_indices(5, per_class, positives, negatives, seed)
    np.testing.assert_array_equal(again, steps[5])  # a pure function of the step


def test_verdict_loss_is_the_answer_token_cross_entropy():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(4, 7)).astype(np.float32)
    batch = {"inputs": mx.array(logits), "last": mx.zeros(4, mx.int32),
             "target": mx.array([1, 2, 1, 2]), "other": mx.array([2, 1, 2, 1])}
    loss_fn = verdict.verdict_loss_fn(lambda _params, inputs, _last: inputs)
    loss, metrics = loss_fn({}, batch, mx.random.key(0))
    logp = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    rows = np.arange(4)
    assert float(loss) == pytest.approx(-logp[rows, [1, 2, 1, 2]].mean(), rel=1e-6)
    assert float(metrics["accuracy"]) == pytest.approx(np.mean(logp[rows, [1, 2, 1, 2]] > logp[rows, [2, 1, 2, 1]]))
    mass = np.exp(logp[rows, [1, 2, 1, 2]]) + np.exp(logp[rows, [2, 1, 2, 1]])
    assert float(metrics["answer_mass"]) == pytest.approx(mass.mean(), rel=1e-6)


def test_answer_probs_and_scores():
    logits = mx.array(np.log(np.array([[0.5, 0.2, 0.1, 0.2], [0.05, 0.05, 0.6, 0.3]], np.float32)))
    p_yes, p_no = verdict.answer_probs(logits, mx.array([0, 1]), mx.array([2]))
    np.testing.assert_allclose(np.array(p_yes), [0.7, 0.1], rtol=1e-5)
    np.testing.assert_allclose(np.array(p_no), [0.1, 0.6], rtol=1e-5)
    # the served judge's score / 10: P(yes) + half of the mass on neither answer
    np.testing.assert_allclose(verdict.verdict_scores(np.array(p_yes), np.array(p_no)), [0.8, 0.25], rtol=1e-5)
