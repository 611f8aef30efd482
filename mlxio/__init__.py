"""All I/O of the project: checkpoints, tokenizers, datasets, caches, exports, sandbox, teacher.

Importing this package first gives MLX's Linux CPU build an optimised BLAS (see `mlxio.blas`)
and points MLX's on-disk GPU kernel cache at a persistent folder (see `mlxio.kernel_cache`).
"""

from mlxio.blas import ensure_fast_blas
from mlxio.kernel_cache import configure as _configure_kernel_cache

ensure_fast_blas()
_configure_kernel_cache()
