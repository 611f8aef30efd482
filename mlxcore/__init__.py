"""Pure functional core: functions of parameter pytrees (nested dicts/lists of `mx.array`).

Nothing here reads a file, a clock or a global; see DESIGN.md. Import `mlxio` before this
package on Linux CPU so that MLX gets a fast BLAS.
"""
