"""The best checkpoint by a dev metric (mlxio/run/best.py): strictly better steps only, finite
values only, kept across a resume up to the resumed step, dropped by a fresh run."""

from __future__ import annotations

import mlx.core as mx

from mlxcore.train.tree import flatten
from mlxio.run.best import BestKeeper


def tree(value: float) -> dict:
    return {"layer": {"lora_a": mx.full((2, 3), value), "lora_b": mx.zeros((3, 2))}}


def test_keeper_saves_strictly_better_steps(tmp_path):
    keeper = BestKeeper.open(tmp_path, "dev_mrr@10")
    assert keeper.load() is None
    assert keeper.offer(2, {"dev_mrr@10": 0.30}, tree(2.0))
    assert not keeper.offer(4, {"dev_mrr@10": 0.30}, tree(4.0))  # a tie keeps the earlier step
    assert not keeper.offer(6, {"dev_mrr@10": float("nan")}, tree(6.0))
    assert keeper.offer(8, {"dev_mrr@10": 0.31}, tree(8.0))
    assert not keeper.offer(10, {"dev_mrr@10": 0.2}, tree(10.0))
    assert (keeper.step, keeper.value) == (8, 0.31)
    assert float(flatten(keeper.load())["layer.lora_a"][0, 0]) == 8.0


def test_keeper_resumes_only_a_best_before_the_resumed_step(tmp_path):
    keeper = BestKeeper.open(tmp_path, "dev_mrr@10")
    keeper.offer(4, {"dev_mrr@10": 0.5}, tree(4.0))
    again = BestKeeper.open(tmp_path, "dev_mrr@10", resume_step=5)
    assert (again.step, again.value) == (4, 0.5)
    assert float(flatten(again.load())["layer.lora_a"][0, 0]) == 4.0
    later = BestKeeper.open(tmp_path, "dev_mrr@10", resume_step=3)  # written by steps the resume discards
    assert later.step is None and later.load() is None and not (tmp_path / "best").exists()
    keeper = BestKeeper.open(tmp_path, "dev_mrr@10")
    keeper.offer(2, {"dev_mrr@10": 0.1}, tree(2.0))
    assert BestKeeper.open(tmp_path, "dev_mrr@10").step is None  # a fresh run drops an old best
