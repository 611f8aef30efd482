"""Run reporting that works in a terminal, in a log file and in the tracking tools users expect.

- `progress(...)`: a tqdm bar when stderr is a terminal; otherwise one `logging` line at most
  every `every_s` seconds (done / total, rate, ETA), one at least every `HEARTBEAT_S` while it
  runs (a heartbeat thread) and one at the end, so `make train > log`, nohup and CI show
  progress too. Used for training, mining, evaluation and indexing.
- `WindowMean`: the mean of every metric over the steps since the last logged record (a logged
  record is never one sampled step); `StepWindows`: the same for steps evaluated lazily, in runs.
- `Reporter`: one logged record goes to metrics.jsonl, and optionally to TensorBoard event
  files (`report_to=("tensorboard",)`, written here without TensorFlow or tensorboard: the
  TFRecord framing and the `Event` protobuf are a few bytes each) and to Weights & Biases
  (`report_to=("wandb",)`; offline unless `WANDB_MODE` says otherwise: no network needed,
  `wandb sync OUT/wandb/offline-run-*` uploads later). When stderr is not a terminal each
  record is also a one-line log message (step, window-mean loss, lr, throughput, ETA).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import struct
import sys
import threading
import time
import weakref
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from mlxio.atomic import open_in_place, run_dir
from mlxio.errors import ConfigError, RunError
from mlxio.run.runlog import MetricsLog

log = logging.getLogger("mlxio.progress")
REPORT_TO = ("tensorboard", "wandb")


def interactive(stream=None) -> bool:
    """True when `stream` (default stderr) is a terminal, where a redrawn bar is readable."""
    stream = sys.stderr if stream is None else stream
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def format_duration(seconds: float) -> str:
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else (f"{minutes}m{secs:02d}s" if minutes else f"{secs}s")


HEARTBEAT_S = 30.0  # off a terminal, the longest a progress display stays silent
CLOCK = time.perf_counter  # progress displays' clock when none is given (tests inject one)
MIN_RATE_S = 1.0  # a progress line gives a rate (and ETA) only over at least this many seconds


class LogProgress:
    """tqdm's small interface (`update`, `set_postfix`, `close`, iteration, context manager)
    written as log lines: `desc: 120/500 files (24%), 31.2 files/s, ETA 12s | loss=0.31`, one
    when an update comes `every_s` after the last line, and one from a heartbeat when
    `HEARTBEAT_S` pass with no line at all (a long step, a slow compile: a run never goes quiet
    for minutes, whatever its logging interval). `clock` (seconds; default `CLOCK`) is
    injectable; `heartbeat` False leaves the thread out (`tick` is then the caller's)."""

    def __init__(self, iterable: Iterable | None = None, *, total: int | None = None, desc: str = "",
                 unit: str = "it", initial: int = 0, every_s: float = 30.0, logger=None,
                 clock=None, heartbeat: bool = True):
        self.iterable, self.desc, self.unit, self.every_s = iterable, desc, unit, every_s
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable) + initial
        self.total, self.n, self.initial = total, initial, initial
        self.log = logger or log
        self.clock = clock or CLOCK
        self.start = self.last = self.clock()
        self.postfix: dict[str, Any] = {}
        self.closed = False
        self.printed = initial  # `n` at the last line printed: close() does not print it again
        self._stop = threading.Event()
        if heartbeat:
            threading.Thread(target=_heartbeat, args=(weakref.ref(self), self._stop), daemon=True,
                             name=f"progress heartbeat: {desc}").start()

    def __iter__(self) -> Iterator:
        try:
            for item in self.iterable:
                yield item
                self.update(1)
        finally:  # also when the loop stops early (the generator is closed)
            self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def set_postfix(self, ordered_dict=None, refresh=True, **kwargs):
        self.postfix = {**(ordered_dict or {}), **kwargs}

    def set_postfix_str(self, text: str = "", refresh=True):
        self.postfix = {"": text} if text else {}

    def set_description(self, desc: str, refresh=True):
        self.desc = desc

    def refresh(self):
        pass

    def line(self) -> str:
        """`desc: done/total unit (pct%)`, then the rate and ETA once `MIN_RATE_S` have passed
        (over less, a rate measures the clock, not the work), or `done in` / `... in`."""
        elapsed = self.clock() - self.start
        if self.total is None and self.n == self.initial:  # a phase without counted steps (`phase`)
            return f"{self.desc}: running, {format_duration(elapsed)} in"
        rate = (self.n - self.initial) / elapsed if elapsed >= MIN_RATE_S else 0.0
        parts = [f"{self.n}/{self.total}" if self.total else f"{self.n}", self.unit]
        if self.total:
            parts[-1] += f" ({100 * self.n / self.total:.0f}%)"
        text = f"{self.desc}: {' '.join(parts)}"
        if rate > 0:
            text += f", {rate:.3g} {self.unit}/s"
        if self.total and rate > 0 and self.n < self.total:
            text += f", ETA {format_duration((self.total - self.n) / rate)}"
        elif self.n >= (self.total or math.inf):
            text += f", done in {format_duration(elapsed)}"
        elif self.n == self.initial:
            text += f", {format_duration(elapsed)} in"
        if self.postfix:
            text += " | " + " ".join(f"{k}={v}" if k else str(v) for k, v in self.postfix.items())
        return text

    def update(self, n: int = 1):
        if self.closed:
            return
        self.n += n
        if self.clock() - self.last >= self.every_s:
            self._print()

    def tick(self) -> None:
        """A line if none was logged for `HEARTBEAT_S` (the heartbeat thread calls this)."""
        if not self.closed and self.clock() - self.last >= min(HEARTBEAT_S, self.every_s):
            self._print()

    def printed_elsewhere(self) -> None:
        """Another line just showed the progress (a metrics record): the silence starts now."""
        self.last = self.clock()

    def _print(self) -> None:
        self.last, self.printed = self.clock(), self.n
        self.log.info(self.line())

    def close(self):
        if not self.closed:
            self.closed = True
            self._stop.set()
            if self.n > self.printed:
                self.log.info(self.line())


