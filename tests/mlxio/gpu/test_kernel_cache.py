"""MLX's on-disk GPU kernel cache in a known place, and the log line while a first step compiles
(issue 19 item 2b/c). Each case runs in a fresh interpreter: `mlxio.runtime.setup()` sets the variable."""

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

from mlxio.gpu import kernel_cache

ROOT = Path(__file__).resolve().parents[3]


def _cache_dir_in_child(env: dict) -> str:
    code = ("import os; from mlxio.runtime import setup; setup(); "
            "print(os.environ.get('MLX_PTX_CACHE_DIR', '<unset>'))")
    base = {k: v for k, v in os.environ.items() if k not in ("MLX_PTX_CACHE_DIR", "MLXIO_KERNEL_CACHE")}
    out = subprocess.run([sys.executable, "-c", code], env={**base, "PYTHONPATH": str(ROOT), **env},
                         capture_output=True, text=True, check=True, cwd=ROOT)
    return out.stdout.strip().splitlines()[-1]


def test_default_env_and_user_choice(tmp_path):
    assert _cache_dir_in_child({"XDG_CACHE_HOME": str(tmp_path)}) == str(tmp_path / "mlx-retrieval-rl" / "ptx")
    assert _cache_dir_in_child({"MLXIO_KERNEL_CACHE": str(tmp_path / "k")}) == str(tmp_path / "k")
    assert _cache_dir_in_child({"MLXIO_KERNEL_CACHE": "off"}) == "<unset>"
    # the user's own MLX_PTX_CACHE_DIR wins
    assert _cache_dir_in_child({"MLX_PTX_CACHE_DIR": str(tmp_path / "mine"),
                                "MLXIO_KERNEL_CACHE": str(tmp_path / "k")}) == str(tmp_path / "mine")
    assert not (tmp_path / "mlx-retrieval-rl").exists()  # nothing created by setup()


def test_compile_notice_logs_slow_first_call_only(caplog):
    caplog.set_level(logging.INFO, logger="mlxio")
    with kernel_cache.compile_notice("step", (4, 64), after_s=0.05, gpu=True) as first:
        assert first
        time.sleep(0.3)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and "compile on first use" in lines[0] and "(4, 64)" in lines[0]
    assert kernel_cache.cache_dir() in lines[0] and "done in" in lines[1]
    caplog.clear()
    with kernel_cache.compile_notice("step", (4, 64), after_s=0.05, gpu=True) as first:
        assert not first
        time.sleep(0.2)
    with kernel_cache.compile_notice("step", (8, 64), after_s=1.0, gpu=True) as first:
        assert first  # a new shape, but fast: no line
    with kernel_cache.compile_notice("step", (16, 64), after_s=0.01, gpu=False) as first:
        assert first
        time.sleep(0.1)  # not a GPU: silent
    assert caplog.records == []


def test_export_import_round_trip(tmp_path, monkeypatch):
    """A warm cache carried to another folder (machine): every kernel arrives, existing ones are
    kept, and an archive from another MLX version is refused with a line naming both."""
    import json
    import tarfile

    import pytest

    from mlxio.errors import DataError

    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "k1.cubin").write_bytes(b"one")
    (src / "sub" / "k2.cubin").write_bytes(b"two" * 100)
    monkeypatch.setattr(kernel_cache, "_gpu_arch", lambda: "9.0")
    (src / "k1.cu").write_text("source stays behind")
    manifest = kernel_cache.export_cache(tmp_path / "k.tar.gz", str(src))
    assert manifest["files"] == 2 and manifest["bytes"] == 303
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "k1.cubin").write_bytes(b"kept")
    out = kernel_cache.import_cache(tmp_path / "k.tar.gz", str(dest))
    assert out["added"] == 1
    assert (dest / "k1.cubin").read_bytes() == b"kept" and (dest / "sub" / "k2.cubin").read_bytes() == b"two" * 100
    monkeypatch.setattr(kernel_cache, "_mlx_version", lambda: "0.0.1")
    with pytest.raises(DataError, match="mlx .* this machine has '0.0.1'"):
        kernel_cache.import_cache(tmp_path / "k.tar.gz", str(dest))
    assert kernel_cache.import_cache(tmp_path / "k.tar.gz", str(dest), check=False)["added"] == 0
    with pytest.raises(DataError, match="no compiled kernels"):
        kernel_cache.export_cache(tmp_path / "e.tar.gz", str(tmp_path / "empty"))
    bad = tmp_path / "bad.tar.gz"
    with tarfile.open(bad, "w:gz") as tar:
        tar.add(src / "k1.cubin", arcname="k1.cubin")
    with pytest.raises(DataError, match="not a kernel cache archive"):
        kernel_cache.import_cache(bad, str(dest))
    assert json.loads(json.dumps(manifest))["mlx"]


