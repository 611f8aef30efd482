"""`benchmarks/rlaif_learning.py` records a finished run: one entry per evaluation set with
the schema of rlaif_learning.json (seed, n_samples, command, wall time), appended across runs;
a run stopped part-way records nothing until a later sitting finishes it."""

from __future__ import annotations

import json

from benchmarks import rlaif_learning

KEYS = {"task_set", "model", "seed", "steps", "n_samples", "temperature", "before", "after", "diff",
        "command", "wall_s", "run"}
SIDE = {"pass_at_1", "ci95", "greedy", "greedy_ci95", "problems", "missing"}


def test_records_a_smoke_run_across_two_sittings(tmp_path):
    results, out = tmp_path / "rlaif_learning.json", tmp_path / "run"
    recipe = ["--preset", "smoke", "--out_dir", str(out), "--train.seed", "3"]
    rlaif_learning.main(["--machine", "cpu", "--results", str(results), "--stop_after", "2", "--", *recipe])
    assert not results.exists()  # 2 of 4 steps: not finished, nothing recorded
    rlaif_learning.main(["--machine", "cpu", "--results", str(results), "--", *recipe])
    (entry,) = json.loads(results.read_text())
    assert set(entry) == KEYS and set(entry["before"]) == SIDE == set(entry["after"])
    assert entry["seed"] == 3 and entry["steps"] == 4 and entry["n_samples"] == 2
    assert entry["task_set"] == "heldout" and entry["run"] == "run"
    assert entry["command"].startswith("python -m benchmarks.rlaif_learning --machine cpu -- --preset smoke")
    assert len(json.loads((out / "wall_s.json").read_text())) == 2
    assert entry["wall_s"] == sum(json.loads((out / "wall_s.json").read_text()))
    assert 0.0 <= entry["after"]["pass_at_1"] <= 1.0 and entry["diff"]["ci95"][0] <= entry["diff"]["mean"]
    # --from-eval re-records the finished run beside it
    rlaif_learning.main(["--machine", "cpu", "--results", str(results), "--from-eval",
                         str(out / "eval.json"), "--wall-s", "1.5", "--run-command", "x"])
    first, again = json.loads(results.read_text())
    assert again["wall_s"] == 1.5 and again["command"] == "x"
    assert {k: v for k, v in again.items() if k not in ("wall_s", "command")} == \
        {k: v for k, v in first.items() if k not in ("wall_s", "command")}
