"""MLX's GPU side, on the machine: where MLX keeps the kernels it compiles and how to carry them to
another machine (`kernel_cache`, `kernel_cache_cli`), compiling a recipe's kernels ahead in child
processes (`kernel_warm`), NVRTC for our own CUDA kernels (`cuda_build`), and the C++ MLX extension
of the fused feed-forward (`cuda_ext`)."""
