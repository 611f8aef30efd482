"""benchmarks/xtr_heldout_packages.py without training: seeds x variants, resumable runs, the
budget stop, the state a device call carries back, and the hn - in-batch summary."""

from __future__ import annotations

import json
import tarfile

import pytest

from benchmarks import xtr_heldout_packages as bench


def _eval(mrr_files: float, mrr_pkg: float) -> dict:
    def block(m):
        return {"semantic": {"mrr@10": m, "p@1": m - 0.1}, "hybrid": {"mrr@10": m + 0.01, "p@1": m - 0.1},
                "hybrid_fusion": "interp@0.97"}

    return {"bm25": {"mrr@10": 0.4, "p@1": 0.3}, "untrained": block(0.5), "fine-tuned": block(mrr_files),
            "heldout_packages": {"queries": 10, "dev_queries": 5, "candidates": 50, "bm25": {"mrr@10": 0.4, "p@1": 0.3},
                                 "untrained": block(0.6), "fine-tuned": block(mrr_pkg)},
            "data": {"sources": [{"name": "python-stdlib", "version": "3.x", "role": "train (split by file)"},
                                 {"name": "beta", "version": "2.0", "role": "heldout_package"}]},
            "run": {"queries": 20, "candidates": 100, "steps": 3, "train_s": 1.0}}


def test_runs_resume_budget_state_and_summary(tmp_path, monkeypatch):
    calls = []

    def fake_run(command, budget, log=None):
        out = tmp_path / command[command.index("--out_dir") + 1]
        calls.append(command)
        hard = int(command[command.index("--data.hard_negatives") + 1])
        seed = int(command[command.index("--train.seed") + 1])
        if seed == 1 and not hard and "--resume" not in command:  # the budget stops this one mid-run
            (out / "checkpoints" / "step-00000002").mkdir(parents=True)
            (out / "checkpoints" / "step-00000002" / "trainable.safetensors").write_bytes(b"w")
            (out / "checkpoints" / "LATEST").write_text("step-00000002")
            return False
        out.mkdir(parents=True, exist_ok=True)
        evaluation = _eval(0.6 + 0.02 * bool(hard), 0.7 + 0.015 * bool(hard) + 0.001 * seed)
        evaluation["data"] |= {"hard_negatives": {"k": hard, "miners": ["bm25"]}} if hard else {}
        (out / "eval.json").write_text(json.dumps(evaluation))
        return True

    monkeypatch.setattr(bench, "run_one", fake_run)
    monkeypatch.setattr(bench, "seed_flag", lambda: "--train.seed")
    monkeypatch.chdir(tmp_path)
    results, out = tmp_path / "results.json", tmp_path / "out"
    argv = ["--runs", str(tmp_path / "runs"), "--results", str(results), "--seeds", "0,1", "--out", str(out)]
    assert bench.main(argv + ["--only", "seed=0,hn=1"]) == 0
    # hn: K always explicit (the presets train with none), 1 unless --hard_negatives says otherwise
    assert len(calls) == 1 and calls[0][calls[0].index("--data.hard_negatives") + 1] == "1"
    assert bench.main(argv) == bench.EX_TEMPFAIL  # seed 0 in-batch runs, then seed 1 in-batch is stopped
    assert len(calls) == 3 and calls[-1][calls[-1].index("--data.hard_negatives") + 1] == "0"
    with tarfile.open(out / "state.tar.gz") as tar:  # what a device call carries back
        names = tar.getnames()
    assert "quick_s1_inbatch/checkpoints/step-00000002/trainable.safetensors" in names
    assert "quick_s0_hn/entry.json" in names and not any(n.startswith("quick_s0_hn/checkpoints") for n in names)
    # a fresh machine: only the state comes back; the stopped run resumes, finished ones are skipped
    state = tmp_path / "state.tar.gz"
    (out / "state.tar.gz").rename(state)
    fresh = tmp_path / "fresh"
    assert bench.main(["--runs", str(fresh), "--results", str(results), "--seeds", "0,1", "--state", str(state)]) == 0
    assert [c[c.index("--out_dir") + 1].rsplit("/", 1)[1] for c in calls[3:]] == ["quick_s1_inbatch", "quick_s1_hn"]
    assert "--resume" in calls[3] and "--resume" not in calls[4]
    rows = json.loads(results.read_text())
    assert sorted((r["seed"], r["hard_negatives"]) for r in rows) == [(0, False), (0, True), (1, False), (1, True)]
    assert rows[0]["heldout_packages"] == ["beta==2.0"] and rows[0]["train_sources"] == ["python-stdlib==3.x"]
    block = bench.summary(rows)["quick"]["heldout_packages"]
    assert block["seeds"] == [0, 1] and block["mean_hn_minus_inbatch"] == 0.015
    assert bench.summary(rows)["quick"]["heldout_files"]["mean_hn_minus_inbatch"] == 0.02


