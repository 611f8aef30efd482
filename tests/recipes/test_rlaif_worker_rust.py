"""A trainer in another language: the Rust client (tests/worker_client, std only, built offline)
drives two worker processes over real pipes (generate -> reward in Rust -> train_step -> save ->
kill -> new worker -> load -> train_step), and its results equal an uninterrupted in-process run
on the same batches."""

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mlxio.rl import grpo
from mlxio.run import checkpoint
from recipes.rlaif_worker import make_worker

ROOT = Path(__file__).resolve().parents[2]
CLIENT = ROOT / "tests" / "worker_client"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    cargo = shutil.which("cargo")
    if cargo is None:
        pytest.skip("cargo not found: the Rust worker client needs a Rust toolchain (apt-get install "
                    "cargo); only this test is skipped")
    target = tmp_path_factory.mktemp("cargo-target")
    done = subprocess.run([cargo, "build", "--offline", "--locked", "--quiet", "--manifest-path",
                           str(CLIENT / "Cargo.toml"), "--target-dir", str(target)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return target / "debug" / "worker_client"


def test_rust_trainer_over_pipes_resumes_exactly(client, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([str(client), sys.executable, str(ROOT), str(run_dir)], env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    step1, step2 = summary["step1"], summary["step2"]
    assert (step1["step"], step2["step"]) == (1, 2)
    assert all(math.isfinite(s[k]) for s in (step1, step2) for k in ("loss", "pg_loss", "kl", "grad_norm"))
    assert step1["grad_norm"] > 0 and step2["kl"] > 0  # it trained; step 2 left the reference
    assert summary["loaded"]["meta"] == {"trainer": "rust", "position": 1}
    assert checkpoint.verify(run_dir / "checkpoints" / "step-00000001")["step"] == 1

    batches = [json.loads((run_dir / f"batch{i}.json").read_text()) for i in (1, 2)]
    # Rust's rewards and advantages are those Python computes from the same texts
    texts = summary["texts1"]
    want = [sum(c.isascii() and c.isalpha() for c in t) / max(len(t), 1) for t in texts]
    np.testing.assert_allclose(summary["rewards1"], want, rtol=1e-12)
    group = np.repeat(np.arange(2), 4)
    adv = grpo.advantages_of(np.array(want, np.float32), np.zeros(8, bool), group, "grpo")
    np.testing.assert_allclose(batches[0]["advantages"], adv, rtol=1e-4, atol=1e-4)

    # the same two batches in one uninterrupted in-process worker: identical results
    worker = make_worker()
    server = worker.server()

    def call(method, params):
        line = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode()
        return json.loads(server.handle_line(line))["result"]

    call("initialize", {"preset": "smoke", "config": {"out": str(tmp_path / "replay")}})
    for batch, got in zip(batches, (step1, step2), strict=True):
        result = call("train_step", batch)
        assert result == {**got, "seconds": result["seconds"]}
