"""Pass@k and its uncertainty, as pure functions over per-problem counts.

`pass_at_k` is the unbiased estimator of the HumanEval paper (Chen et al. 2021, eq. 1): with n
samples of a problem of which c pass, the chance that at least one of k samples drawn without
replacement passes is 1 - C(n - c, k) / C(n, k). A benchmark's pass@k is its mean over problems.
Uncertainty comes from the problems (the population we sample from), so the 95% intervals here
are percentile bootstraps over problems; a before/after difference is bootstrapped *paired*
(the same resampled problems on both sides), which removes the between-problem variance that
both runs share.
"""

from __future__ import annotations

import numpy as np


def pass_at_k(n: np.ndarray, c: np.ndarray, k: int) -> np.ndarray:
    """Unbiased pass@k per problem: n, c int arrays [P] (samples, passing samples) -> [P] float64.

    Computed as 1 - prod_{i = n-c+1}^{n} (1 - k / i), the numerically stable product form of
    1 - C(n-c, k) / C(n, k); a problem with n - c < k passes for sure (1.0). Requires 1 <= k <= n.
    """
    n = np.asarray(n, np.int64)
    c = np.asarray(c, np.int64)
    if n.shape != c.shape:
        raise ValueError(f"n {n.shape} and c {c.shape} must have the same shape")
    if np.any(c < 0) or np.any(c > n):
        raise ValueError("need 0 <= c <= n for every problem")
    if k < 1 or np.any(n < k):
        raise ValueError(f"k={k} must be in [1, n] for every problem (min n = {n.min(initial=0)})")
    out = np.ones(n.shape, np.float64)
    for idx in np.ndindex(n.shape):
        ni, ci = int(n[idx]), int(c[idx])
        if ni - ci >= k:
            out[idx] = 1.0 - np.prod(1.0 - k / np.arange(ni - ci + 1, ni + 1, dtype=np.float64))
    return out


def bootstrap_indices(num_problems: int, resamples: int, seed: int) -> np.ndarray:
    """[resamples, num_problems] indices drawn with replacement (seeded, reproducible)."""
    if num_problems < 1 or resamples < 1:
        raise ValueError(f"need >= 1 problem and >= 1 resample, got {num_problems}, {resamples}")
    return np.random.default_rng(seed).integers(0, num_problems, (resamples, num_problems))


def mean_ci(per_problem: np.ndarray, *, resamples: int = 10_000, level: float = 0.95,
            seed: int = 0) -> tuple[float, tuple[float, float]]:
    """(mean, (lo, hi)): the mean over problems [P] and its percentile-bootstrap interval."""
    x = np.asarray(per_problem, np.float64)
    means = x[bootstrap_indices(len(x), resamples, seed)].mean(axis=1)
    tail = (1.0 - level) / 2 * 100
    lo, hi = np.percentile(means, [tail, 100 - tail])
    return float(x.mean()), (float(lo), float(hi))


def paired_diff_ci(before: np.ndarray, after: np.ndarray, *, resamples: int = 10_000,
                   level: float = 0.95, seed: int = 0) -> tuple[float, tuple[float, float]]:
    """(mean of after - before, its interval) over the same P problems, resampled jointly."""
    b = np.asarray(before, np.float64)
    a = np.asarray(after, np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"before {b.shape} and after {a.shape} must be the same [P] shape")
    return mean_ci(a - b, resamples=resamples, level=level, seed=seed)
