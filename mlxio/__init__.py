"""All I/O of the project: checkpoints, tokenizers, datasets, caches, exports, sandbox, teacher.

Importing this package first gives MLX's Linux CPU build an optimised BLAS (see `mlxio.blas`).
"""

from mlxio.blas import ensure_fast_blas

ensure_fast_blas()
