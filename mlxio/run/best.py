"""The best checkpoint of a run by a dev metric (higher is better), kept beside the rolling ones.

    keeper = BestKeeper.open(out_dir, "dev_mrr@10", resume_step=resumed.step if resumed else None)
    if keeper.offer(step, dev_metrics, trainable_tree):   # at each dev evaluation
        ...                                              # a new best: written to out_dir/best/
    trainable = keeper.load() or final_trainable          # what the run evaluates and exports

`out_dir/best/checkpoints/step-N/` is an ordinary checkpoint (`mlxio.run.checkpoint`: atomic,
hashed) of the trainable tree only, with the metric in its meta; the newest rolling checkpoints
are pruned, the best one never is. A resumed run keeps its best up to the step it resumes from
(a best written later, by steps the resume discards, is dropped); a fresh run drops any.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import attrs

from mlxcore.train.tree import Tree
from mlxio.atomic import run_dir
from mlxio.errors import CheckpointError
from mlxio.run import checkpoint

BEST = "best"
TREE = "trainable"


@attrs.define
class BestKeeper:
    root: Path  # out_dir / "best"
    metric: str  # the key of the dev metrics that decides (higher is better)
    step: int | None = None  # the best step so far (None: no evaluation yet)
    value: float = -math.inf

    @classmethod
    def open(cls, out_dir: Path, metric: str, resume_step: int | None = None) -> BestKeeper:
        """The keeper of `out_dir`: continuing the best saved at or before `resume_step`, else empty."""
        root = Path(out_dir) / BEST
        keeper = cls(root=root, metric=metric)
        if resume_step is not None and (root / checkpoint.CHECKPOINTS).is_dir():
            try:
                found = checkpoint.load_latest(root)
            except CheckpointError:
                found = None
            meta = found[2] if found is not None else None
            if meta is not None and int(meta["step"]) <= resume_step and meta.get("metric") == metric:
                keeper.step, keeper.value = int(meta["step"]), float(meta["value"])
                return keeper
        shutil.rmtree(root, ignore_errors=True)
        return keeper

    def offer(self, step: int, metrics: dict, trainable: Tree) -> bool:
        """Record the dev `metrics` of `step`; a strictly better (finite) value saves `trainable`
        as the best checkpoint (an equal one keeps the earlier step). Returns whether it did."""
        value = float(metrics[self.metric])
        if not math.isfinite(value) or value <= self.value:
            return False
        run_dir(self.root, "best checkpoint folder")  # a link planted at out_dir/best is refused
        checkpoint.save(self.root, step, {TREE: trainable}, {"metric": self.metric, "value": value,
                                                             "metrics": metrics}, keep_last=1)
        self.step, self.value = step, value
        return True

    def load(self) -> Tree | None:
        """The best trainable tree (None before any evaluation)."""
        if self.step is None:
            return None
        found = checkpoint.load_latest(self.root)
        if found is None or int(found[2]["step"]) != self.step:
            raise CheckpointError(f"{self.root}: the best checkpoint (step {self.step}) is missing")
        return found[1][TREE]
