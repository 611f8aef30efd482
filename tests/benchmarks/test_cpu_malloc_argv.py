"""benchmarks/cpu_malloc.py: the recipe command it runs is one the recipe accepts (quick, the
steps asked for, the evaluation shrunk), and out-of-range settings are refused."""

from __future__ import annotations

import pytest

from benchmarks import cpu_malloc
from recipes import xtr_lora


def test_recipe_argv_parses(tmp_path):
    cfg, _flags = xtr_lora.parse(cpu_malloc.recipe_argv(3, tmp_path / "run", str(tmp_path / "cache")))
    assert cfg.train.steps == cfg.optim.total_steps == 3 and cfg.train.grad_cache
    assert cfg.data.eval_queries == 60 and cfg.data.max_eval_candidates == 200


@pytest.mark.parametrize("argv", [["--steps", "1"], ["--repeats", "0"], ["--steps", "101"]])
def test_out_of_range_settings_are_refused(argv, capsys):
    with pytest.raises(SystemExit):
        cpu_malloc.main(argv)
    assert "give 2 to 100 steps and 1 to 10 repeats" in capsys.readouterr().err
