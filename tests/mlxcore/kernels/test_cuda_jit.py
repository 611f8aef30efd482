"""mlxcore.kernels.cuda_jit (launching, the compiler registry) and mlxio.gpu.cuda_build (NVRTC, the disk
cache): kernels compiled once and read back from the cache, a bad source fails with NVRTC's own
message. The compile tests need MLX's CUDA build; elsewhere `available()` is False and the norm /
MaxSim code takes MLX's ops (tests/mlxcore/models/test_norm.py, tests/mlxcore/retrieval/test_late_interaction.py)."""

import mlx.core as mx
import numpy as np
import pytest

from mlxcore.kernels import cuda_jit
from mlxio.gpu import cuda_build

ADD_ONE = r"""
extern "C" __global__ void add_one(const float* x, float* y, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] + 1.0f;
}
"""
on_gpu = pytest.mark.skipif(not cuda_jit.available(), reason="MLX's CUDA build with NVRTC only")


def test_registry_and_fallback_off_cuda(monkeypatch):
    assert cuda_jit._compiler and cuda_jit._compiler[0] is cuda_build.COMPILER
    if not cuda_jit.on_cuda():
        assert not cuda_jit.available()
    monkeypatch.setattr(cuda_jit, "_compiler", [])
    assert not cuda_jit.available()
    with pytest.raises(RuntimeError, match="mlxio.runtime.setup"):
        cuda_jit.launch("add_one", ADD_ONE, [mx.zeros(3)], [((3,), mx.float32)], [3], threads=3)


@on_gpu
def test_compiled_once_cached_on_disk_and_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("MLX_PTX_CACHE_DIR", str(tmp_path))
    source = cuda_jit.PRELUDE + ADD_ONE
    first = cuda_build.ptx.__wrapped__(source)
    files = list((tmp_path / "mlxcore").glob("*.ptx"))
    assert len(files) == 1 and files[0].read_bytes() == first
    assert cuda_build.ptx.__wrapped__(source) == first  # read back, not compiled
    x = mx.arange(300, dtype=mx.float32)
    (y,) = cuda_jit.launch("add_one", ADD_ONE, [x], [((300,), mx.float32)], [300], threads=300)
    np.testing.assert_array_equal(np.array(y), np.arange(300) + 1.0)


@on_gpu
def test_bad_source_names_the_error(tmp_path, monkeypatch):
    monkeypatch.setenv("MLX_PTX_CACHE_DIR", str(tmp_path))
    with pytest.raises(RuntimeError, match="undefined|identifier"):
        cuda_build.ptx.__wrapped__('extern "C" __global__ void k(float* y) { y[0] = no_such_name; }')
