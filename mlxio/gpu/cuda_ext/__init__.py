"""An optional compiled extension for MLX's CUDA build: a cuBLASLt GEMM with a ReLU epilogue.

`gemm_epilogue.cpp` defines the MLX primitive `matmul_relu_aux` that `mlxcore.kernels.ffn_cuda` uses in
T5's ReLU feed-forward; `mlxio.runtime.setup()` registers it there when it is built. Build it once on a
machine with MLX's CUDA build, the CUDA toolkit, CMake, fmt's headers and nanobind 3.0
(`pip install "nanobind>=3.0,<3.2"`, MLX 0.32.4's ABI):

    python -m mlxio.gpu.cuda_ext          # -> mlxio/gpu/cuda_ext/_gemm_epilogue.*.so

Without it (or with MLXCORE_GEMM_EPILOGUE=0) everything runs as before: `load()` is None.
"""

from __future__ import annotations

import os
from functools import cache


@cache
def load():
    """The built extension module, or None: not built, not MLX's CUDA build, or switched off by
    MLXCORE_GEMM_EPILOGUE=0 (read once per process)."""
    if os.environ.get("MLXCORE_GEMM_EPILOGUE", "1") == "0":
        return None
    from mlxcore.kernels import cuda_jit

    if not cuda_jit.on_cuda():
        return None
    try:
        from mlxio.gpu.cuda_ext import _gemm_epilogue
    except ImportError:
        return None
    return _gemm_epilogue