def _heartbeat(bar_ref, stop: threading.Event) -> None:
    """Until the bar closes or is gone: `tick` it every few seconds."""
    while not stop.wait(min(5.0, HEARTBEAT_S / 6)):
        bar = bar_ref()
        if bar is None:
            return
        bar.tick()
        del bar


def progress(iterable: Iterable | None = None, *, total: int | None = None, desc: str = "",
             unit: str = "it", initial: int = 0, every_s: float = 30.0, disable: bool = False,
             logger=None):
    """A progress display over `iterable` (or driven by `update`): tqdm on a terminal, periodic
    log lines otherwise; nothing at all when `disable` (e.g. ranks other than 0)."""
    if disable:
        from tqdm import tqdm
        return tqdm(iterable, total=total, disable=True)
    if interactive():
        from tqdm import tqdm
        return tqdm(iterable, total=total, desc=desc, unit=unit, initial=initial, dynamic_ncols=True)
    return LogProgress(iterable, total=total, desc=desc, unit=unit, initial=initial,
                       every_s=every_s, logger=logger)


def phase(desc: str, show: bool = True):
    """A context for a step that reports no progress of its own (a codec's k-means): off a
    terminal, `desc: running, 1m30s in` every HEARTBEAT_S while it runs, nothing when it ends
    within that (or when not `show`, or on a terminal)."""
    if not show or interactive():
        return contextlib.nullcontext()
    return LogProgress(total=None, desc=desc, unit="step")


class WindowMean:
    """Means of the metrics added since the last `pop` (None and NaN values are left out of
    their key's mean; a key with no value in the window is absent)."""

    def __init__(self):
        self.sums: dict[str, float] = {}
        self.counts: dict[str, int] = {}
        self.steps = 0

    def add(self, metrics: dict[str, Any]) -> None:
        self.steps += 1
        for key, value in metrics.items():
            if value is None or isinstance(value, (str, bool)):
                continue
            value = float(value)
            if math.isnan(value):
                continue
            self.sums[key] = self.sums.get(key, 0.0) + value
            self.counts[key] = self.counts.get(key, 0) + 1

    def pop(self) -> dict[str, float]:
        means = {k: self.sums[k] / self.counts[k] for k in self.sums}
        self.__init__()
        return means


