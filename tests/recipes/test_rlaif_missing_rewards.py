"""Rewards that never arrive, in a real run of the RLAIF recipe (smoke preset, tiny random
llama): an unreachable teacher or a sandbox that gives no verdict stops the run at its first
step with one line (or, with --rewards.allow_missing, the run goes on and says so at every
step), and a run whose every step trained nothing (--grpo.mask_truncated, all truncated) fails."""

from __future__ import annotations

import json
import logging
import re
import socket

import pytest

from mlxio.errors import cli_main
from mlxio.sandbox import runner
from recipes import rlaif_qwen

pytestmark = pytest.mark.slow  # each runs the smoke recipe: 15-25 s

LINE = re.compile(r"^rlaif_qwen: error: .+ \(.*\); .+$")


def run(argv, capsys, caplog) -> tuple[int, list[str]]:
    """(exit code, the run's log lines and stderr's) of the recipe run in-process under the
    error contract."""
    code = 0
    with caplog.at_level(logging.INFO):
        try:
            cli_main("rlaif_qwen", rlaif_qwen.main, ["--preset", "smoke", "--eval.before", "false", *argv])
        except SystemExit as exit_:
            code = exit_.code
    err = capsys.readouterr().err.strip().splitlines()
    assert "Traceback" not in "\n".join(err)
    return code, [r.getMessage() for r in caplog.records] + err


@pytest.fixture
def unreachable_teacher() -> list[str]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    return ["--teacher.url", f"http://127.0.0.1:{port}/v1", "--teacher.timeout_s", "2", "--teacher.retries", "0"]


def test_an_unreachable_teacher_stops_the_run_with_one_line(tmp_path, capsys, caplog, unreachable_teacher):
    code, err = run(["--out_dir", str(tmp_path / "r"), *unreachable_teacher], capsys, caplog)
    assert code == 1 and LINE.match(err[-1]), err[-1]
    assert "step 1: the ai_feedback reward was missing for 8 of 8 completions (100%" in err[-1]
    assert not (tmp_path / "r" / "adapters").exists()


def test_allow_missing_goes_on_and_says_so_at_every_step(tmp_path, capsys, caplog, unreachable_teacher):
    out = tmp_path / "r"
    code, err = run(["--out_dir", str(out), *unreachable_teacher, "--rewards.allow_missing", "true",
                     "--train.steps", "2", "--optim.total_steps", "2", "--eval.after", "false"], capsys, caplog)
    assert code == 0
    said = [line for line in err if "going on as --rewards.allow_missing asks" in line]
    assert [line.split("step ")[1][:2] for line in said] == ["1:", "2:"]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["missing/ai_feedback"] for r in records] == [8, 8]
    assert [r["missing/execution"] for r in records] == [0, 0]
    summary = json.loads((out / "eval.json").read_text())["rewards"]["missing"]
    assert summary["ai_feedback"] == {"completions": 16, "missing": 16, "share": 1.0}


@pytest.mark.skipif(runner.sandbox_backend() != "bwrap", reason="untrusted programs only run under bwrap")
def test_a_sandbox_that_gives_no_verdict_stops_the_run(tmp_path, capsys, caplog):
    """--sandbox.timeout_s shorter than any process start (1 us: the judge never loads, however
    idle the machine; at 0.05 s an idle one loaded it and timeouts became fails): every
    execution reward missing (was: a run on the format reward alone, exit 0, missing_rewards 0)."""
    code, err = run(["--out_dir", str(tmp_path / "r"), "--sandbox.timeout_s", "0.000001"], capsys, caplog)
    assert code == 1 and LINE.match(err[-1]), err[-1]
    assert "step 1: the execution reward was missing for 8 of 8 completions" in err[-1]
    assert any(line.startswith("sandbox: no verdict on problem") for line in err)


def test_a_run_whose_every_step_trained_nothing_fails(tmp_path, capsys, caplog):
    """--grpo.mask_truncated with every completion cut at max_new_tokens: each step says it
    trained nothing, and the run fails like one whose every update was non-finite."""
    out = tmp_path / "r"
    code, err = run(["--out_dir", str(out), "--grpo.mask_truncated", "true", "--max_new_tokens", "2",
                     "--train.steps", "2", "--optim.total_steps", "2"], capsys, caplog)
    assert code == 1 and LINE.match(err[-1]), err[-1]
    assert "no training step succeeded: none of the 2 updates had a completion to train on" in err[-1]
    said = [line for line in err if "trained nothing: all 8 completions with a reward hit max_new_tokens" in line]
    assert len(said) == 2
    assert not (out / "adapters").exists() and not (out / "eval.json").exists()
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["updates_empty"] for r in records] == [1, 2]
