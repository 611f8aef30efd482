"""Run artefacts: metrics as JSONL (resume-aware), JSON files written atomically, curve plots."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from mlxio.atomic import append_text, write_bytes_atomic, write_text_atomic

log = logging.getLogger(__name__)


class MetricsLog:
    """Append-only JSONL of {"step": n, ...} records.

    On resume from step s, records with step > s (written after that checkpoint by the run
    that was killed) are dropped first, so the file reads as one uninterrupted run.
    """

    def __init__(self, path: Path, resume_step: int | None = None, what: str = "metrics log"):
        self.path, self.what = path, what
        path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is None:
            write_bytes_atomic(path, b"", what)
        elif path.exists():
            from mlxio.errors import RunError
            from mlxio.inputs import MAX_DATA_BYTES, read_regular

            text = read_regular(path, what="metrics log", max_bytes=MAX_DATA_BYTES, error=RunError,
                                fix="move it away, then resume").decode("utf-8", "replace")
            kept = [line for line in text.splitlines()
                    if line.strip() and _step_of(line) <= resume_step]
            write_text_atomic(path, "".join(line + "\n" for line in kept), what)

    def write(self, record: dict) -> None:
        append_text(self.path, json.dumps(record, default=float) + "\n", self.what)

    def read(self) -> list[dict]:
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]


def _step_of(line: str) -> int:
    try:
        return int(json.loads(line).get("step", -1))
    except (json.JSONDecodeError, AttributeError, TypeError, ValueError):
        return 1 << 62  # a torn last line from a killed writer: drop it


def plot_curves(records: list[dict], path: Path, keys: tuple[str, ...], title: str) -> Path | None:
    """A PNG with one panel per metric key that the records hold, against "step"."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    present = [k for k in keys if any(k in r for r in records)]
    if not present:
        return None
    fig, axes = plt.subplots(len(present), 1, figsize=(7, 2.4 * len(present)), sharex=True, squeeze=False,
                             layout="constrained")  # leaves the title its own room
    for ax, key in zip(axes[:, 0], present, strict=True):
        points = [(r["step"], r[key]) for r in records if key in r]
        ax.plot(*zip(*points, strict=True), marker="o" if len(points) < 30 else None)
        ax.set_ylabel(key)
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("optimizer step")
    fig.suptitle(title)
    save_figure(fig, path)
    return path


def save_figure(fig, path: Path) -> None:
    """A matplotlib figure as a PNG at `path`, written atomically (`write_bytes_atomic`: never
    through a link), then closed."""
    import io

    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=110, format="png")
    plt.close(fig)
    write_bytes_atomic(path, buffer.getvalue(), "plot")
