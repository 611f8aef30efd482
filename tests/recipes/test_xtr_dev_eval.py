"""Dev evaluation every N steps and the best checkpoint (`train.dev_eval_every`): the option is
range-checked; a smoke run records the dev curve (metrics.jsonl, eval.json, curves.png), keeps
its best step (mlxio/run/best.py, tests/mlxio/run/test_best.py) and exports exactly those adapters."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mlxcore.train.tree import flatten
from mlxio.run.best import BestKeeper
from recipes import xtr_lora


@pytest.mark.slow
def test_smoke_run_keeps_and_exports_its_best_dev_step(tmp_path):
    pytest.importorskip("safetensors")
    out = tmp_path / "run"
    results = xtr_lora.main(["--preset", "smoke", "--cache_dir", str(tmp_path / "cache"), "--out_dir", str(out),
                             "--train.dev_eval_every", "3"])
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    dev = [r for r in records if "dev_mrr@10" in r]
    assert [r["step"] for r in dev] == [3, 6, 8]  # every 3 steps and the last (8)
    assert all(0.0 <= r["dev_mrr@10"] <= 1.0 and "dev_mrr@10_0" in r for r in dev)
    best = max(dev, key=lambda r: (r["dev_mrr@10"], -r["step"]))  # the first of equal values
    evaluated = json.loads((out / "eval.json").read_text())
    assert evaluated["dev_eval"]["best_step"] == best["step"] == results["run"]["weights_step"]
    assert evaluated["dev_eval"]["curve"] == dev
    assert (out / "curves.png").is_file()
    from safetensors.numpy import load_file

    kept = BestKeeper.open(out, "dev_mrr@10", resume_step=8).load()
    exported = load_file(out / "peft_adapter" / "adapter_model.safetensors")
    for path, leaf in flatten(kept).items():
        layer, name = path.rsplit(".", 1)
        key = f"base_model.model.{layer}.{'lora_A' if name == 'lora_a' else 'lora_B'}.weight"
        np.testing.assert_array_equal(exported[key], np.array(leaf).T)
