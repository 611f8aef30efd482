"""All I/O of the project: checkpoints, tokenizers, datasets, caches, exports, sandbox, teacher.

Importing it changes nothing in the process: an entry point calls `mlxio.runtime.setup()` first
(MLX's CPU BLAS, its kernel cache, the compiler of mlxcore's CUDA kernels).
"""
