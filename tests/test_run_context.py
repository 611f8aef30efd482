"""The shared run scaffolding (mlxio.run.context) and the one vocabulary of both recipes: old
setting and flag names still work with a warning, an older checkpoint's tree name is read as
the current one, and a refused resume says which settings changed."""

import mlx.core as mx
import pytest

from mlxio.errors import CheckpointError, TrainingDiverged
from mlxio.run import checkpoint, context, distributed
from mlxio.run.config import migrate, parse_args, to_dict
from recipes import rlaif_config, xtr_lora


def test_migrate_renames_and_drops():
    data, notes = migrate({"out": "x", "accumulation": 4, "train": {"stop_after": 3, "steps": 9}},
                          {"out": "out_dir", "accumulation": "accum", "train.stop_after": None})
    assert data == {"out_dir": "x", "accum": 4, "train": {"steps": 9}}
    assert notes == ["out -> out_dir", "accumulation -> accum", "train.stop_after -> (a command-line flag now)"]


def test_old_flag_names_still_work_with_a_warning():
    with pytest.warns(DeprecationWarning, match="--out is deprecated: use --out_dir"):
        cfg, flags = parse_args(["--preset", "smoke", "--out", "somewhere", "--accumulation", "4", "--stop-after", "2"],
                                rlaif_config.PRESETS, prog="t", description="", default_preset="smoke",
                                extra=lambda p: context.add_run_flags(p, more_steps_aliases=("--stop-after",)))
    assert cfg.out_dir == "somewhere" and cfg.accum == 4 and flags.more_steps == 2 and flags.stop_after is None
    with pytest.warns(DeprecationWarning, match="--train.stop_after is deprecated"):
        _, flags = parse_args(["--train.stop_after", "3"], xtr_lora.PRESETS, prog="t", description="",
                              default_preset="smoke", extra=lambda p: context.add_run_flags(p, ("--train.stop_after",)))
    assert flags.stop_after == 3


def test_old_config_file_keys_are_read(tmp_path):
    old = to_dict(rlaif_config.PRESETS["smoke"])
    old["out"], old["accumulation"] = old.pop("out_dir"), old.pop("accum")
    path = tmp_path / "config.json"
    path.write_text(__import__("json").dumps(old))
    with pytest.warns(DeprecationWarning, match="out -> out_dir"):
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


def test_divergence_guard_and_cadence():
    state = {"consecutive_skips": mx.array(3), "skips": mx.array(5)}
    with pytest.raises(TrainingDiverged, match=r"step 9: 3 non-finite steps in a row \(skipped, 5 in all\); stopping. hint"):
        context.check_divergence(state, 3, 9, "hint")
    context.check_divergence(state, 4, 9, "hint")
    assert [s for s in range(1, 11) if context.checkpoint_due(s, 4, 10)] == [4, 8, 10]
    assert context.last_step(10, None) == 10 and context.last_step(10, 4) == 4 and context.last_step(10, 20) == 10
    assert context.last_step(10, None, 6, 2) == 8 and context.last_step(10, 7, 6, 2) == 7


def test_schedule_length_follows_steps_unless_given():
    def parse(argv):
        return parse_args(argv, rlaif_config.PRESETS, prog="t", description="", default_preset="smoke")[0]
    assert parse(["--steps", "30"]).optim.total_steps == 30
    assert parse(["--steps", "30", "--optim.total_steps", "50"]).optim.total_steps == 50
    assert parse([]).optim.total_steps == rlaif_config.PRESETS["smoke"].steps
    xtr = parse_args(["--train.steps", "7"], xtr_lora.PRESETS, prog="t", description="", default_preset="smoke")[0]
    assert xtr.optim.total_steps == 7
