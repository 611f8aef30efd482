"""The BLAS loader: OpenBLAS in use on Linux CPU when the system has it, results unchanged."""

import subprocess
import sys

import mlx.core as mx
import numpy as np
import pytest

from mlxio import blas


def test_matmul_matches_numpy():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((257, 129), np.float32), rng.standard_normal((129, 65), np.float32)
    np.testing.assert_allclose(np.array(mx.array(a) @ mx.array(b)), a @ b, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(blas.find_openblas() is None or sys.platform != "linux", reason="no system OpenBLAS")
def test_openblas_loaded_when_available():
    assert blas.status.startswith("openblas:") or blas.status.startswith("not-needed")


def run(code: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    import os
    env = {**os.environ, **(env_extra or {})}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)


def test_importing_the_packages_changes_nothing():
    """Only `mlxio.runtime.setup()` sets the process up: importing mlxio, mlxcore or a recipe
    loads no BLAS, sets no variable and imports no MLX."""
    out = run("import sys; import mlxio, mlxio.blas, mlxio.runtime, mlxcore.rl.tasks, recipes; "
              "print(mlxio.blas.status, 'mlx.core' in sys.modules)")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["unset", "False"]


def test_setup_is_idempotent_and_first():
    out = run("import sys; from mlxio import blas; from mlxio.runtime import setup; first = setup(); "
              "print(first == setup() == blas.status, 'mlx.core' in sys.modules)")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True"]


def test_cache_limit_from_the_environment():
    """MLXIO_CACHE_LIMIT_MB (set for runs side by side on one GPU) caps MLX's buffer cache."""
    out = run("from mlxio.runtime import setup; setup(); import mlx.core as mx; print(mx.set_cache_limit(0))",
              {"MLXIO_CACHE_LIMIT_MB": "96"})
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) == 96 << 20
    bad = run("from mlxio.runtime import setup; setup()", {"MLXIO_CACHE_LIMIT_MB": "2GB"})
    assert bad.returncode != 0
    assert bad.stderr.strip().splitlines() == [  # one line, no traceback
        "error: MLXIO_CACHE_LIMIT_MB='2GB': give a whole number of megabytes (0 to 999999999999), or unset it"]


def test_a_bad_malloc_setting_is_one_line():
    if mx.default_device() != mx.cpu:
        pytest.skip("MLXIO_MALLOC is read where MLX runs on the CPU")
    bad = run("from mlxio.runtime import setup; setup()", {"MLXIO_MALLOC": "jemalloc"})
    assert bad.returncode != 0
    assert bad.stderr.strip().splitlines() == [
        "error: MLXIO_MALLOC='jemalloc': give 'keep' (the default: reuse freed memory) or 'glibc' "
        "(glibc's defaults), or unset it"]


def test_late_setup_warns():
    out = run("import logging; logging.basicConfig(level='INFO'); import mlx.core; "
              "from mlxio.runtime import setup; print(setup())")
    assert out.returncode == 0, out.stderr
    if sys.platform == "linux" and not blas._has_cuda_build():
        assert out.stdout.strip() == "reference"
        assert "imported before mlxio.runtime.setup()" in out.stderr


def test_opt_out_and_log_line():
    out = run("import logging; logging.basicConfig(level='INFO'); from mlxio.runtime import setup; print(setup())",
              {"MLXIO_BLAS": "off"})
    assert out.returncode == 0, out.stderr
    if sys.platform == "linux" and not blas._has_cuda_build():
        assert out.stdout.strip() == "reference" and "BLAS:" in out.stderr



def test_explicit_path_on_cuda_build(monkeypatch):
    """A CUDA build keeps its bundled (reference) BLAS by default but loads a library named by
    MLXIO_BLAS (its CPU stream uses the same cblas calls)."""
    monkeypatch.setattr(blas, "_has_cuda_build", lambda: True)
    monkeypatch.setattr(blas.platform, "system", lambda: "Linux")
    monkeypatch.delitem(sys.modules, "mlx.core", raising=False)  # restored after the test
    for wanted, expected in (("auto", "not-needed:cuda"), ("off", "not-needed:cuda"),
                             ("/nonexistent/libopenblas.so.0", "reference")):
        monkeypatch.setattr(blas, "status", "unset")
        monkeypatch.setenv("MLXIO_BLAS", wanted)
        assert blas.ensure_fast_blas() == expected
    path = blas.find_openblas()
    if path is not None:
        monkeypatch.setattr(blas, "status", "unset")
        monkeypatch.setenv("MLXIO_BLAS", path)
        assert blas.ensure_fast_blas() == "openblas:" + path


@pytest.mark.skipif(blas.find_openblas() is None or sys.platform != "linux" or blas._has_cuda_build(),
                    reason="MLX's Linux CPU wheel and a system OpenBLAS")
def test_a_program_without_setup_is_warned_once_and_one_with_it_is_fast():
    """A notebook-style program that imports the library and loads a model without
    `mlxio.runtime.setup()` gets one RuntimeWarning naming the call (two loads, one warning); the
    same program with setup() first gets OpenBLAS and no warning. (`check_fast_blas` also loads
    the fast BLAS itself when MLX is not imported yet: the third case.)"""
    load = ("from mlxio.weights.encoders import default_encoder_path, load_encoder; "
            "load_encoder(default_encoder_path()); load_encoder(default_encoder_path()); ")
    report = "from mlxio import blas; print('status', blas.status)"
    bare = run("import warnings; warnings.simplefilter('default'); " + load + report)
    assert bare.returncode == 0, bare.stderr
    warned = [line for line in bare.stderr.splitlines() if "RuntimeWarning" in line]
    assert len(warned) == 1 and "mlxio.runtime import setup; setup()" in warned[0], bare.stderr
    assert "status unset" in bare.stdout
    fast = run("from mlxio.runtime import setup; setup(); import warnings; warnings.simplefilter('default'); "
               + load + report)
    assert fast.returncode == 0, fast.stderr
    assert "RuntimeWarning" not in fast.stderr and "status openblas:" in fast.stdout
    first = run("from mlxio import blas; import sys; print(blas.check_fast_blas().startswith('openblas:'), "
                "'mlx.core' in sys.modules)")
    assert first.stdout.split() == ["True", "False"], first.stderr
