"""All I/O of the project: checkpoints, tokenizers, datasets, caches, exports, sandbox, teacher.

Importing this package first gives MLX's Linux CPU build an optimised BLAS (see `mlxio.blas`)
points MLX's on-disk GPU kernel cache at a persistent folder (see `mlxio.kernel_cache`) and
gives mlxcore's own CUDA kernels their compiler (`mlxio.cuda_build`) and, where it is built, the
fused feed-forward its GEMM (`mlxio.cuda_ext`).
"""

from mlxio.blas import ensure_fast_blas
from mlxio.kernel_cache import configure as _configure_kernel_cache

ensure_fast_blas()
_configure_kernel_cache()

# after the BLAS and kernel-cache set-up: these import MLX
from mlxcore import cuda_jit as _cuda_jit  # noqa: E402
from mlxcore import ffn_cuda as _ffn_cuda  # noqa: E402
from mlxio import cuda_ext as _cuda_ext  # noqa: E402
from mlxio.cuda_build import COMPILER as _CUDA_COMPILER  # noqa: E402

_cuda_jit.register_compiler(_CUDA_COMPILER)
if _cuda_ext.load() is not None:
    _ffn_cuda.register_extension(_cuda_ext.load())
