"""Run reporting: window means, progress off a terminal (log lines), TensorBoard files read back
by tensorboard's own reader, the console record line."""

import io
import logging
import tempfile
import threading
import time
from pathlib import Path

import pytest

from mlxio.errors import ConfigError
from mlxio.run import reporting


def test_crc32c_known_answer():
    assert reporting.crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value


def test_window_mean_averages_since_the_last_pop():
    window = reporting.WindowMean()
    for loss, rate in ((0.6, None), (0.2, 0.5), (0.1, float("nan"))):
        window.add({"loss": loss, "pass_rate": rate, "name": "x"})
    assert window.steps == 3
    means = window.pop()
    assert means["loss"] == pytest.approx(0.3) and means["pass_rate"] == 0.5 and "name" not in means
    window.add({"loss": 1.0})
    assert window.pop() == {"loss": 1.0}


def test_progress_off_a_terminal_is_log_lines(caplog, monkeypatch):
    monkeypatch.setattr("sys.stderr", io.StringIO())  # not a TTY
    caplog.set_level(logging.INFO, logger="mlxio.progress")
    ticks = iter(range(0, 1000, 2))  # 2 s a reading: long enough for a rate
    monkeypatch.setattr(reporting, "CLOCK", lambda: float(next(ticks)))
    bar = reporting.progress(range(5), desc="mining", unit="file", every_s=0.0)
    assert isinstance(bar, reporting.LogProgress)
    assert list(bar) == [0, 1, 2, 3, 4]
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith("mining: 1/5 file (20%)") and "ETA" in lines[0]
    assert lines[-1].startswith("mining: 5/5 file (100%)") and "done in" in lines[-1]
    assert len(lines) == 5  # the last line, printed by the update, is not printed again at close


def test_reporter_writes_jsonl_tensorboard_and_a_console_line(tmp_path, caplog, monkeypatch):
    from tracking_files import tensorboard_scalars

    monkeypatch.setattr("sys.stderr", io.StringIO())
    caplog.set_level(logging.INFO, logger="mlxio.progress")
    reporter = reporting.Reporter(tmp_path, report_to=("tensorboard",), total_steps=10,
                                  headline=("loss", "lr"))
    for step in (5, 10):
        reporter.write({"step": step, "loss": 1.0 / step, "lr": 1e-4, "reward/format": 0.5, "note": None})
    reporter.close()
    assert [r["step"] for r in reporter.read()] == [5, 10]
    assert caplog.records[0].getMessage().startswith("step 5/10 | loss 0.2 | lr 1.000e-04 | ETA")
    scalars = tensorboard_scalars(tmp_path / "tensorboard")
    assert scalars["loss"] == [(5, pytest.approx(0.2)), (10, pytest.approx(0.1))]
    assert scalars["reward/format"] == [(5, 0.5), (10, 0.5)]


def test_unknown_report_target_is_named():
    with pytest.raises(ConfigError, match="mlflow"):
        reporting.check_report_to(("tensorboard", "mlflow"))


def test_progress_on_a_terminal_is_a_tqdm_bar(monkeypatch):
    from tqdm import tqdm

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr("sys.stderr", Terminal())
    bar = reporting.progress(total=3, desc="train", unit="step")
    assert isinstance(bar, tqdm)
    bar.update(3)
    bar.close()
    reporter = reporting.Reporter(Path(tempfile.mkdtemp()), total_steps=3)
    assert reporter.console is False  # the bar shows progress; no extra log lines


def test_write_summary_reaches_tensorboard_not_the_jsonl(tmp_path, monkeypatch):
    from tracking_files import tensorboard_scalars

    monkeypatch.setattr("sys.stderr", io.StringIO())
    reporter = reporting.Reporter(tmp_path, report_to=("tensorboard",), total_steps=10)
    reporter.write({"step": 10, "loss": 0.5, "lr": 1e-4})
    reporter.write_summary(10, {"eval/files/fine-tuned/semantic/mrr@10": 0.75, "eval/files/bm25/mrr@10": 0.5})
    reporter.close()
    assert [r["step"] for r in reporter.read()] == [10] and "eval/files/bm25/mrr@10" not in reporter.read()[0]
    scalars = tensorboard_scalars(tmp_path / "tensorboard")
    assert scalars["eval/files/fine-tuned/semantic/mrr@10"] == [(10, pytest.approx(0.75))]


def test_results_table_and_scalars_name_both_tasks():
    from mlxio.search.evaluation import eval_scalars, results_table, summary_line

    m = {"p@1": 0.5, "mrr@10": 0.6, "recall@10": 0.7, "ndcg@10": 0.65}
    entry = {"bm25": m, "untrained": {"semantic": m, "hybrid": m, "hybrid_fusion": "interp@0.8"},
             "fine-tuned": {"semantic": {**m, "mrr@10": 0.7}, "hybrid": m}}
    results = {**entry, "heldout_packages": {**entry, "packages": ["beta"], "queries": 3}}
    table = results_table(results)
    assert table.splitlines()[2].startswith("| held-out packages | BM25 |")
    assert "| held-out files | BM25 |" in table and table.count("fine-tuned semantic") == 2
    line = summary_line(results, "fine-tuned", baseline="untrained")
    assert line.startswith("held-out files: fine-tuned semantic MRR@10 0.700 (+0.100)") and "held-out packages:" in line
    scalars = eval_scalars(results)
    assert scalars["eval/packages/fine-tuned/semantic/mrr@10"] == 0.7 and scalars["eval/files/bm25/p@1"] == 0.5


