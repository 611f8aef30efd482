"""Where a benchmark's JSON goes: benchmarks/results/<machine>/<name>.json by default, or `--out`
alone, never both (writing the default and then removing it once deleted committed results)."""

from __future__ import annotations

import json

from benchmarks import gpu_common


def test_out_leaves_the_committed_results_alone(tmp_path, monkeypatch):
    results = tmp_path / "results"
    committed = results / "cpu" / "demo.json"
    committed.parent.mkdir(parents=True)
    committed.write_text('{"committed": true}\n')
    monkeypatch.delenv("BENCH_RESULTS", raising=False)
    out = tmp_path / "elsewhere" / "demo.json"
    assert gpu_common.write("demo", {"x": 1}, "cpu", out=str(out), root=results) == out
    assert json.loads(out.read_text())["x"] == 1 and json.loads(out.read_text())["benchmark"] == "demo"
    assert json.loads(committed.read_text()) == {"committed": True}
    # without --out: the results folder
    assert gpu_common.write("demo", {"x": 2}, "cpu", root=results) == committed
    assert json.loads(committed.read_text())["x"] == 2
