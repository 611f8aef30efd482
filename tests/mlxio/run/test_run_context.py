"""The shared run scaffolding (mlxio.run.context) and the one vocabulary of both recipes: old
setting and flag names still work with a warning, an older checkpoint's tree name is read as
the current one, and a refused resume says which settings changed."""

import json

import attrs
import mlx.core as mx
import pytest

from mlxio.errors import CheckpointError, TrainingDiverged
from mlxio.run import checkpoint, context, distributed
from mlxio.run.config import migrate, to_dict
from mlxio.run.flags import add_run_flags, parse_args
from mlxio.run.loop import TrainLoop
from recipes import rlaif_config, xtr_lora_config


def test_migrate_renames_and_drops():
    data, notes = migrate({"out": "x", "accumulation": 4, "train": {"stop_after": 3, "steps": 9}},
                          {"out": "out_dir", "accumulation": "accum", "train.stop_after": None})
    assert data == {"out_dir": "x", "accum": 4, "train": {"steps": 9}}
    assert notes == ["out -> out_dir", "accumulation -> accum", "train.stop_after -> (a command-line flag now)"]


def test_old_flag_names_still_work_with_a_warning():
    with pytest.warns(DeprecationWarning, match="--out is deprecated: use --out_dir"):
        cfg, flags = parse_args(["--preset", "smoke", "--out", "somewhere", "--accumulation", "4", "--stop-after", "2",
                                 "--seed", "5", "--eval_micro_batches", "false"],
                                rlaif_config.PRESETS, prog="t", description="", default_preset="smoke",
                                extra=lambda p: add_run_flags(p, more_steps_aliases=("--stop-after",)))
    assert cfg.out_dir == "somewhere" and cfg.train.accum == 4 and flags.more_steps == 2 and flags.stop_after is None
    assert cfg.train.seed == 5 and cfg.memory.eval_micro_batches is False
    with pytest.warns(DeprecationWarning, match="--train.stop_after is deprecated"):
        _, flags = parse_args(["--train.stop_after", "3"], xtr_lora_config.PRESETS, prog="t", description="",
                              default_preset="smoke", extra=lambda p: add_run_flags(p, ("--train.stop_after",)))
    assert flags.stop_after == 3


def old_rlaif_layout(cfg) -> dict:
    """An RLAIF config as the recipe wrote it before the shared vocabulary: the train and
    memory settings at the top level, `out` and `accumulation`."""
    old = to_dict(cfg)
    old.update(old.pop("train"))
    memory = old.pop("memory")
    old["eval_micro_batches"] = memory.pop("eval_micro_batches")
    if memory:  # the memory settings added since keep their section (their defaults)
        old["memory"] = memory
    old["out"], old["accumulation"] = old.pop("out_dir"), old.pop("accum")
    return old


def test_old_config_file_keys_are_read(tmp_path):
    old = old_rlaif_layout(rlaif_config.PRESETS["smoke"])
    path = tmp_path / "config.json"
    path.write_text(__import__("json").dumps(old))
    with pytest.warns(DeprecationWarning, match="out -> out_dir, accumulation -> train.accum, steps -> train.steps"):
        cfg, _ = parse_args(["--config", str(path)], rlaif_config.PRESETS, prog="t", description="",
                            default_preset="smoke")
    assert cfg == rlaif_config.PRESETS["smoke"]


def test_resume_reads_an_old_tree_name_and_refuses_another_config_by_name(tmp_path):
    trees = {"lora": {"a": mx.ones(2)}, "opt_state": {"n": mx.zeros(1)}}
    cfg = {"optim": {"lr": 1e-4}, "out": "x", "steps": 4}
    checkpoint.save(tmp_path, 2, trees, {"config_hash": "h-old", "base_model": "m", "rng": checkpoint.rng_snapshot(),
                                         "config": cfg})
    template = {"trainable": {"a": mx.zeros(2)}, "opt_state": {"n": mx.zeros(1)}}
    found = context.resume(tmp_path, {"config_hash": "h-old", "base_model": "m"}, template, distributed.SINGLE,
                           {"optim": {"lr": 1e-4}, "out_dir": "x", "steps": 4}, {"out": "out_dir"})
    assert found.step == 2 and set(found.trees) == {"trainable", "opt_state"}
    assert mx.array_equal(found.trees["trainable"]["a"], mx.ones(2))
    with pytest.raises(CheckpointError, match=r"changed: optim.lr: 0.0001 -> 0.001; renamed since: out -> out_dir"):
        context.resume(tmp_path, {"config_hash": "h-new", "base_model": "m"}, template, distributed.SINGLE,
                       {"optim": {"lr": 1e-3}, "out_dir": "x", "steps": 4}, {"out": "out_dir"})