def test_an_hn_run_without_hard_negatives_is_refused(tmp_path, monkeypatch):
    """A run labelled hn whose eval.json shows no mined hard negatives (e.g. an extra
    `--data.hard_negatives 0`) stops the benchmark instead of being recorded as hn."""

    def fake_run(command, budget, log=None):
        out = tmp_path / command[command.index("--out_dir") + 1]
        out.mkdir(parents=True, exist_ok=True)
        (out / "eval.json").write_text(json.dumps(_eval(0.6, 0.7)))  # no data.hard_negatives block
        return True

    monkeypatch.setattr(bench, "run_one", fake_run)
    monkeypatch.setattr(bench, "seed_flag", lambda: "--train.seed")
    results = tmp_path / "results.json"
    with pytest.raises(SystemExit, match="hn variant trained with 0 hard negatives"):
        bench.main(["--runs", str(tmp_path / "runs"), "--results", str(results), "--seeds", "0", "--variants", "hn"])
    assert not results.exists() or json.loads(results.read_text()) == []


def test_jobs_run_side_by_side_each_with_its_log(tmp_path, monkeypatch):
    """--jobs 3: runs overlap (each waits until all three have started), every one is recorded
    once, and each writes to its own folder's stdout.log; --jobs out of range is refused."""
    import threading

    started, logs = threading.Barrier(3, timeout=10), []

    def fake_run(command, budget, log=None):
        started.wait()  # a timeout here (BrokenBarrierError) means the runs did not overlap
        logs.append(log)
        out = tmp_path / command[command.index("--out_dir") + 1]
        out.mkdir(parents=True, exist_ok=True)
        hard = int(command[command.index("--data.hard_negatives") + 1])
        evaluation = _eval(0.6, 0.7)
        evaluation["data"] |= {"hard_negatives": {"k": hard, "miners": ["bm25"]}} if hard else {}
        (out / "eval.json").write_text(json.dumps(evaluation))
        return True

    monkeypatch.setattr(bench, "run_one", fake_run)
    monkeypatch.setattr(bench, "seed_flag", lambda: "--train.seed")
    results, runs = tmp_path / "results.json", tmp_path / "runs"
    argv = ["--runs", str(runs), "--results", str(results), "--seeds", "0,1,2", "--variants", "hn", "--jobs", "3"]
    assert bench.main(argv) == 0
    assert sorted(r["seed"] for r in json.loads(results.read_text())) == [0, 1, 2]
    assert sorted(logs) == [runs / f"quick_s{s}_hn" / "stdout.log" for s in range(3)]
    with pytest.raises(SystemExit):
        bench.main(argv[:-1] + ["0"])


def test_only_is_checked():
    assert bench.parse_only("seed=2,hn=0") == {"seed": "2", "hn": "0"}
    try:
        bench.parse_only("steps=3")
    except SystemExit as err:
        assert "--only" in str(err)
    else:
        raise AssertionError("accepted an unknown --only key")


