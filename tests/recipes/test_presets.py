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
