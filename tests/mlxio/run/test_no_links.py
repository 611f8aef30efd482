"""Nothing a run writes into a folder follows a link: a symlink (to a file, dangling, to a
folder), a hard link, a FIFO or a folder where a run's file belongs, or a link where a folder
the run names belongs, is one DiskError line naming it, and the file the link points at keeps
its bytes (nothing created elsewhere either)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mlxio import atomic
from mlxio.atomic import write_json_atomic
from mlxio.errors import DiskError
from mlxio.rl.rewards import RewardCache
from mlxio.rl.rollout_log import RolloutLog
from mlxio.run import checkpoint, context
from mlxio.run.runlog import MetricsLog, plot_curves
from mlxio.search import store

VICTIM = b"someone else's file\n"
KINDS = ("symlink", "dangling", "hardlink", "fifo", "dir")


def _plant(slot: Path, kind: str, victims: Path) -> Path:
    """Put a `kind` at `slot`; returns the file that must stay as it is (or stay absent)."""
    victims.mkdir(exist_ok=True)
    victim = victims / f"victim-{slot.name}-{kind}"
    if kind == "dangling":
        slot.symlink_to(victim)
        return victim
    victim.write_bytes(VICTIM)
    if kind == "symlink":
        slot.symlink_to(victim)
    elif kind == "hardlink":
        os.link(victim, slot)
    elif kind == "fifo":
        os.mkfifo(slot)
    else:
        slot.mkdir()
    return victim


def _unharmed(victim: Path, kind: str) -> bool:
    if kind == "dangling":
        return not os.path.lexists(victim)
    return victim.read_bytes() == VICTIM


def _one_line(err: DiskError, slot: Path) -> None:
    text = err.contract_line()
    assert "\n" not in text and str(slot) in text, text


def _metrics_start(out: Path) -> None:
    MetricsLog(out / "metrics.jsonl")


def _metrics_append(out: Path) -> None:
    log = MetricsLog.__new__(MetricsLog)
    log.path, log.what = out / "metrics.jsonl", "metrics log"
    log.write({"step": 1})


def _rollout_append(out: Path) -> None:
    log = RolloutLog.__new__(RolloutLog)
    log.path, log.what = out / "rollouts.jsonl", "rollout log"
    log.write_step(1, [], [], {})


def _lock(out: Path) -> None:
    try:
        context.claim_out_dir(out, resume=True)
    finally:
        context.release_out_dir(out)


def _index_lock(out: Path) -> None:
    with store.writer_lock(out):
        pass


def _config(out: Path) -> None:
    write_json_atomic(out / "config.json", {"lr": 1e-4})


def _latest(out: Path) -> None:
    checkpoint.save(out, 1, {"trainable": {"w": np.zeros(2, np.float32)}}, {})


def _plot(out: Path) -> None:
    plot_curves([{"step": 1, "loss": 1.0}, {"step": 2, "loss": 0.5}], out / "curves.png", ("loss",), "run")


# (writer, the file of the run folder it writes)
WRITERS = {
    "config.json": (_config, "config.json"),
    "metrics.jsonl (fresh)": (_metrics_start, "metrics.jsonl"),
    "metrics.jsonl (append)": (_metrics_append, "metrics.jsonl"),
    "rollouts.jsonl": (_rollout_append, "rollouts.jsonl"),
    "run lock": (_lock, ".lock"),
    "index lock": (_index_lock, ".lock"),
    "checkpoint LATEST": (_latest, "checkpoints/LATEST"),
    "curves.png": (_plot, "curves.png"),
}

RENAMED = {"config.json", "metrics.jsonl (fresh)", "checkpoint LATEST", "curves.png"}  # written whole, renamed into place


@given(writer=st.sampled_from(sorted(WRITERS)), kind=st.sampled_from(KINDS))
def test_a_link_where_a_run_file_belongs_is_refused(tmp_path_factory, writer, kind):
    """Every writer x every kind of thing planted at its file: one line, victim unharmed."""
    root = tmp_path_factory.mktemp("run")
    out = root / "out"
    (out / "checkpoints").mkdir(parents=True)
    write, name = WRITERS[writer]
    if name == "checkpoints/LATEST":  # a first checkpoint, so LATEST is the next write
        checkpoint.save(out, 0, {"trainable": {"w": np.zeros(2, np.float32)}}, {})
        (out / name).unlink()
    slot = out / name
    victim = _plant(slot, kind, root / "elsewhere")
    if kind == "hardlink" and writer in RENAMED:  # a rename only unlinks that name: the other is kept
        write(out)
        assert not slot.samefile(victim)
    else:
        with pytest.raises(DiskError) as caught:
            write(out)
        _one_line(caught.value, slot)
    assert _unharmed(victim, kind), (writer, kind)


def test_plain_files_are_written_as_before(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    for write, _name in WRITERS.values():
        write(out)
    assert (out / "config.json").is_file() and (out / "checkpoints" / "LATEST").is_file()
    MetricsLog(out / "metrics.jsonl").write({"step": 2})
    assert (out / "metrics.jsonl").read_text() == '{"step": 2}\n'


@pytest.mark.parametrize("folder", ["checkpoints", "reward_cache", "tokens", "best", "tensorboard"])
def test_a_symlinked_folder_inside_the_run_folder_is_refused(tmp_path, folder):
    """A folder the run names (checkpoints/, the reward cache, the token cache, best/, TensorBoard's) moved elsewhere
    by a link: refused, nothing written where it points."""
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (out / folder).symlink_to(elsewhere)
    with pytest.raises(DiskError) as caught:
        if folder == "checkpoints":
            checkpoint.save(out, 1, {"trainable": {"w": np.zeros(2, np.float32)}}, {})
        elif folder == "reward_cache":
            RewardCache(out / folder)
        elif folder == "best":
            from mlxio.run.best import BestKeeper

            BestKeeper(root=out / folder, metric="mrr").offer(1, {"mrr": 0.5}, {"w": np.zeros(2, np.float32)})
        elif folder == "tensorboard":
            from mlxio.run.reporting import TensorBoardWriter

            TensorBoardWriter(out / folder)
        else:
            from mlxio.data.token_cache import build_or_open

            build_or_open(out / folder, {"q": ["a"]}, lambda texts, n: [[1] for _ in texts],
                          tokenizer_id="t", max_lengths={"q": 4})
    _one_line(caught.value, out / folder)
    assert list(elsewhere.iterdir()) == []


def test_a_link_at_an_export_or_checkpoint_directory_is_refused(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_bytes(VICTIM)
    (tmp_path / "merged").symlink_to(elsewhere)
    with pytest.raises(DiskError) as caught, atomic.atomic_dir(tmp_path / "merged", "merged model") as tmp:
        (tmp / "model.safetensors").write_bytes(b"x")
    _one_line(caught.value, tmp_path / "merged")
    ckpts = tmp_path / "out" / "checkpoints"
    ckpts.mkdir(parents=True)
    (ckpts / "step-00000003").symlink_to(elsewhere)
    with pytest.raises(DiskError):
        checkpoint.save(tmp_path / "out", 3, {"trainable": {"w": np.zeros(2, np.float32)}}, {})
    assert sorted(p.name for p in elsewhere.iterdir()) == ["keep.txt"]
    assert (elsewhere / "keep.txt").read_bytes() == VICTIM


def test_reward_cache_segments_are_new_files(tmp_path, monkeypatch):
    """A segment's temp name planted as a link in advance (predicted): open_new refuses it."""
    cache = RewardCache(tmp_path / "rc")
    victim = tmp_path / "victim"
    victim.write_bytes(VICTIM)
    monkeypatch.setattr(os, "urandom", lambda n: b"\0" * n)
    monkeypatch.setattr("mlxio.rl.rewards.time_ns", lambda: 7)
    name = f"seg-{7:020d}-{os.getpid()}-{'00' * 4}.jsonl"
    (tmp_path / "rc" / f".tmp-{name}").symlink_to(victim)
    cache.put("k", 1.0)
    with pytest.raises(DiskError):
        cache.flush()
    assert victim.read_bytes() == VICTIM


def test_open_in_place_refuses_what_open_new_refuses(tmp_path):
    for kind in KINDS:
        slot = tmp_path / f"slot-{kind}"
        victim = _plant(slot, kind, tmp_path / "v")
        for opener in (lambda p: atomic.open_in_place(p, append=True), atomic.open_new):
            with pytest.raises(DiskError) as caught:
                os.close(opener(slot))
            _one_line(caught.value, slot)
        assert _unharmed(victim, kind), kind


NAMES = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="/\0"), min_size=1, max_size=40).filter(
    lambda n: n not in (".", "..") and len(n.encode()) <= 200)


