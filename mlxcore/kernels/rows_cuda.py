"""CUDA kernel for an embedding lookup: rows of a table [V, D] for integer ids [...] -> [..., D].

MLX's CUDA gather moves one element per thread with its index arithmetic, far below memory
bandwidth for the t5-base b128 step's 32,768 document tokens x 768, the first kernel of every
step. Here a thread copies 16 bytes of a row; ids below zero count from the end, as in
MLX's indexing, and ids outside [-V, V) read row 0 (never out of bounds). The vjp is MLX's
scatter-add of the cotangent rows into a zero table (what MLX's gather vjp does). Launched by
`mlxcore.kernels.cuda_jit`: MLX's CUDA build only (`usable`).
"""

from __future__ import annotations

from functools import cache

import mlx.core as mx

from mlxcore.kernels import cuda_jit

_SOURCE = r"""
template <typename T, int V>
__device__ __forceinline__ void take_rows(const T* table, const int* ids, T* out, int vectors, int vocab,
                                          int row_vectors) {
  const long v = long(blockIdx.x) * blockDim.x + threadIdx.x;
  if (v >= vectors) return;
  const long n = v / row_vectors;
  const long c = (v - n * row_vectors) * V;
  long id = ids[n];
  if (id < 0) id += vocab;
  if (id < 0 || id >= vocab) id = 0;
  *reinterpret_cast<Vec<T, V>*>(out + n * row_vectors * V + c) =
      *reinterpret_cast<const Vec<T, V>*>(table + id * row_vectors * V + c);
}
"""

_BLOCK = 256


def _width(dtype: mx.Dtype) -> int:
    """Elements in 16 bytes."""
    return 16 // dtype.size


def usable(table: mx.array, ids: mx.array) -> bool:
    """True when `take_rows` can run: CUDA build with a kernel compiler, GPU stream, a float32 /
    bfloat16 table [V, D] with 16 bytes dividing a row, integer ids."""
    return (cuda_jit.available() and table.ndim == 2 and table.dtype in cuda_jit.STORAGE
            and table.shape[1] % _width(table.dtype) == 0 and mx.issubdtype(ids.dtype, mx.integer)
            and ids.size * table.shape[1] // _width(table.dtype) < 2**31)


@cache
def _entry(dtype: mx.Dtype) -> tuple[str, str]:
    t, v = cuda_jit.STORAGE[dtype], _width(dtype)
    name = f"mlxcore_take_rows_{t}"
    return name, _SOURCE + cuda_jit.entry(
        name, f"const {t}* table, const int* ids, {t}* out, int vectors, int vocab, int row_vectors",
        f"take_rows<{t}, {v}>(table, ids, out, vectors, vocab, row_vectors);")


@mx.custom_function
def _take_rows(table: mx.array, ids: mx.array) -> mx.array:
    (vocab, d), n, v = table.shape, ids.size, _width(table.dtype)
    name, source = _entry(table.dtype)
    (out,) = cuda_jit.launch(name, source, [table, ids], [((n, d), table.dtype)], [n * d // v, vocab, d // v],
                             threads=n * d // v, block=_BLOCK)
    return out


@_take_rows.vjp
def _take_rows_vjp(primals, cotangent, _output):
    table, ids = primals
    return mx.zeros_like(table).at[ids].add(cotangent.astype(table.dtype)), mx.zeros_like(ids)


def take_rows(table: mx.array, ids: mx.array) -> mx.array:
    """table [V, D] rows at ids [...] -> [..., D] (see `usable`)."""
    flat = ids.reshape(-1).astype(mx.int32)
    return _take_rows(table, flat).reshape(*ids.shape, table.shape[1])
