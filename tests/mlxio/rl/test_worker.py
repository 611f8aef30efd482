"""The worker's side of the wire (mlxio.rl.worker): the protocol stream keeps stray writes off.
The worker's methods over it: tests/recipes/test_rlaif_worker.py."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_protocol_stdout_keeps_stray_writes_off_the_protocol():
    code = ("import os, sys; from mlxio.rl.worker import protocol_stdout; p = protocol_stdout(); "
            "print('stray print'); os.write(1, b'stray C write\\n'); p.write(b'{}\\n'); p.flush()")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout == b"{}\n"
    assert b"stray print" in done.stderr and b"stray C write" in done.stderr