def test_resume_of_a_checkpoint_under_old_setting_names(tmp_path, caplog):
    """Same settings under old names: resumed, with a warning naming the renames; other
    settings: refused, naming the change and the renames."""
    from mlxio.rl.grpo import config_hash

    cfg = rlaif_config.PRESETS["smoke"]
    trees = {"lora": {"a": mx.ones(2)}, "opt_state": {"n": mx.zeros(1)}}
    checkpoint.save(tmp_path, 2, trees, {"config_hash": "hash-of-the-old-layout", "base_model": "m",
                                         "rng": checkpoint.rng_snapshot(), "config": old_rlaif_layout(cfg)})
    template = {"trainable": {"a": mx.zeros(2)}, "opt_state": {"n": mx.zeros(1)}}
    now = to_dict(cfg)
    found = context.resume(tmp_path, {"config_hash": config_hash(now), "base_model": "m"}, template,
                           distributed.SINGLE, now, rlaif_config.Config.LEGACY_KEYS, config_hash)
    assert found.step == 2 and "written under old setting names (out -> out_dir, accumulation -> train.accum" in caplog.text
    other = to_dict(attrs.evolve(cfg, train=attrs.evolve(cfg.train, seed=1)))
    with pytest.raises(CheckpointError, match=r"changed: train.seed: 0 -> 1; renamed since: out -> out_dir, "
                                              r"accumulation -> train.accum, steps -> train.steps"):
        context.resume(tmp_path, {"config_hash": config_hash(other), "base_model": "m"}, template,
                       distributed.SINGLE, other, rlaif_config.Config.LEGACY_KEYS, config_hash)


def test_resume_of_a_checkpoint_written_before_newer_options(tmp_path, caplog):
    """A checkpoint whose recorded config lacks settings added since (here the whole memory
    section, and old names besides): resumed where this run leaves them at their defaults, with
    one warning naming them; a lacking setting this run sets to another value is a change,
    named in the refusal (and only it: the lacking defaults are not)."""
    from mlxio.rl.grpo import config_hash
    from mlxio.run.config import default_values

    smoke = rlaif_config.PRESETS["smoke"]
    cfg = attrs.evolve(smoke, memory=rlaif_config.MemoryConfig())
    defaults = default_values(rlaif_config.Config)
    assert all(defaults[f"memory.{k}"] == v for k, v in to_dict(cfg.memory).items())
    template = {"trainable": {"a": mx.zeros(2)}, "opt_state": {"n": mx.zeros(1)}}
    now = to_dict(cfg)

    def write(recorded: dict, where, recorded_hash: str):
        checkpoint.save(where, 2, {"trainable": {"a": mx.ones(2)}, "opt_state": {"n": mx.zeros(1)}},
                        {"config_hash": recorded_hash, "base_model": "m", "rng": checkpoint.rng_snapshot(),
                         "config": recorded})

    def resume(where, config):
        return context.resume(where, {"config_hash": config_hash(config), "base_model": "m"}, template,
                              distributed.SINGLE, config, rlaif_config.Config.LEGACY_KEYS, config_hash, defaults)

    old = {k: v for k, v in now.items() if k != "memory"}  # written before memory.* existed
    write(old, tmp_path / "a", config_hash(old))
    with pytest.raises(CheckpointError, match="changed: memory.auto_batch: '<absent>' -> False; "):  # no defaults: refused
        context.resume(tmp_path / "a", {"config_hash": config_hash(now), "base_model": "m"}, template,
                       distributed.SINGLE, now, rlaif_config.Config.LEGACY_KEYS, config_hash)
    caplog.clear()
    found = resume(tmp_path / "a", now)
    assert found.step == 2 and mx.array_equal(found.trees["trainable"]["a"], mx.ones(2))
    notes = [r.getMessage() for r in caplog.records if "existed" in r.getMessage()]
    assert len(notes) == 1 and "before memory.auto_batch, memory.budget_fraction" in notes[0], notes
    assert json.loads((tmp_path / "a" / "config.json").read_text()) == now

    other = to_dict(attrs.evolve(cfg, memory=attrs.evolve(cfg.memory, logprob_chunk=256)))
    with pytest.raises(CheckpointError, match=r"changed: memory.logprob_chunk: '<absent>' -> 256 \(not in the "
                                              r"checkpoint's config; it resumes with the default 512\)$"):
        resume(tmp_path / "a", other)

    old = old_rlaif_layout(cfg)
    del old["memory"]  # old names, and of the memory section only eval_micro_batches (at the top level)
    write(old, tmp_path / "b", "hash-of-the-old-layout")
    caplog.clear()
    assert resume(tmp_path / "b", now).step == 2
    assert "under old setting names (out -> out_dir" in caplog.text and "before memory.auto_batch" in caplog.text


