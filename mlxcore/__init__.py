"""Pure functional core: functions of parameter pytrees (nested dicts/lists of `mx.array`).

Nothing here reads a file, a clock or a global; docs/architecture.md says which layer owns
what (tests/test_purity.py keeps I/O imports out). A program calls `mlxio.runtime.setup()`
before it imports this package (MLX's CPU BLAS is chosen when mlx.core loads).
"""