def test_cli_info_runs_once_without_runpy_warning(tmp_path):
    """`python -m mlxio.gpu.kernel_cache_cli info`: one JSON line counting the cache's files, and no
    "found in sys.modules" RuntimeWarning (running mlxio.gpu.kernel_cache itself with -m gave one,
    since the package's start-up had already imported it)."""
    import json

    (tmp_path / "k").mkdir()
    (tmp_path / "k" / "a.ptx").write_bytes(b"12345")
    base = {k: v for k, v in os.environ.items() if k not in ("MLX_PTX_CACHE_DIR", "MLXIO_KERNEL_CACHE")}
    out = subprocess.run([sys.executable, "-m", "mlxio.gpu.kernel_cache_cli", "info"], capture_output=True, text=True,
                         env={**base, "PYTHONPATH": str(ROOT), "MLXIO_KERNEL_CACHE": str(tmp_path / "k")},
                         cwd=ROOT, check=True)
    assert json.loads(out.stdout) == {"folder": str(tmp_path / "k"), "files": 1, "bytes": 5}
    assert "RuntimeWarning" not in out.stderr
    assert kernel_cache.contents(tmp_path / "missing") == {"files": 0, "bytes": 0}


def test_rlaif_compiles_except_on_cuda_unless_asked(monkeypatch):
    """The RLAIF recipe's `compile` None (auto): compiled on the CPU / Metal, eager on CUDA
    (a fresh machine's NVRTC compilation of the fused kernels: minutes); true / false as given."""
    from recipes.rlaif_config import PRESETS, Config

    assert Config().compile is None and PRESETS["gpu"].compile is True and PRESETS["full"].compile is True
    monkeypatch.setattr(kernel_cache, "on_gpu", lambda: False)
    assert kernel_cache.use_compile(Config().compile) is True
    monkeypatch.setattr(kernel_cache, "on_gpu", lambda: True)
    assert kernel_cache.use_compile(Config().compile) is False
    assert kernel_cache.use_compile(PRESETS["gpu"].compile) is True
    assert kernel_cache.use_compile(Config(compile=False).compile) is False


def test_retriever_compile_setting_leaves_the_trajectory_hash(monkeypatch):
    """`train.compile` (None: eager on CUDA) changes no trained value beyond rounding: resume
    accepts a checkpoint written with either setting (the hash leaves it out)."""
    import attrs

    from mlxio.run import config
    from recipes import xtr_lora_config

    cfg = xtr_lora_config.PRESETS["quick"]
    assert cfg.train.compile is None
    hashes = {xtr_lora_config.trajectory_hash(config.to_dict(attrs.evolve(cfg, train=attrs.evolve(cfg.train, compile=c))))
              for c in (None, True, False)}
    assert len(hashes) == 1
    monkeypatch.setattr(kernel_cache, "on_gpu", lambda: True)
    assert kernel_cache.use_compile(None) is False and kernel_cache.use_compile(True) is True


def test_prewarm_moves_only_finished_modules(tmp_path):
    """A module moves once MLX wrote its `.cu` (last of its three files); the cache's own
    modules are kept; long names (nested folders) keep their layout."""
    from mlxio.gpu import kernel_warm

    staging, dest = tmp_path / "staging", tmp_path / "cache"
    for name, suffixes in (("done", ".ptx .txt .cu"), ("writing", ".ptx .txt"), ("deep/sub/done2", ".ptx .txt .cu"),
                           ("there", ".ptx .txt .cu")):
        for suffix in suffixes.split():
            path = staging / (name + suffix)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"new {suffix}")
    dest.mkdir()
    (dest / "there.ptx").write_text("old")
    assert kernel_warm.move_finished(staging, dest) == 2
    assert sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file()) == [
        "deep/sub/done2.cu", "deep/sub/done2.ptx", "deep/sub/done2.txt", "done.cu", "done.ptx", "done.txt", "there.ptx"]
    assert (dest / "done.txt").read_text() == "new .txt" and (dest / "there.ptx").read_text() == "old"


def test_prewarm_jobs_run(tmp_path, monkeypatch):
    """The RLAIF prewarm's children (one per kernel module) run to the end (here on the CPU,
    where they compile nothing to move); off unless MLXIO_KERNEL_PREWARM=1 and on a CUDA device."""
    from mlxio.gpu import kernel_warm
    from recipes.rlaif_config import PRESETS

    dtype = PRESETS["quick"].memory.compute_dtype
    monkeypatch.delenv(kernel_warm.ENV, raising=False)
    assert kernel_warm.for_rlaif(dtype, jit=False) is None
    monkeypatch.setenv(kernel_warm.ENV, "1")
    monkeypatch.setattr(kernel_cache, "on_gpu", lambda: False)
    assert kernel_warm.for_rlaif(dtype, jit=False) is None
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    warm = kernel_warm.start(kernel_warm.rlaif_jobs(dtype), tmp_path / "cache")
    warm.wait(timeout=600)
    logs = {p.parent.name: p.read_text()[-500:] for p in warm.root.glob("*/log.txt")}
    assert sorted(warm.codes.values()) == [0] * len(kernel_warm.rlaif_modules()), logs
    assert warm.moved == 0
    warm.stop()
