"""Test set-up: a fast BLAS before MLX loads, float32 GEMMs in float32 on CUDA (MLX's default
there is TF32, ~1e-3 relative: parity tests state float32 tolerances), and a derandomised
hypothesis profile for CI."""

import os

os.environ.setdefault("MLX_ENABLE_TF32", "0")

from hypothesis import HealthCheck, settings

import mlxio  # noqa: F401  (first: gives MLX's CPU build a fast BLAS)

settings.register_profile(
    "ci", derandomize=True, deadline=None, max_examples=25,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("dev", deadline=None, max_examples=25,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
