"""RLAIF recipe survives SIGKILL: killed at >= 10 random instants (half aimed at checkpoint
writes) on the smoke preset and resumed each time, it ends with exactly the uninterrupted
run's LoRA weights, optimizer moments, step and loss trace."""

import json
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import pytest
from killer import SLOW_FSYNC, kill_until_done

from mlxcore.train.tree import flatten
from mlxio.run import checkpoint

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
STEPS = 10

CHILD = SLOW_FSYNC + """
import sys
import attrs
sys.path.insert(0, "tests/recipes")
from test_rlaif_e2e import EXTRA, smoke_cfg
from recipes import rlaif_qwen as rq
out, problems = sys.argv[1], sys.argv[2]
cfg = smoke_cfg(out, problems)
steps = int(sys.argv[3])
cfg = attrs.evolve(cfg, train=attrs.evolve(cfg.train, steps=steps, checkpoint_every=1),
                   optim=attrs.evolve(cfg.optim, total_steps=steps))
rq.run(cfg, resume=True, extra_rewards=EXTRA)
"""


def launch(out: Path, problems: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", CHILD, str(out), str(problems), str(STEPS)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def losses(out: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_sigkill_at_random_points_then_resume_is_exact(tmp_path):
    sys.path.insert(0, str(ROOT / "tests" / "recipes"))
    from test_rlaif_e2e import PROBLEMS

    problems = tmp_path / "problems.jsonl"
    problems.write_text("".join(json.dumps({"task_id": t, "prompt": p, "entry_point": e, "test": s}) + "\n"
                                for t, p, e, s in PROBLEMS))
    reference = tmp_path / "reference"
    assert launch(reference, problems).wait(timeout=900) == 0
    _, ref_trees, ref_meta = checkpoint.load_latest(reference)

    killed = tmp_path / "killed"
    metrics = killed / "metrics.jsonl"
    report = kill_until_done(lambda: launch(killed, problems), killed,
                             started=lambda: metrics.exists() and metrics.stat().st_size > 0)
    _, trees, meta = checkpoint.load_latest(killed)
    diffs = []
    for name in ref_trees:
        a, b = flatten(ref_trees[name]), flatten(trees[name])
        diffs += [f"{name}:{k}" for k in a.keys() | b.keys() if k not in a or k not in b or not mx.array_equal(a[k], b[k])]
    report["differences"] = diffs
    print("rlaif sigkill/resume:", json.dumps(report))
    assert report["kills"] >= 10 and report["kills_mid_checkpoint_write"] >= 1
    assert meta["step"] == ref_meta["step"] == STEPS
    assert diffs == []
    assert losses(killed) == losses(reference)