@given(name=NAMES, kind=st.sampled_from(KINDS))
def test_any_file_name_is_written_or_its_link_refused(tmp_path_factory, name, kind):
    """Whatever the file's name (spaces, newlines, non-ASCII), a plain slot is written whole and a
    planted one refused in one line naming it; the victim keeps its bytes."""
    from mlxio.errors import one_line

    root = tmp_path_factory.mktemp("names")
    atomic.write_bytes_atomic(root / "plain" / name, b"data")
    assert (root / "plain" / name).read_bytes() == b"data"
    victim = _plant(root / name, kind, root / "elsewhere")
    if kind == "hardlink":  # renamed over: only that name changes
        atomic.write_bytes_atomic(root / name, b"data")
    else:
        with pytest.raises(DiskError) as caught:
            atomic.write_bytes_atomic(root / name, b"data")
        line = one_line(caught.value.contract_line())
        assert "\n" not in line and " ".join(str(root / name).split()) in line
    assert _unharmed(victim, kind)


@pytest.mark.parametrize("kind", ["fifo", "link to /dev/zero"])
def test_a_special_file_among_reward_cache_segments_is_one_line(tmp_path, kind):
    """Read side of the same folder: a FIFO (blocked forever) or a link to /dev/zero (read until
    memory ran out) named like a segment is a DataError naming it."""
    from mlxio.errors import DataError

    folder = tmp_path / "rc"
    folder.mkdir()
    seg = folder / "seg-00000000000000000001-1-00000000.jsonl"
    os.mkfifo(seg) if kind == "fifo" else seg.symlink_to("/dev/zero")
    with pytest.raises(DataError) as caught:
        RewardCache(folder)
    _one_line(caught.value, seg)