def test_a_run_started_with_other_flags_is_refused(tmp_path, monkeypatch):
    """A second call that leaves out (or changes) the recipe flags after `--` stops, naming the
    run and both commands, instead of finishing a failed run with other settings."""
    calls = []

    def failing_run(command, budget, log=None):
        calls.append(command)
        raise SystemExit(f"{command} failed with exit status 1")

    monkeypatch.setattr(bench, "run_one", failing_run)
    monkeypatch.setattr(bench, "seed_flag", lambda: "--train.seed")
    monkeypatch.chdir(tmp_path)
    argv = ["--runs", str(tmp_path / "runs"), "--results", str(tmp_path / "r.json"), "--seeds", "0",
            "--variants", "inbatch"]
    with pytest.raises(SystemExit, match="failed"):
        bench.main(argv + ["--", "--optim.lr", "4e-4"])
    with pytest.raises(SystemExit, match=r"quick_s0_inbatch: started earlier as .*--optim.lr 4e-4.*give the same"):
        bench.main(argv)
    assert len(calls) == 1
    with pytest.raises(SystemExit, match="failed"):  # the same flags: the run is tried again
        bench.main(argv + ["--", "--optim.lr", "4e-4"])
    assert len(calls) == 2


def test_a_run_failing_beside_others_is_retried_alone(tmp_path, monkeypatch):
    """--jobs > 1: a run that fails while others run is tried once more alone after them; one
    that fails alone too stops the benchmark with its error."""
    calls, fail_twice = [], {"seed": 1}

    def flaky_run(command, budget, log=None):
        seed = int(command[command.index("--train.seed") + 1])
        calls.append(seed)
        if seed == fail_twice["seed"] and calls.count(seed) <= fail_twice.get("times", 1):
            raise SystemExit(f"{command} failed with exit status 1")
        out = tmp_path / command[command.index("--out_dir") + 1]
        out.mkdir(parents=True, exist_ok=True)
        (out / "eval.json").write_text(json.dumps(_eval(0.6, 0.7)))
        return True

    monkeypatch.setattr(bench, "run_one", flaky_run)
    monkeypatch.setattr(bench, "seed_flag", lambda: "--train.seed")
    monkeypatch.chdir(tmp_path)
    results = tmp_path / "r.json"
    argv = ["--runs", str(tmp_path / "runs"), "--results", str(results), "--seeds", "0,1,2", "--variants",
            "inbatch", "--jobs", "3"]
    assert bench.main(argv) == 0
    assert sorted(calls) == [0, 1, 1, 2] and calls[-1] == 1  # the retry comes after the others
    assert sorted(r["seed"] for r in json.loads(results.read_text())) == [0, 1, 2]
    calls.clear()
    fail_twice.update(seed=3, times=2)
    with pytest.raises(SystemExit, match="failed with exit status 1"):
        bench.main(argv[:-4] + ["--seeds", "3,4", "--variants", "inbatch", "--jobs", "2"])
    assert sorted(calls) == [3, 3, 4]


def test_record_replaces_a_rerun_but_keeps_an_older_preset(tmp_path):
    """The same command run again replaces its entry; the same command once the preset changed
    (other steps, batch or learning rate) is another setting and is kept beside it."""
    path = tmp_path / "r.json"
    base = {"preset": "quick", "seed": 0, "hard_negatives": False, "command": "python -m recipes.xtr_lora",
            "steps": 80, "contrastive_batch": 12}
    bench.record(path, base | {"wall_s": 1.0})
    bench.record(path, base | {"wall_s": 2.0})
    assert [r["wall_s"] for r in json.loads(path.read_text())] == [2.0]
    bench.record(path, base | {"steps": 15, "contrastive_batch": 256, "lr": 4e-4, "wall_s": 3.0})
    assert [r["wall_s"] for r in json.loads(path.read_text())] == [2.0, 3.0]
