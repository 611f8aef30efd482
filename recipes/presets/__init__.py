"""The recipes' presets as config-as-code, one file per preset (`<recipe>_<preset>.py`: its
command, why, and `SETTINGS`, the settings it changes from the recipe's config defaults, each with
its reason), and the registry: recipe -> presets, default preset, whether it runs data-parallel
under `mlx.launch`, and its guide.

    python -m recipes.<recipe> --preset <preset>
"""

from __future__ import annotations

from typing import NamedTuple

from mlxio.run.config import from_dict
from recipes.presets import (
    rlaif_judge_quick,
    rlaif_judge_smoke,
    rlaif_qwen_full,
    rlaif_qwen_gpu,
    rlaif_qwen_quick,
    rlaif_qwen_smoke,
    xtr_lora_full,
    xtr_lora_multilingual,
    xtr_lora_quick,
    xtr_lora_smoke,
)


class Recipe(NamedTuple):
    presets: dict  # preset name -> its module (SETTINGS, and its command and why in the docstring)
    default: str  # the preset a bare `python -m recipes.<recipe>` runs
    distributed: bool  # runs data-parallel under `mlx.launch` (docs/distributed.md)
    docs: str  # the guide


REGISTRY: dict[str, Recipe] = {
    "xtr_lora": Recipe({"quick": xtr_lora_quick, "full": xtr_lora_full, "multilingual": xtr_lora_multilingual,
                                    "smoke": xtr_lora_smoke},
                       default="quick", distributed=True, docs="docs/retriever.md"),
    "rlaif_qwen": Recipe({"quick": rlaif_qwen_quick, "full": rlaif_qwen_full, "gpu": rlaif_qwen_gpu,
                          "smoke": rlaif_qwen_smoke}, default="quick", distributed=True, docs="docs/rlaif.md"),
    "rlaif_judge": Recipe({"quick": rlaif_judge_quick, "smoke": rlaif_judge_smoke},
                          default="quick", distributed=False, docs="docs/rlaif.md"),
}


def load(recipe: str, cls: type) -> dict:
    """{preset name: config} of `recipe`: each preset's SETTINGS over `cls()`'s defaults, checked
    as a config file is (an unknown or out-of-range setting is a ConfigError naming the preset)."""
    return {name: from_dict(module.SETTINGS, cls, f"preset {recipe}/{name}", base=cls())
            for name, module in REGISTRY[recipe].presets.items()}
