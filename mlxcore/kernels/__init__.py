"""Our CUDA kernels for MLX's CUDA build (`*_cuda`, launched through `cuda_jit`; `ffn_cuda` through
the compiled extension that mlxio registers)."""