class FakeClock:
    """Seconds that move only when the test says so."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_progress_speaks_after_30_s_of_silence_whatever_the_updates(caplog):
    """Off a terminal a step that takes minutes still gets a line every HEARTBEAT_S (the
    heartbeat's `tick`), with the step, rate, ETA and the recipe's postfix; a metrics line
    printed elsewhere restarts the silence; an update after `every_s` prints too."""
    caplog.set_level(logging.INFO, logger="mlxio.progress")
    clock = FakeClock()
    bar = reporting.LogProgress(total=200, desc="training", unit="step", every_s=30.0, clock=clock, heartbeat=False)
    lines = lambda: [r.getMessage() for r in caplog.records]  # noqa: E731
    bar.tick()
    assert lines() == []
    clock.now += 30.0  # compiling the first step: nothing done yet, still a line
    bar.tick()
    assert lines() == ["training: 0/200 step (0%), 30s in"]
    clock.now += 10.0
    bar.update(1)
    bar.set_postfix(loss="0.5000")
    clock.now += 19.9
    bar.tick()
    assert len(lines()) == 1
    clock.now += 0.1  # 30 s after the last line
    bar.tick()
    assert lines()[-1] == "training: 1/200 step (0%), 0.0167 step/s, ETA 3h19m | loss=0.5000"
    clock.now += 20.0
    bar.printed_elsewhere()  # a metrics record's line
    clock.now += 29.0
    bar.tick()
    assert len(lines()) == 2
    clock.now += 1.0
    bar.update(1)  # an update `every_s` after the last line prints
    assert lines()[-1].startswith("training: 2/200 step (1%)") and len(lines()) == 3
    bar.close()
    clock.now += 100.0
    bar.tick()  # closed: silent
    assert len(lines()) == 3


def test_the_heartbeat_thread_ticks_until_the_bar_closes(caplog, monkeypatch):
    """The thread (polling every HEARTBEAT_S / 6) prints a line once the injected clock has moved
    HEARTBEAT_S, and ends when the bar closes. Waits for events, not for a time."""
    caplog.set_level(logging.INFO, logger="mlxio.progress")
    monkeypatch.setattr(reporting, "HEARTBEAT_S", 0.06)
    clock = FakeClock()
    bar = reporting.LogProgress(total=10, desc="eval", unit="batch", every_s=1e9, clock=clock)
    thread = next(t for t in threading.enumerate() if t.name == "progress heartbeat: eval")
    clock.now += 1.0
    for _ in range(2000):
        if caplog.records:
            break
        time.sleep(0.005)
    assert caplog.records[0].getMessage().startswith("eval: 0/10 batch (0%)")
    bar.close()
    thread.join(timeout=60)
    assert not thread.is_alive()


def test_a_bar_left_early_stops_its_heartbeat():
    bar = reporting.LogProgress(range(10), desc="left early", clock=FakeClock())
    for i in bar:
        if i == 2:
            break
    del i
    import gc

    gc.collect()
    assert bar.closed


def test_a_rate_only_over_a_second_or_more(caplog):
    """A phase done within MIN_RATE_S gets no rate (`4.13e+05 fn/s` measured the clock): its line
    says what was done and how long it took; over more, the rate and ETA."""
    caplog.set_level(logging.INFO, logger="mlxio.progress")
    clock = FakeClock()
    quick = reporting.LogProgress(total=3, desc="embedding", unit="fn", every_s=15.0, clock=clock, heartbeat=False)
    clock.now += 0.01
    quick.update(3)
    quick.close()
    slow = reporting.LogProgress(total=300, desc="embedding", unit="fn", every_s=15.0, clock=clock, heartbeat=False)
    clock.now += 20.0
    slow.update(100)
    slow.update(0)  # nothing new, and not 15 s after the last line: silent
    clock.now += 20.0
    slow.update(200)
    slow.close()
    slow.update(5)  # a closed bar takes no more updates, prints nothing
    assert [r.getMessage() for r in caplog.records] == [
        "embedding: 3/3 fn (100%), done in 0s",
        "embedding: 100/300 fn (33%), 5 fn/s, ETA 40s",
        "embedding: 300/300 fn (100%), 7.5 fn/s, done in 40s"]


def test_a_phase_without_steps_still_talks(caplog, monkeypatch):
    """`phase` (a codec's k-means): a line every HEARTBEAT_S while it runs, none at its end."""
    monkeypatch.setattr("sys.stderr", io.StringIO())
    caplog.set_level(logging.INFO, logger="mlxio.progress")
    clock = FakeClock()
    monkeypatch.setattr(reporting, "CLOCK", clock)
    with reporting.phase("training codec") as bar:
        clock.now += 45.0
        bar.tick()
        clock.now += 10.0
        bar.tick()
    assert [r.getMessage() for r in caplog.records] == ["training codec: running, 45s in"]
    with reporting.phase("training codec", show=False) as nothing:
        assert nothing is None
