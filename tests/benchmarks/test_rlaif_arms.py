"""benchmarks.rlaif_arms: every arm's command line is a valid recipe config with the reward it
names, and the report reads the issue's targets off the paired differences."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import rlaif_arms as arms
from benchmarks.rlaif_arms_report import targets
from mlxio.run.flags import parse_args
from recipes.rlaif_config import PRESETS, validate


def _cfg(argv):
    cfg, _ = parse_args(argv, PRESETS, prog="rlaif_qwen", description="", default_preset="quick")
    validate(cfg)
    return cfg


@pytest.mark.parametrize("arm", list(arms.ARMS))
def test_each_arm_is_a_valid_recipe_config(arm, tmp_path):
    shared = ["--preset", "gpu", *arms.EVAL]
    cfg = _cfg(arms.recipe_argv(tmp_path, arm, 2, shared))
    assert cfg.train.seed == 2 and cfg.out_dir == str(tmp_path / f"{arm}_s2") and not cfg.eval.before
    assert cfg.train.steps == 100 and cfg.prompts_per_step == 8 and cfg.group_size == 8  # the gpu preset's run
    assert cfg.data.transfer == ("humaneval_all",) and cfg.eval.samples == 8 and cfg.eval.transfer_samples == 4
    assert (cfg.grpo.entropy_coef, cfg.grpo.entropy_target, cfg.grpo.skip_equal_groups) == (0.01, 0.3, True)
    if arm == "execution":
        assert cfg.rewards.execution == 1.0 and cfg.teacher.judge is None
    else:  # the judge alone: no test runs in training
        assert (cfg.rewards.execution, cfg.rewards.format, cfg.rewards.ai_feedback) == (0.0, 0.0, 1.0)
        want = str(tmp_path / "judge_s2" / "adapters") if arm == "trained_judge" else "untrained"
        assert cfg.teacher.judge == want  # the judge trained with the same seed


def test_rehearsal_flags_override_the_experiments():
    cfg = _cfg(arms.recipe_argv(Path("/w"), "execution", 0, ["--preset", "gpu", *arms.EVAL, *arms.SMOKE]))
    assert cfg.train.steps == 2 and cfg.eval.samples == 2 and cfg.eval.problems == 3


def _run(arm, seed, held, fam_greedy):
    d = {"mean": held[0], "ci95": list(held[1:])}
    g = {"mean": fam_greedy[0], "ci95": list(fam_greedy[1:])}
    return {"arm": arm, "seed": seed, "sets": {"heldout": {"diff": {"sampled": d}},
                                               "heldout_families": {"diff": {"greedy": g}}}}


def test_targets_read_the_paired_intervals():
    runs = ([_run("execution", s, (0.3, 0.2, 0.4), (-0.05, -0.2, 0.1)) for s in range(3)]
            + [_run("trained_judge", s, (0.2, lo, 0.3), (0, 0, 0)) for s, lo in enumerate((0.1, 0.05, -0.01))]
            + [_run("untrained_judge", s, (0.0, -0.1, 0.1), (0, 0, 0)) for s in range(3)])
    t = targets(runs, [0, 1, 2])
    assert t["a_heldout_gain_above_0_every_seed"]["met"] and t["a_family_greedy_not_below_before"]["met"]
    assert t["b_half_of_a_gain"]["met"] and t["b_gain_above_0_on_2_of_3"]["met"] and t["c_clearly_below_b"]["met"]
    runs[0] = _run("execution", 0, (0.3, -0.01, 0.6), (-0.3, -0.5, -0.1))  # one seed's interval reaches 0
    t = targets(runs, [0, 1, 2])
    assert not t["a_heldout_gain_above_0_every_seed"]["met"] and not t["a_family_greedy_not_below_before"]["met"]
    assert targets(runs[:3], [0, 1, 2])["b_half_of_a_gain"]["met"] is None  # not run: said so, not guessed


def test_the_readme_table_shows_every_seed_with_its_interval(tmp_path, monkeypatch):
    import json

    from benchmarks import rlaif_arms_report

    d = {"mean": 0.25, "ci95": [0.125, 0.375]}
    side = {"sampled": 0.2, "greedy": 0.3, "problems": 96}
    runs = [{"arm": arm, "seed": s, "sets": {"heldout": {"diff": {"sampled": d}}} if arm != "untrained_judge" else {}}
            for arm in arms.ARMS for s in (0, 1)]
    (tmp_path / "h200").mkdir()
    (tmp_path / "h200" / "rlaif_arms.json").write_text(json.dumps(
        {"runs": runs, "seeds": [0, 1], "arms": {a: "" for a in arms.ARMS}, "before": {"sets": {"heldout": side}},
         "judges": {"0": {"status": "done", "heldout": {"untrained": {"auc": 0.43}, "trained": {"auc": 0.89}}}},
         "targets": {"b_half_of_a_gain": {"met": False}, "c_clearly_below_b": {"met": None}}}))
    monkeypatch.setattr(rlaif_arms_report, "RESULTS", tmp_path)
    text = "\n".join(rlaif_arms_report.arms_section("h200"))
    assert "| (a) execution reward | s0: +0.250 [+0.125, +0.375]<br>s1: +0.250 [+0.125, +0.375] |" in text
    assert "| (c) untrained judge only | s0: -<br>s1: - |" in text  # not finished: said, not hidden
    assert "s0 0.430 -> 0.890" in text and "b_half_of_a_gain NOT met; c_clearly_below_b not measured" in text