class StepWindows:
    """Metrics of lazily evaluated optimizer steps -> one record per logging window: every
    `log_every` steps and at `last_step`, the means over the steps since the last record
    (`WindowMean`), that step's own lr, and samples per second over the window's time."""

    def __init__(self, log_every: int, last_step: int, samples_per_step: int):
        self.log_every, self.last_step, self.samples_per_step = log_every, last_step, samples_per_step
        self.window, self.seconds = WindowMean(), 0.0

    def records(self, pending: list[tuple[int, dict]], elapsed: float) -> list[dict[str, float]]:
        """The records completed by the evaluated steps `pending` ([(1-based step, metrics)]),
        which took `elapsed` seconds."""
        self.seconds += elapsed
        out = []
        for done, step_metrics in pending:
            values = {k: float(v) for k, v in step_metrics.items()}
            self.window.add(values)
            if done % self.log_every == 0 or done == self.last_step:
                steps = self.window.steps
                out.append({"step": done, **self.window.pop(), "lr": values["lr"],
                            "samples_per_s": self.samples_per_step * steps / self.seconds, "window_steps": steps})
                self.seconds = 0.0
        return out


# ---------------------------------------------------------------------------------------------
# TensorBoard event files (TFRecord framing of `tensorflow.Event` protobufs)

def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_CRC_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _masked_crc(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        bits, value = value & 0x7F, value >> 7
        out.append(bits | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _field(number: int, wire_type: int, payload: bytes) -> bytes:
    key = _varint(number << 3 | wire_type)
    if wire_type == 2:
        return key + _varint(len(payload)) + payload
    return key + payload


def event_bytes(wall_time: float, step: int, *, file_version: str | None = None,
                scalars: dict[str, float] | None = None) -> bytes:
    """A serialised `tensorflow.Event`: wall_time (1, double), step (2, int64), file_version
    (3, string) or summary (5: `Summary.value` (1) of {tag (1), simple_value (2, float)})."""
    body = _field(1, 1, struct.pack("<d", wall_time)) + _field(2, 0, _varint(step))
    if file_version is not None:
        body += _field(3, 2, file_version.encode())
    if scalars:
        values = b"".join(_field(1, 2, _field(1, 2, tag.encode()) + _field(2, 5, struct.pack("<f", value)))
                          for tag, value in scalars.items())
        body += _field(5, 2, values)
    return body


class TensorBoardWriter:
    """Scalars as a TensorBoard event file in `log_dir` (what `SummaryWriter.add_scalar` writes)."""

    def __init__(self, log_dir: Path):
        run_dir(log_dir, "TensorBoard folder")  # never a link to another folder
        name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}.0"
        self.path = log_dir / name
        self.handle = os.fdopen(open_in_place(self.path, "TensorBoard log", append=True), "ab")
        self._write(event_bytes(time.time(), 0, file_version="brain.Event:2"))

    def _write(self, data: bytes) -> None:
        header = struct.pack("<Q", len(data))
        self.handle.write(header + struct.pack("<I", _masked_crc(header)) + data
                          + struct.pack("<I", _masked_crc(data)))

    def scalars(self, step: int, values: dict[str, float], wall_time: float | None = None) -> None:
        finite = {k: float(v) for k, v in values.items()
                  if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}
        if finite:
            self._write(event_bytes(time.time() if wall_time is None else wall_time, step, scalars=finite))
            self.handle.flush()

    def close(self) -> None:
        self.handle.close()


class WandbWriter:
    """A Weights & Biases run (offline unless WANDB_MODE is set) logging each record."""

    def __init__(self, out_dir: Path, project: str, name: str, config: dict):
        try:
            import wandb
        except ImportError:
            raise ConfigError("--report_to wandb needs the wandb package: pip install wandb "
                              "(or pip install -e '.[report]')") from None
        mode = os.environ.get("WANDB_MODE", "offline")
        try:
            self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", project), name=name,
                                  dir=str(out_dir), mode=mode, config=config, reinit="finish_previous")
        except Exception as err:  # noqa: BLE001 - wandb raises UsageError (no API key), CommError (network), ...
            raise RunError(f"--report_to wandb: Weights & Biases could not start a run ({type(err).__name__}: "
                           f"{str(err)[:200]})", where=f"WANDB_MODE={mode}",
                           fix="run `wandb login` where the network is reachable, or set WANDB_MODE=offline "
                               "(`wandb sync` uploads later), or drop --report_to wandb") from None

    def scalars(self, step: int, values: dict[str, float]) -> None:
        self.run.log({k: v for k, v in values.items() if v is not None}, step=step)

    def close(self) -> None:
        self.run.finish()


