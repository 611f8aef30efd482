"""Kill-and-resume harness shared by the recipes' SIGKILL tests.

`kill_until_done(launch, run_dir)` starts the run (which resumes from its latest checkpoint),
SIGKILLs it at a random instant once training is under way - every other kill aimed at a
checkpoint write, detected by the writer's temp dir - and repeats until `kills` kills have
landed, then lets the last launch finish.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

# Prepended to a child's code (the child's program starts here, so it sets the process up first,
# as every entry point does): each fsync of a checkpoint write sleeps 50 ms, so a write lasts
# long enough for the harness to land kills inside it.
SLOW_FSYNC = """
from mlxio.runtime import setup
setup()
import time
import mlxio.run.checkpoint as ckpt
_fsync = ckpt.fsync_path
ckpt.fsync_path = lambda path: (time.sleep(0.05), _fsync(path))[1]
"""


def writing(run_dir: Path) -> bool:
    """A checkpoint writer's temp dir exists (a kill now lands inside a checkpoint write)."""
    try:
        return any(e.name.startswith(".tmp-") for e in os.scandir(run_dir / "checkpoints"))
    except FileNotFoundError:
        return False


def kill_until_done(launch: Callable[[], subprocess.Popen], run_dir: Path, started: Callable[[], bool],
                    kills: int = 10, seed: int = 0) -> dict:
    """Returns {"kills", "kills_mid_checkpoint_write", "seconds"}; asserts the last run exits 0."""
    rng = random.Random(seed)
    done = mid_write = 0
    begin = time.monotonic()
    while True:
        proc = launch()
        if done < kills:
            deadline = time.monotonic() + 600
            while proc.poll() is None and time.monotonic() < deadline and not started():
                time.sleep(0.05)
            if done % 2:
                until = time.monotonic() + 120
                while proc.poll() is None and time.monotonic() < until and not writing(run_dir):
                    pass
            else:
                time.sleep(rng.uniform(0.0, 3.0))
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                done += 1
                mid_write += writing(run_dir)
                continue
        assert proc.wait(timeout=900) == 0
        return {"kills": done, "kills_mid_checkpoint_write": mid_write, "seconds": round(time.monotonic() - begin)}
