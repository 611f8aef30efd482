"""benchmarks/scaling.py's machinery on this CPU (ring / gloo): MLX ranks and PyTorch DDP ranks
compute the same step with global negatives, so their pre-timing checks agree at 1 and 2
ranks, and 2 ranks of 4 pairs agree with 1 rank of 8 (the same global batch)."""

from __future__ import annotations

import json

import pytest

from benchmarks import scaling


@pytest.mark.slow  # 5 launches of 1-2 ranks: ~2-3 min on 2 busy cores
def test_mlx_and_ddp_agree_on_one_and_two_ranks(tmp_path):
    common = ["--machine", "cpu", "--model", "t5-tiny", "--cpu", "--dtype", "float32", "--steps", "1",
              "--warmup", "0", "--frameworks", "mlx", "torch"]
    two = scaling.main([*common, "--batch", "4", "--gpus", "1", "2", "--out", str(tmp_path / "a.json")])
    one = scaling.main([*common, "--batch", "8", "--gpus", "1", "--frameworks", "mlx",
                        "--out", str(tmp_path / "b.json")])
    runs = {(r["framework"], r["world"]): r for r in two["runs"]}
    assert all("error" not in r for r in runs.values()), [r.get("error") for r in runs.values()]
    for world in (1, 2):
        assert runs[("torch", world)]["agreement"]["ok"], runs[("torch", world)]["agreement"]
    # the same global batch of 8 on 1 rank: the same loss and gradient (global negatives)
    ref = one["runs"][0]["check"]
    got = runs[("mlx", 2)]["check"]
    assert got["loss"] == pytest.approx(ref["loss"], rel=1e-5)
    assert got["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-4)
    saved = json.loads((tmp_path / "a.json").read_text())
    assert set(saved["speedup"]) == {"mlx", "torch"} and "mlx_over_peer" in saved