def check_report_to(report_to: Iterable[str]) -> tuple[str, ...]:
    names = tuple(report_to)
    unknown = [n for n in names if n not in REPORT_TO + ("none",)]
    if unknown:
        raise ConfigError(f"report_to: unknown {', '.join(unknown)} (choose from {', '.join(REPORT_TO)})")
    return tuple(n for n in names if n != "none")


class Reporter:
    """Every logged record: metrics.jsonl, then TensorBoard / W&B when asked for; on a
    non-terminal stderr also one log line (step/total, the `headline` metrics, ETA)."""

    def __init__(self, out_dir: Path, *, report_to: Iterable[str] = (), config: dict | None = None,
                 project: str = "mlx-retrieval-rl", resume_step: int | None = None,
                 total_steps: int | None = None, start_step: int = 0,
                 headline: tuple[str, ...] = ("loss", "lr"), logger=None):
        self.report_to = check_report_to(report_to)
        self.metrics = MetricsLog(out_dir / "metrics.jsonl", resume_step=resume_step)
        self.tensorboard = TensorBoardWriter(out_dir / "tensorboard") if "tensorboard" in self.report_to else None
        self.wandb = (WandbWriter(out_dir, project, out_dir.name, config or {})
                      if "wandb" in self.report_to else None)
        self.total, self.start_step, self.headline = total_steps, start_step, headline
        self.log = logger or log
        self.t0 = time.perf_counter()
        self.console = not interactive()

    def write(self, record: dict[str, Any]) -> None:
        step = int(record["step"])
        self.metrics.write(record)
        scalars = {k: v for k, v in record.items() if k != "step"}
        if self.tensorboard is not None:
            self.tensorboard.scalars(step, scalars)
        if self.wandb is not None:
            self.wandb.scalars(step, scalars)
        if self.console:
            self.log.info(self.line(record))

    def write_summary(self, step: int, values: dict[str, float]) -> None:
        """A run's result (e.g. its evaluation metrics) at `step` to TensorBoard and W&B (also
        the W&B run's summary); not to metrics.jsonl, which holds the training windows."""
        if self.tensorboard is not None:
            self.tensorboard.scalars(step, values)
        if self.wandb is not None:
            self.wandb.scalars(step, values)
            self.wandb.run.summary.update({k: v for k, v in values.items() if v is not None})

    def line(self, record: dict[str, Any]) -> str:
        step = int(record["step"])
        parts = [f"step {step}/{self.total}" if self.total else f"step {step}"]
        for key in self.headline:
            value = record.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                parts.append(f"{key} {value:.3e}" if key == "lr" else f"{key} {value:.4g}")
        elapsed = time.perf_counter() - self.t0
        done = step - self.start_step
        if self.total and done > 0:
            parts.append(f"ETA {format_duration(elapsed / done * (self.total - step))}")
        return " | ".join(parts)

    def read(self) -> list[dict]:
        return self.metrics.read()

    def close(self) -> None:
        """Flush and close the event file and finish the W&B run (again: nothing)."""
        if self.tensorboard is not None:
            self.tensorboard.close()
            self.tensorboard = None
        if self.wandb is not None:
            self.wandb.close()
            self.wandb = None
