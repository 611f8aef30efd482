"""A run that keeps talking: off a terminal, both recipes' training and evaluation (and
`code_search index`) log a progress line at least every `reporting.HEARTBEAT_S`, whatever the
preset's logging interval. The clock is injected (`reporting.CLOCK`: each reading 31 s after the
last), so every progress update comes 31 s after the previous line; no test waits on time.

These are also the fast lane's smoke run of each recipe."""

import io
import logging
import re

import pytest

from mlxio.run import reporting
from recipes import rlaif_qwen, xtr_lora


@pytest.fixture
def slow_clock(monkeypatch, caplog):
    """Progress lines captured; the progress clock moves 31 s a reading; stderr not a terminal."""
    now = [0.0]

    def clock():
        now[0] += 31.0
        return now[0]

    monkeypatch.setattr(reporting, "CLOCK", clock)
    monkeypatch.setattr("sys.stderr", io.StringIO())
    caplog.set_level(logging.INFO, logger="mlxio.progress")
    return lambda: [r.getMessage() for r in caplog.records if r.name == "mlxio.progress"]


def test_xtr_lora_talks_between_metrics_records(slow_clock, tmp_path):
    xtr_lora.main(["--preset", "smoke", "--out_dir", str(tmp_path / "run"), "--cache_dir", str(tmp_path / "cache"),
                   "--train.steps", "4", "--optim.total_steps", "4", "--train.log_every", "1000",
                   "--train.checkpoint_every", "1000"])
    lines = slow_clock()
    training = [line for line in lines if re.match(r"train: [0-9]+/4 step", line)]
    assert len(training) >= 4, lines  # a metrics record only at the last step: these are the bar's
    assert all("step/s" in line and "loss=" in line for line in training if not line.startswith("train: 0/"))
    assert any("ETA" in line for line in training)
    assert any(line.startswith("eval: ") for line in lines), lines


def test_rlaif_talks_between_metrics_records(slow_clock, tmp_path):
    rlaif_qwen.main(["--preset", "smoke", "--out_dir", str(tmp_path / "run"), "--train.log_every", "1000",
                     "--train.checkpoint_every", "1000"])
    lines = slow_clock()
    training = [line for line in lines if re.match(r"rlaif: [0-9]+/4 step", line)]
    assert len(training) >= 4, lines
    assert all("step/s" in line and "loss=" in line for line in training if not line.startswith("rlaif: 0/"))
    assert any("eval" in line for line in lines), lines