def test_a_refusal_names_only_the_settings_that_make_the_hash_differ(tmp_path):
    """out_dir, report_to and train.log_every are outside the RLAIF config hash: a checkpoint
    moved to another folder and resumed with another seed is refused naming the seed alone."""
    from mlxio.rl.grpo import config_hash

    cfg = rlaif_config.PRESETS["smoke"]
    recorded = to_dict(attrs.evolve(cfg, out_dir="elsewhere/old", report_to=("tensorboard",),
                                    train=attrs.evolve(cfg.train, log_every=3)))
    checkpoint.save(tmp_path, 2, {"trainable": {"a": mx.ones(2)}, "opt_state": {"n": mx.zeros(1)}},
                    {"config_hash": config_hash(recorded), "base_model": "m", "rng": checkpoint.rng_snapshot(),
                     "config": recorded})
    template = {"trainable": {"a": mx.zeros(2)}, "opt_state": {"n": mx.zeros(1)}}
    now = to_dict(attrs.evolve(cfg, out_dir=str(tmp_path), train=attrs.evolve(cfg.train, seed=7)))
    with pytest.raises(CheckpointError) as err:
        context.resume(tmp_path, {"config_hash": config_hash(now), "base_model": "m"}, template, distributed.SINGLE,
                       now, rlaif_config.Config.LEGACY_KEYS, config_hash)
    assert str(err.value).endswith("changed: train.seed: 0 -> 7"), str(err.value)
    # the same settings but those outside the hash: resumed, no refusal to word
    same = to_dict(attrs.evolve(cfg, out_dir=str(tmp_path)))
    assert context.resume(tmp_path, {"config_hash": config_hash(same), "base_model": "m"}, template,
                          distributed.SINGLE, same, rlaif_config.Config.LEGACY_KEYS, config_hash).step == 2


def test_divergence_guard_and_cadence():
    state = {"consecutive_skips": mx.array(3), "skips": mx.array(5)}
    with pytest.raises(TrainingDiverged, match=r"step 9: 3 non-finite steps in a row \(skipped, 5 in all\); stopping. hint"):
        context.check_divergence(state, 3, 9, "hint")
    context.check_divergence(state, 4, 9, "hint")
    assert [s for s in range(1, 11) if context.checkpoint_due(s, 4, 10)] == [4, 8, 10]
    assert context.last_step(10, None) == 10 and context.last_step(10, 4) == 4 and context.last_step(10, 20) == 10
    assert context.last_step(10, None, 6, 2) == 8 and context.last_step(10, 7, 6, 2) == 7


