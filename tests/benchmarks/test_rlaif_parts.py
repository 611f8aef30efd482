"""benchmarks/rlaif_parts.py builds the RLAIF recipes' policy and loss as the recipes do: the
same library call with the same arguments as recipes.rlaif_config's `load_policy` / `loss_fn`
and recipes.rlaif_judge_config's `load_policy`, under every preset."""

from __future__ import annotations

import inspect

import pytest

from benchmarks import rlaif_parts
from mlxio.rl import grpo
from recipes import rlaif_config, rlaif_judge_config

SIGNATURES = {name: inspect.signature(getattr(grpo, name)) for name in ("load_model", "make_loss")}


def _arguments(monkeypatch, name: str, build) -> dict:
    """Every argument (defaults filled in) that `build()` passes to `grpo.<name>`, by name."""
    seen = []
    monkeypatch.setattr(grpo, name, lambda *a, **k: seen.append(SIGNATURES[name].bind(*a, **k)))
    build()
    (bound,) = seen
    bound.apply_defaults()
    return dict(bound.arguments)


@pytest.mark.parametrize("preset", sorted(rlaif_config.PRESETS))
def test_policy_and_loss_are_the_rlaif_recipes(preset, monkeypatch):
    cfg, model = rlaif_config.PRESETS[preset], object()
    assert _arguments(monkeypatch, "load_model", lambda: rlaif_parts.policy(cfg)) == \
        _arguments(monkeypatch, "load_model", lambda: rlaif_config.load_policy(cfg))
    assert _arguments(monkeypatch, "make_loss", lambda: rlaif_parts.loss(model, cfg)) == \
        _arguments(monkeypatch, "make_loss", lambda: rlaif_config.loss_fn(model, cfg))


@pytest.mark.parametrize("preset", sorted(rlaif_judge_config.PRESETS))
def test_judge_policy_is_the_judge_recipes(preset, monkeypatch):
    cfg = rlaif_judge_config.PRESETS[preset]
    assert _arguments(monkeypatch, "load_model", lambda: rlaif_parts.judge_policy(cfg)) == \
        _arguments(monkeypatch, "load_model", lambda: rlaif_judge_config.load_policy(cfg))
