"""mlxcore.cuda_jit: kernels compiled once and read back from the disk cache; a bad source
fails with NVRTC's own message. CUDA build only (elsewhere `available()` is False and the
norm / MaxSim code takes MLX's ops: tests/test_norm.py, tests/test_retrieval.py)."""

import mlx.core as mx
import numpy as np
import pytest

from mlxcore import cuda_jit

ADD_ONE = r"""
extern "C" __global__ void add_one(const float* x, float* y, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] + 1.0f;
}
"""


def test_unavailable_without_cuda():
    if not mx.cuda.is_available():
        assert not cuda_jit.available()


@pytest.mark.skipif(not cuda_jit.available(), reason="MLX's CUDA build with NVRTC only")
def test_compiled_once_cached_on_disk_and_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("MLX_PTX_CACHE_DIR", str(tmp_path))
    first = cuda_jit.ptx.__wrapped__(ADD_ONE)
    files = list((tmp_path / "mlxcore").glob("*.ptx"))
    assert len(files) == 1 and files[0].read_bytes() == first
    files[0].write_bytes(first)  # the second call must read this file, not compile
    assert cuda_jit.ptx.__wrapped__(ADD_ONE) == first
    x = mx.arange(300, dtype=mx.float32)
    (y,) = cuda_jit.launch("add_one", ADD_ONE, [x], [((300,), mx.float32)], [300], threads=300)
    np.testing.assert_array_equal(np.array(y), np.arange(300) + 1.0)


@pytest.mark.skipif(not cuda_jit.available(), reason="MLX's CUDA build with NVRTC only")
def test_bad_source_names_the_error(tmp_path, monkeypatch):
    monkeypatch.setenv("MLX_PTX_CACHE_DIR", str(tmp_path))
    with pytest.raises(RuntimeError, match="undefined|identifier"):
        cuda_jit.ptx.__wrapped__('extern "C" __global__ void k(float* y) { y[0] = no_such_name; }')
