"""`python -m mlxio.kernel_cache_cli export|import|info`: the name older scripts and notes use for
`python -m mlxio.gpu.kernel_cache_cli` (the same command, run from here)."""

from __future__ import annotations

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # first: MLX's CPU BLAS is chosen when mlx.core loads (mlxio.runtime)

import sys

from mlxio.errors import cli_main
from mlxio.gpu.kernel_cache_cli import main

if __name__ == "__main__":
    cli_main("kernel_cache", main, sys.argv[1:])
