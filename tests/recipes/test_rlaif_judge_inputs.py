"""The verdict-judge recipe's inputs: each option's bad values, bad or one-class logs fail with one
clear line before anything is written or trained; sampling resumes by whole chunks."""

import json
from pathlib import Path

import attrs
import pytest

from mlxio.errors import DataError, cli_main
from mlxio.rl import rollout_log, verifier
from recipes import rlaif_judge as rj


def smoke(out: Path, **kw):
    return attrs.evolve(rj.PRESETS["smoke"], out_dir=str(out), **kw)


def test_chunks_done_counts_whole_chunks_only(tmp_path):
    log = rollout_log.RolloutLog(tmp_path)
    problems = verifier.sampling_problems(rj.PRESETS["smoke"].sample, ("parsing",))
    lines = [{"step": s, "task_id": "t", "prompt": "p", "completion": "c", "passed": True} for s in (1, 1, 2)]
    log.path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert verifier.chunks_done(log.path, [2, 2]) == 1  # chunk 2 was cut short: sampled again
    assert verifier.chunks_done(log.path, [2, 1]) == 2
    assert verifier.chunks_done(tmp_path / "none.jsonl", [2]) == 0
    assert len(problems) == 9 and len({p.task_id for p in problems}) == 9


BAD = [  # argv, the error's text
    (["--train.batch", "3"], "train.batch: must be even"),
    (["--train.batch", "4", "--train.accum", "4"], "train.accum=4 must divide train.batch / 2 = 2"),
    (["--train.batch", "0"], "train.batch: must be >= 2"),
    (["--data.heldout_fraction", "1.5"], "data.heldout_fraction: must be < 1"),
    (["--data.max_tokens", "8"], "data.max_tokens: must be >= 16"),
    (["--data.heldout_families", "nope"], "data.heldout_families: unknown family 'nope'"),
    (["--data.heldout_families", "lists"], "data.heldout_families: lists also in families"),
    (["--sample.families", "nope"], "sample.families: unknown family 'nope'"),
    (["--sample.difficulty", "4"], "sample.difficulty[0]: must be <= 3, got 4"),
    (["--sample.difficulty", "1,1"], "sample.difficulty: distinct levels"),
    (["--sample.completions", "0"], "sample.completions: must be >= 1"),
    (["--sample.train_per_template", "-1"], "sample.train_per_template: must be >= 0"),
    (["--sample.heldout_per_template", "-1"], "sample.heldout_per_template: must be >= 0"),
    (["--sample.family_per_template", "-1"], "sample.family_per_template: must be >= 0"),
    (["--sample.task_seed", "-1"], "sample.task_seed: must be >= 0"),
    (["--sample.seed", "-1"], "sample.seed: must be >= 0"),
    (["--sample.temperature", "0"], "sample.temperature: must be > 0"),
    (["--sample.top_p", "1.5"], "sample.top_p: must be <= 1"),
    (["--sample.max_new_tokens", "0"], "sample.max_new_tokens: must be >= 1"),
    (["--sample.batch", "0"], "sample.batch: must be >= 1"),
    (["--sample.train_per_template", "0"], "0 with no --data.logs leaves nothing to train on"),
    (["--eval.batch", "0"], "eval.batch: must be >= 1"),
    (["--eval.resamples", "0"], "eval.resamples: must be >= 1"),
    (["--lora_layers", "0"], "lora_layers: must be >= 1"),
    (["--lora.dropout", "0.1"], "lora.dropout: not supported"),
]


@pytest.mark.parametrize(("argv", "text"), BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_options_fail_with_one_line(argv, text, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli_main("rlaif_judge", rj.main, [*argv, "--out_dir", str(tmp_path / "r")])
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert exit_.value.code == 2 and line.startswith("rlaif_judge: error: ") and text in line, line
    assert not (tmp_path / "r").exists()  # refused before anything is written


def test_bad_logs_fail_with_one_line(tmp_path, capsys):
    log = tmp_path / "rollouts.jsonl"
    log.write_text('{"task_id": "t", "prompt": "p", "completion": "c", "passed": "yes"}\n')
    cases = [([str(tmp_path / "missing")], "no rollout log at"),
             ([str(log)], "'passed' must be a bool, got str (" + str(log) + ":1); fix or delete that line")]
    for logs, text in cases:
        with pytest.raises(SystemExit) as exit_:
            cli_main("rlaif_judge", rj.main, ["--preset", "smoke", "--data.logs", ",".join(logs),
                                              "--sample.train_per_template", "0", "--sample.heldout_per_template", "0",
                                              "--sample.family_per_template", "0", "--out_dir", str(tmp_path / "r")])
        line = capsys.readouterr().err.strip().splitlines()[-1]
        assert exit_.value.code == 1 and line.startswith("rlaif_judge: error: ") and text in line, line


def test_one_class_logs_are_refused(tmp_path):
    log = tmp_path / "rollouts.jsonl"
    rows = [{"task_id": f"proc/train/lists/x/d1/{i}", "prompt": "def f(x):\n", "completion": f"c{i}", "passed": False}
            for i in range(3)]
    log.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = attrs.evolve(smoke(tmp_path / "r"), data=attrs.evolve(rj.PRESETS["smoke"].data, logs=(str(log),)),
                       sample=attrs.evolve(rj.PRESETS["smoke"].sample, train_per_template=0, heldout_per_template=0,
                                           family_per_template=0))
    with pytest.raises(DataError, match="0 passing and 3 failing ones; a balanced judge needs both"):
        rj.run(cfg)