def test_schedule_length_follows_steps_unless_given(tmp_path):
    def parse(argv):
        return parse_args(argv, rlaif_config.PRESETS, prog="t", description="", default_preset="smoke")[0]
    assert parse(["--train.steps", "30"]).optim.total_steps == 30
    assert parse(["--train.steps", "30", "--optim.total_steps", "50"]).optim.total_steps == 50
    assert parse([]).optim.total_steps == rlaif_config.PRESETS["smoke"].train.steps
    with pytest.warns(DeprecationWarning, match="--steps is deprecated: use --train.steps"):
        assert parse(["--steps", "30"]).optim.total_steps == 30
    xtr = parse_args(["--train.steps", "7"], xtr_lora_config.PRESETS, prog="t", description="", default_preset="smoke")[0]
    assert xtr.optim.total_steps == 7
    # a preset that states train.steps gets the schedule of that length, while a
    # config file keeps what it holds (a run's config.json has both, as they were run)
    presets = {"p": attrs.evolve(xtr_lora_config.PRESETS["smoke"], train=attrs.evolve(xtr_lora_config.PRESETS["smoke"].train, steps=11))}
    assert parse_args([], presets, prog="t", description="", default_preset="p")[0].optim.total_steps == 11
    assert parse_args([], xtr_lora_config.PRESETS, prog="t", description="", default_preset="quick")[0].optim.total_steps == \
        xtr_lora_config.PRESETS["quick"].train.steps
    run = tmp_path / "config.json"
    run.write_text(json.dumps(to_dict(attrs.evolve(presets["p"], optim=attrs.evolve(presets["p"].optim,
                                                                                           total_steps=20)))))
    assert parse_args(["--config", str(run)], presets, prog="t", description="", default_preset="p")[0].optim.total_steps == 20


def test_phase_clock_laps_wall_and_cpu():
    import time as _time

    from mlxio.run.phases import PhaseClock

    clock = PhaseClock()
    sum(i * i for i in range(200_000))  # some CPU
    clock.lap("work")
    _time.sleep(0.05)  # wall, hardly any CPU
    clock.lap("wait")
    clock.lap("work")  # a name again: accumulates
    phases = clock.as_dict()
    assert list(phases) == ["work", "wait", "total"]
    assert phases["work"]["cpu_s"] > 0 and phases["wait"]["wall_s"] >= 0.05
    assert phases["wait"]["cpu_s"] < phases["wait"]["wall_s"]
    assert abs(phases["total"]["wall_s"] - phases["work"]["wall_s"] - phases["wait"]["wall_s"]) < 0.02


@pytest.mark.parametrize("stop_after", [None, 3])
def test_train_loop_checkpoints_when_due_and_says_what_comes_next(tmp_path, stop_after):
    """TrainLoop: a record per write, a checkpoint every checkpoint_every steps and at the last
    one, resume_into puts the trainable leaves back, finish says whether to evaluate next."""
    train = xtr_lora_config.TrainConfig(steps=5, checkpoint_every=2, max_consecutive_skips=3)
    params = {"w": mx.zeros((2,)), "lora_a": mx.ones((2,))}
    trainable = lambda path, _leaf=None: path.startswith("lora")  # noqa: E731
    state = {"consecutive_skips": mx.array(0), "skips": mx.array(0)}
    run_id = {"config_hash": "h", "base_model": "m"}
    end = context.last_step(train.steps, stop_after)
    loop = TrainLoop.open(tmp_path, distributed.SINGLE, run_id=run_id, config={}, train=train, start=0, end=end,
                          resumed=False, opt_state=state, project="t", desc="t", report_to=(), headline=("loss",),
                          hint="hint")
    for step_no in range(loop.start, loop.end):
        loop.write({"step": step_no + 1, "loss": 1.0})
        loop.end_step(step_no + 1, state, {"lora_a": mx.full((2,), float(step_no + 1))}, {"position": step_no + 1})
    assert loop.finish(state, loop.end, "t") is (stop_after is None)
    assert loop.stopped_early is (stop_after is not None)
    assert [r["step"] for r in loop.reporter.read()] == list(range(1, end + 1))
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith("step-")) == [
        f"step-{s:08d}" for s in ((2, 4, 5) if stop_after is None else (2, 3))][-3:]
    back, _, found = context.resume_into(True, tmp_path, run_id, params, state, distributed.SINGLE, {}, {},
                                         lambda d: "h", trainable)
    assert found.step == end and found.meta["data_position"] == {"position": end}
    assert back["lora_a"].tolist() == [float(end)] * 2 and back["w"].tolist() == [0.0, 0.0]
