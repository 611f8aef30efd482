"""`python -m mlxio.gpu.cuda_ext` refuses, in one line, where it cannot build; `load()` is None off CUDA."""

import subprocess
import sys

import pytest

from mlxcore.kernels import cuda_jit
from mlxio.gpu import cuda_ext


@pytest.mark.skipif(cuda_jit.on_cuda(), reason="the refusal is for machines without MLX's CUDA build")
def test_build_refuses_without_cuda():
    run = subprocess.run([sys.executable, "-m", "mlxio.gpu.cuda_ext"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [
        "mlxio.gpu.cuda_ext: needs MLX's CUDA build (pip install 'mlx[cuda]') on a machine with an NVIDIA GPU"]


def test_switched_off_by_environment(monkeypatch):
    cuda_ext.load.cache_clear()
    monkeypatch.setenv("MLXCORE_GEMM_EPILOGUE", "0")
    try:
        assert cuda_ext.load() is None
    finally:
        cuda_ext.load.cache_clear()


@pytest.mark.skipif(cuda_jit.on_cuda(), reason="off CUDA only")
def test_none_off_cuda():
    assert cuda_ext.load() is None
