"""Reliability of the retriever recipe: non-finite steps are skipped and stop the run cleanly;
SIGKILL at random points (some inside checkpoint writes) then --resume gives exactly the
uninterrupted run's weights, optimizer moments, step and loss trace."""

import json
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import pytest
from killer import SLOW_FSYNC, kill_until_done

from mlxcore.retrieval import objective
from mlxcore.train.tree import flatten
from mlxio.errors import RunError, TrainingDiverged
from mlxio.run import checkpoint
from recipes import xtr_lora

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def trees_equal(a: dict, b: dict) -> list[str]:
    """Names of leaves that differ between two checkpoints' trees (empty when identical)."""
    diffs = []
    for name in ("trainable", "opt_state"):
        fa, fb = flatten(a[name]), flatten(b[name])
        diffs += [f"{name}:{k}" for k in fa.keys() | fb.keys()
                  if k not in fa or k not in fb or not mx.array_equal(fa[k], fb[k])]
    return diffs


def test_non_finite_steps_are_skipped_then_the_run_stops(tmp_path, monkeypatch):
    args = ["--preset", "smoke", "--cache_dir", str(tmp_path / "cache"), "--out_dir", str(tmp_path / "run"),
            "--train.max_consecutive_skips", "3"]
    assert xtr_lora.main([*args, "--stop_after", "4"]) == {"stopped_at": 4}
    path, good, meta = checkpoint.load_latest(tmp_path / "run")
    assert meta["step"] == 4
    real = objective.contrastive_loss_fn

    def poisoned(*args):
        loss_fn = real(*args)

        def nan_loss(params, batch, key):
            loss, aux = loss_fn(params, batch, key)
            return loss * float("nan"), aux
        return nan_loss

    monkeypatch.setattr(objective, "contrastive_loss_fn", poisoned)
    with pytest.raises(TrainingDiverged, match="step 7: 3 non-finite steps in a row"):
        xtr_lora.main([*args, "--resume"])
    after_path, after, after_meta = checkpoint.load_latest(tmp_path / "run")
    assert after_path == path and after_meta["step"] == 4 and not trees_equal(good, after)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["skipped"] for r in records if r["step"] > 4] == [1.0, 1.0, 1.0]
    # fewer steps than the consecutive-skip limit, none of them finite (the temperature-0
    # run): not "fine-tuned" with exit 0, but an error, and nothing exported
    fresh = ["--preset", "smoke", "--cache_dir", str(tmp_path / "cache"), "--out_dir", str(tmp_path / "run2"),
             "--train.steps", "3", "--optim.total_steps", "3", "--train.max_consecutive_skips", "10"]
    with pytest.raises(RunError, match="no training step succeeded: all 3 updates"):
        xtr_lora.main(fresh)
    assert not (tmp_path / "run2" / "merged").exists() and not (tmp_path / "run2" / "eval.json").exists()


CHILD = SLOW_FSYNC + """
import sys
from recipes import xtr_lora
xtr_lora.main(sys.argv[1:])
"""


def launch(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", CHILD, *args], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def test_sigkill_at_random_points_then_resume_is_exact(tmp_path):
    steps = 12
    common = ["--preset", "smoke", "--cache_dir", str(tmp_path / "cache"), "--export", "false",
              "--train.steps", str(steps), "--train.checkpoint_every", "1", "--optim.total_steps", str(steps)]
    reference = tmp_path / "reference"
    assert launch([*common, "--out_dir", str(reference)]).wait(timeout=900) == 0
    _, ref_trees, ref_meta = checkpoint.load_latest(reference)
    ref_losses = [json.loads(line)["loss"] for line in (reference / "metrics.jsonl").read_text().splitlines()]

    killed_run = tmp_path / "killed"
    metrics = killed_run / "metrics.jsonl"
    report = kill_until_done(lambda: launch([*common, "--out_dir", str(killed_run), "--resume"]), killed_run,
                             started=lambda: metrics.exists() and metrics.stat().st_size > 0)
    _, trees, meta = checkpoint.load_latest(killed_run)
    losses = [json.loads(line)["loss"] for line in metrics.read_text().splitlines()]
    report["differences"] = trees_equal(ref_trees, trees)
    print("sigkill/resume:", json.dumps(report))
    assert report["kills"] >= 10 and report["kills_mid_checkpoint_write"] >= 1
    assert meta["step"] == ref_meta["step"] == steps
    assert report["differences"] == []
    assert losses == ref_losses
