"""Another process holding a run directory's lock (`mlxio.run.context.claim_out_dir`), as a
second run into the same `out_dir` would."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def holding(out_dir: Path, seconds: int = 120) -> Iterator[subprocess.Popen]:
    """Yield a child process once it holds `out_dir`'s lock; it is killed on exit (the lock is
    free again then). `seconds` bounds its life should the test never reach the exit."""
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; sys.path.insert(0, sys.argv[1]); "
                               "from pathlib import Path; from mlxio.run import context; "
                               "context.claim_out_dir(Path(sys.argv[2]), resume=False); print('held', flush=True); "
                               f"time.sleep({int(seconds)})", str(ROOT), str(out_dir)], stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip() == b"held"
        yield holder
    finally:
        holder.kill()
        holder.wait()
