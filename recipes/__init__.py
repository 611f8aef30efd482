"""Config-as-code recipes, run as `python -m recipes.<name>`."""

import mlxio  # noqa: F401  (first: gives MLX's CPU build a fast BLAS)
