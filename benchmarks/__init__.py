"""Benchmarks, run as `python -m benchmarks.<name>`; each writes JSON to benchmarks/results/."""

import mlxio  # noqa: F401  (first: gives MLX's CPU build a fast BLAS)
