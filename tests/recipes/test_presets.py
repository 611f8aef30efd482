"""The presets (recipes/presets/): one file per preset, each naming its exact command and changing
only what it says it changes; the registry lists every recipe's presets and its guide."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlxio.run.config import to_dict
from recipes import presets, rlaif_config, rlaif_judge_config, xtr_lora_config

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = {"xtr_lora": xtr_lora_config, "rlaif_qwen": rlaif_config, "rlaif_judge": rlaif_judge_config}
CASES = [(recipe, name) for recipe, entry in presets.REGISTRY.items() for name in entry.presets]


def leaves(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out.update(leaves(v, f"{prefix}{k}.") if isinstance(v, dict) else {prefix + k: v})
    return out


def test_the_registry_is_what_the_recipes_offer():
    assert set(presets.REGISTRY) == set(CONFIGS)
    for recipe, entry in presets.REGISTRY.items():
        assert list(CONFIGS[recipe].PRESETS) == list(entry.presets)
        assert entry.default in entry.presets and (ROOT / entry.docs).is_file()
        for name, module in entry.presets.items():
            assert Path(module.__file__).name == f"{recipe}_{name}.py"


@pytest.mark.parametrize(("recipe", "name"), CASES)
def test_a_preset_names_its_command_and_changes_only_what_it_lists(recipe, name):
    entry = presets.REGISTRY[recipe]
    module = entry.presets[name]
    command = f"python -m recipes.{recipe}"
    assert (f"{command} --preset {name}" in module.__doc__
            or (name == entry.default and f"{command} " in module.__doc__ + " ")), module.__doc__
    config_module = CONFIGS[recipe]
    defaults = leaves(to_dict(config_module.Config()))
    given = leaves(module.SETTINGS)
    loaded = leaves(to_dict(config_module.PRESETS[name]))
    for key, value in given.items():
        assert key in defaults, f"{recipe}/{name}: {key} is no setting"
        norm = list(value) if isinstance(value, tuple) else value
        assert loaded[key] == norm != defaults[key], f"{recipe}/{name}: {key} changes nothing"
    assert {k for k in loaded if loaded[k] != defaults[k]} == set(given)
    config_module.validate(config_module.PRESETS[name])


class ReachedCollective(Exception):
    """A recipe called a cross-rank collective on the two-rank world the test gave it."""


@pytest.mark.parametrize("recipe", sorted(presets.REGISTRY))
def test_the_distributed_flag_is_what_the_recipe_does_on_two_ranks(recipe, tmp_path, monkeypatch):
    """Started as rank 0 of two (what `mlx.launch -n 2` gives), a recipe flagged `distributed`
    goes on to its first collective over the ranks (stopped there: no second rank answers); an
    unflagged one refuses at once with a one-line ConfigError that it runs on one process."""
    import importlib

    import mlx.core as mx

    from mlxio.errors import ConfigError
    from mlxio.run import distributed

    two_ranks = object()  # the group: only this test's collectives see it
    monkeypatch.setattr(distributed, "init", lambda backend="any": distributed.World(group=two_ranks, rank=0, size=2))
    for name in ("all_sum", "all_gather"):
        real = getattr(mx.distributed, name)

        def collective(x, *args, group=None, _real=real, **kwargs):
            if group is two_ranks:
                raise ReachedCollective
            return _real(x, *args, group=group, **kwargs)

        monkeypatch.setattr(mx.distributed, name, collective)
    entry = presets.REGISTRY[recipe]
    preset = "smoke" if "smoke" in entry.presets else entry.default
    main = importlib.import_module(f"recipes.{recipe}").main
    argv = ["--preset", preset, "--out_dir", str(tmp_path / "run")]
    if entry.distributed:
        with pytest.raises(ReachedCollective):
            main(argv)
    else:
        with pytest.raises(ConfigError, match="one process"):
            main(argv)
