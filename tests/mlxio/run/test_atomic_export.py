"""Nothing half-written: every export is built in a temporary sibling directory and renamed into
place, so a full disk (a real 8 MiB tmpfs where this runs as root, and a simulated ENOSPC in
the writer everywhere) leaves the previous export byte-identical, no temporary directory
behind, and a DiskError that says so."""

from __future__ import annotations

import errno
import hashlib
import os
import subprocess
from pathlib import Path

import mlx.core as mx
import pytest

from mlxcore.train.lora import LoraConfig
from mlxio.atomic import atomic_dir
from mlxio.errors import DiskError
from mlxio.weights import export, llm, llm_lora


def snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def small_disk(tmp_path):
    """An 8 MiB tmpfs (root only; skipped elsewhere - the simulated tests below still run)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)], capture_output=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.decode(errors='replace')}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(disk: Path, leave: int) -> None:
    """Ballast that leaves about `leave` bytes free."""
    st = os.statvfs(disk)
    free = st.f_bavail * st.f_frsize
    with open(disk / "ballast", "ab") as f:
        f.write(b"\0" * max(free - leave, 0))


LORA = LoraConfig(rank=4, alpha=8.0, targets=("q_proj", "v_proj"))


def policy_with_lora(seed: int):
    policy = llm.tiny_policy("llama", seed=seed)
    return policy, llm_lora.apply_lora(policy.model, LORA, None, mx.random.key(seed))


def test_disk_full_during_fuse_and_adapters_keeps_the_previous_export(small_disk):
    old, old_lora = policy_with_lora(0)
    llm_lora.fuse(old, old_lora, small_disk / "fused")
    llm_lora.save_adapters(old.model, old_lora, LORA, None, small_disk / "adapters")
    before = {name: snapshot(small_disk / name) for name in ("fused", "adapters")}
    size = sum((small_disk / "fused" / f).stat().st_size for f in before["fused"])
    fill(small_disk, size // 3)  # room for a third of a new model
    new, new_lora = policy_with_lora(1)
    with pytest.raises(DiskError, match=r"writing the model directory failed.*previous one is intact") as err:
        llm_lora.fuse(new, new_lora, small_disk / "fused")
    assert "\n" not in str(err.value) and str(small_disk / "fused") in str(err.value)
    fill(small_disk, 0)
    with pytest.raises(DiskError, match="adapters"):
        llm_lora.save_adapters(new.model, new_lora, LORA, None, small_disk / "adapters")
    assert {name: snapshot(small_disk / name) for name in ("fused", "adapters")} == before
    assert sorted(p.name for p in small_disk.iterdir()) == ["adapters", "ballast", "fused"]  # no temp dirs
    (small_disk / "ballast").unlink()  # space again: the export goes through and replaces the old one
    llm_lora.fuse(new, new_lora, small_disk / "fused")
    assert snapshot(small_disk / "fused") != before["fused"]
    assert sorted(p.name for p in small_disk.iterdir()) == ["adapters", "fused"]


@pytest.fixture(scope="module")
def encoder():
    from mlxio.weights.encoders import default_encoder_path, load_encoder
    return load_encoder(str(default_encoder_path()))


def _half_then_enospc(real):
    """A writer that leaves a truncated file, then fails as a full disk does."""
    def write(path, arrays, metadata=None):
        real(path, arrays, metadata=metadata)
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) // 2)
        raise OSError(errno.ENOSPC, "No space left on device", path)
    return write


def test_simulated_enospc_in_merged_and_peft_export(encoder, tmp_path, monkeypatch):
    from mlxcore.train import lora
    from mlxcore.train.tree import combine

    dims = lora.target_dims(encoder.params, ("query", "value"))
    params = combine(encoder.params, lora.init(mx.random.key(0), dims, 4))
    cfg = LoraConfig(rank=4, alpha=8.0, targets=("query", "value"))
    export.export_merged(encoder, params, cfg.scale, tmp_path / "merged")
    export.export_peft(encoder, params, cfg, tmp_path / "peft", "base")
    before = {name: snapshot(tmp_path / name) for name in ("merged", "peft")}
    monkeypatch.setattr(mx, "save_safetensors", _half_then_enospc(mx.save_safetensors))
    params2 = combine(encoder.params, lora.init(mx.random.key(1), dims, 4))
    with pytest.raises(DiskError, match=r"merged model failed: No space left on device \(the previous one is intact\)"):
        export.export_merged(encoder, params2, cfg.scale, tmp_path / "merged")
    with pytest.raises(DiskError, match="PEFT adapter failed"):
        export.export_peft(encoder, params2, cfg, tmp_path / "peft", "base")
    with pytest.raises(DiskError, match=r"nothing was written"):
        export.export_merged(encoder, params2, cfg.scale, tmp_path / "fresh")
    assert {name: snapshot(tmp_path / name) for name in ("merged", "peft")} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["merged", "peft"]


def test_atomic_dir_replaces_only_on_success(tmp_path):
    final = tmp_path / "out"
    with atomic_dir(final) as tmp:
        (tmp / "a").write_text("1")
    with pytest.raises(RuntimeError, match="boom"), atomic_dir(final) as tmp:
        (tmp / "a").write_text("2")
        raise RuntimeError("boom")
    assert (final / "a").read_text() == "1" and [p.name for p in tmp_path.iterdir()] == ["out"]
    with atomic_dir(final) as tmp:
        (tmp / "b").write_text("3")
    assert [p.name for p in final.iterdir()] == ["b"] and [p.name for p in tmp_path.iterdir()] == ["out"]
    (tmp_path / "file").write_text("x")
    with pytest.raises(DiskError, match="is a file"), atomic_dir(tmp_path / "file"):
        pass
