"""Memory profiler: per-step records, regions, leak trend, report and plot."""

import json
import logging

import mlx.core as mx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlxio.run import memprof


def test_snapshot_sees_an_allocation():
    mx.eval(mx.zeros((1,)))
    before = memprof.snapshot()
    x = mx.zeros((4 * 1024 * 1024,), mx.float32)  # 16 MB
    mx.eval(x)
    after = memprof.snapshot()
    assert after["active_mb"] - before["active_mb"] >= 15.9
    assert after["peak_mb"] >= after["active_mb"]
    assert after["rss_mb"] > 0 and after["cache_mb"] >= 0
    del x


@given(a=st.floats(-5, 5), b=st.floats(-100, 100), n=st.integers(2, 40))
@settings(max_examples=20)
def test_slope_recovers_a_line(a, b, n):
    xs = list(range(n))
    assert memprof.slope(xs, [a * x + b for x in xs]) == pytest.approx(a, abs=1e-6)


def test_leak_trend_flags_steady_growth_not_a_jump():
    steps = list(range(20))
    rising = [100 + 2.0 * s for s in steps]
    assert memprof.leak_trend(steps, rising)["leak"]
    flat = [100.0 + (0.1 if s % 2 else 0.0) for s in steps]
    assert not memprof.leak_trend(steps, flat)["leak"]
    jump = [100.0] * 10 + [160.0] * 10  # one new compiled shape: a step, not a trend
    assert not memprof.leak_trend(steps, jump)["leak"]


def test_profiler_warns_on_a_leaking_loop_and_writes_report(tmp_path, caplog):
    prof = memprof.MemoryProfiler(window=8, threshold_mb_per_step=0.5, warmup=1)
    kept = []
    with caplog.at_level(logging.WARNING, logger="mlxio.run.memprof"):
        for step in range(12):
            with prof.region("alloc"):
                x = mx.ones((256 * 1024,), mx.float32)  # 1 MB kept every step: a leak
                mx.eval(x)
                kept.append(x)
            prof.record(step + 1, loss=1.0)
    assert prof.trend()["leak"]
    assert sum("keeps rising" in r.message for r in caplog.records) == 1  # warned once
    assert prof.regions["alloc"]["calls"] == 12
    assert prof.regions["alloc"]["peak_mb"] >= 1.0
    assert all(r["peak_mb"] >= r["active_mb"] - 1e-6 for r in prof.records)
    json_path, png_path = prof.write(tmp_path, title="test")
    report = json.loads(json_path.read_text())
    assert [r["step"] for r in report["records"]] == list(range(1, 13))
    assert report["trend"]["leak"] and report["overall_peak_mb"] >= report["summary"]["active_mb"]["last"]
    assert png_path.is_file() and png_path.stat().st_size > 1000


def test_profiler_quiet_on_a_steady_loop(caplog):
    prof = memprof.MemoryProfiler(window=8, warmup=1)
    with caplog.at_level(logging.WARNING, logger="mlxio.run.memprof"):
        for step in range(12):
            x = mx.ones((256 * 1024,), mx.float32)
            mx.eval(x * 2)
            del x
            prof.record(step + 1)
    assert not prof.trend()["leak"]
    assert not caplog.records


def test_per_step_peak_is_reset_between_records():
    prof = memprof.MemoryProfiler()
    big = mx.ones((8 * 1024 * 1024,), mx.float32)  # 32 MB transient
    mx.eval(big)
    del big
    first = prof.record(1)
    second = prof.record(2)
    assert first["peak_mb"] - second["peak_mb"] >= 31
    assert prof.overall_peak_mb >= first["peak_mb"]
