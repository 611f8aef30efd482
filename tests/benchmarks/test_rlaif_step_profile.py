"""benchmarks/rlaif_step_profile.py: the phase split's arithmetic and its call pattern (each
phase once to compile, then `repeats` times between barriers), on fake phases."""

from __future__ import annotations

import pytest

from benchmarks import rlaif_step_profile as sp


def test_split_takes_medians_and_differences():
    out = sp.split({"forward": [0.1, 0.3, 0.2], "forward_backward": [0.5, 0.5, 0.6], "step": [0.6, 0.7, 0.65]})
    assert out["forward_ms"] == pytest.approx(200.0) and out["forward_backward_ms"] == pytest.approx(500.0)
    assert out["backward_ms"] == pytest.approx(300.0) and out["optimizer_ms"] == pytest.approx(150.0)
    assert "backward_ms" not in sp.split({"step": [1.0]})


def test_each_phase_runs_once_then_repeats_times_between_barriers():
    calls, barriers = [], []
    fns = {name: (lambda name=name: calls.append(name)) for name in sp.PHASES}
    out = sp.timed(fns, repeats=3, sync=lambda: barriers.append(len(calls)))
    assert calls == list(sp.PHASES) + list(sp.PHASES) * 3  # compile pass, then interleaved repeats
    assert len(barriers) == 3 + 2 * 3 * 3  # one after each compile call, two around each timed call
    assert set(out) == {"forward_ms", "forward_backward_ms", "step_ms", "backward_ms", "optimizer_ms"}
