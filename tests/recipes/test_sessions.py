"""One session builder (mlxio.rl.session.build) behind the RLAIF recipe, its worker and the verdict
judge: each entry point, run as a user runs it up to the moment its session exists, holds the
same LoRA tree and optimizer state, bit for bit, for the same model, LoRA, seed and optimizer;
the recipe and the worker also the same run identity."""

from __future__ import annotations

import attrs
import mlx.core as mx
import numpy as np
import pytest

from mlxcore.train.tree import flatten
from mlxio.rl import session
from mlxio.run.config import to_dict
from recipes import rlaif_judge, rlaif_judge_config, rlaif_qwen, rlaif_worker
from recipes.rlaif_config import PRESETS


class Built(Exception):
    """Raised with the session an entry point built: the test stops it there."""


def arrays(tree) -> dict[str, np.ndarray]:
    return {k: np.array(v) for k, v in flatten(tree).items() if isinstance(v, mx.array)}


def assert_bit_identical(a, b, what: str) -> None:
    a, b = arrays(a), arrays(b)
    assert sorted(a) == sorted(b), what
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes(), f"{what}: {k}"


def stopped_at_session(monkeypatch, module, name: str, run) -> session.Session:
    real = getattr(module, name)

    def capture(*args, **kwargs):
        raise Built(real(*args, **kwargs))

    monkeypatch.setattr(module, name, capture)
    with pytest.raises(Built) as built:
        run()
    monkeypatch.setattr(module, name, real)
    return built.value.args[0]


def test_recipe_worker_and_judge_build_the_same_session(monkeypatch, tmp_path):
    # the embedded SmolLM2 (a verdict judge answers in one token: the tiny byte-level model cannot)
    cfg = attrs.evolve(PRESETS["smoke"], model=None, out_dir=str(tmp_path / "recipe"))
    recipe = stopped_at_session(monkeypatch, rlaif_qwen, "open_session", lambda: rlaif_qwen.run(cfg))

    worker = rlaif_worker.make_worker()
    worker.initialize({"preset": "smoke", "config": {**to_dict(cfg), "out_dir": str(tmp_path / "worker")}})
    served = worker.session

    base = rlaif_judge_config.PRESETS["smoke"]
    judge_cfg = attrs.evolve(base, model=cfg.model, lora=cfg.lora, lora_layers=cfg.lora_layers, optim=cfg.optim,
                             train=attrs.evolve(base.train, seed=cfg.train.seed), out_dir=str(tmp_path / "judge"))
    judge = stopped_at_session(monkeypatch, rlaif_judge.session, "build", lambda: rlaif_judge.run(judge_cfg))

    assert recipe.run_id == served.run_id
    for other, name in ((served, "worker"), (judge, "judge")):
        assert_bit_identical(recipe.params, other.params, f"LoRA tree: recipe vs {name}")
        assert_bit_identical(recipe.state, other.state, f"optimizer state: recipe vs {name}")
    assert any(np.abs(v).sum() > 0 for v in arrays(recipe.params).values())  # a real (random) LoRA init
