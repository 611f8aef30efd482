"""`benchmarks/rlaif_recipe_speed.py` records a recipe run step by step: wall time, generation
tokens/s, the shapes each step meets first (its own spies, agreeing with the recipe's
`new_shapes`) and the summary against issue 33 item 5's targets; it leaves no spy behind."""

from __future__ import annotations

import json

import pytest

from benchmarks import rlaif_recipe_speed
from mlxcore.models import decode_fused
from mlxio.rl import grpo, rollout

pytestmark = pytest.mark.slow


def test_a_planned_smoke_run_meets_no_shape_after_its_warm_up(tmp_path):
    results = tmp_path / "speed.json"
    originals = rollout.generate_group, rollout.prefill_batch, decode_fused.forward, grpo.frozen_logprobs
    common = ["--preset", "smoke", "--rollout_engine", "static", "--train.steps", "2", "--optim.total_steps", "2"]
    rlaif_recipe_speed.main(["--label", "planned", "--out", str(results), "--engine-tokens-per-s", "1e9", "--",
                             *common, "--out_dir", str(tmp_path / "a"), "--shapes.fixed", "true",
                             "--shapes.warm_up", "true", "--shapes.min_decode_batch", "2"])
    rlaif_recipe_speed.main(["--label", "plain", "--out", str(results), "--", *common, "--out_dir", str(tmp_path / "b"),
                             "--shapes.fixed", "false"])
    assert (rollout.generate_group, rollout.prefill_batch, decode_fused.forward, grpo.frozen_logprobs) == originals
    runs = json.loads(results.read_text())["runs"]
    planned, plain = runs["planned"], runs["plain"]
    assert [s["step"] for s in planned["steps"]] == [1, 2]
    assert set(planned["before_step_1"]) == {"prefill", "decode", "frozen", "update"}
    assert [s["new_shapes"] for s in planned["steps"]] == [s["recipe_new_shapes"] for s in planned["steps"]] == [0, 0]
    assert all(s["gen_tokens_per_s"] > 0 and s["decode_row_steps"] <= 8 * s["decode_steps"] for s in planned["steps"])
    summary = planned["summary"]
    assert summary["targets"]["no_new_shape_after_step_1"] and summary["targets"]["gen_within_2x_of_engine"] is False
    assert summary["distinct_shapes"] == summary["shapes_before_step_1"] == sum(planned["before_step_1"].values())
    assert set(summary["decode_ms_per_step_by_batch"]) <= {"8", "4", "2"} and "8" in summary["decode_ms_per_step_by_batch"]
    assert plain["before_step_1"] == {} and plain["steps"][0]["new_shapes"] >= 4  # prefill, decode, frozen, update
    assert plain["summary"]["targets"]["gen_within_2x_of_engine"] is None  # no engine figure for cpu
