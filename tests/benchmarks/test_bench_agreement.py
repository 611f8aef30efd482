"""The retriever benchmark's pre-timing agreement check (issue 19 item 1), at a tiny size on the
CPU: MLX and PyTorch eager from one set of weights take the same steps (loss and gradient norm
agree to float32 rounding), and the PyTorch optimizer the benchmark used before (constant lr,
bias-corrected AdamW: ~5x MLX's step) is caught as invalid and left out of the ratios."""

from __future__ import annotations

import argparse

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from benchmarks import retriever as bench  # noqa: E402
from benchmarks import retriever_models as rm  # noqa: E402

BATCH = 4


def _args(**kw) -> argparse.Namespace:
    base = dict(gpu=False, dtype="float32", synthetic=True, query_len=8, doc_len=16, distinct=2,
                encode=False, steps=1, repeats=1, check_steps=4)
    return argparse.Namespace(**{**base, **kw})


def _row(name: str, fw: str, raw: dict) -> dict:
    return {"model": name, "framework": fw, "batch": BATCH, **raw, "step_samples_per_s": 1.0}


@pytest.fixture(scope="module", params=["t5-tiny", "bert-tiny"])
def pair(request):
    name = request.param
    args = _args()
    return name, _row(name, "mlx", bench.run_mlx(name, BATCH, args)), \
        _row(name, "torch", bench.run_torch(name, BATCH, args, compiled=False))


def test_same_steps_agree(pair):
    name, mlx_row, torch_row = pair
    assert mlx_row["check"]["steps"] == torch_row["check"]["steps"] == 4
    assert mlx_row["total_steps"] == torch_row["total_steps"] == 4 + bench.STEP_WARMUP + 1
    result = bench.agreement(mlx_row, torch_row, "float32")
    assert result["ok"], result
    assert result["rel_diff"]["loss"] < 1e-5 and result["rel_diff"]["loss_after"] < 1e-4
    assert result["last_loss_rel_diff"] < 1e-3
    # the loss moved: the optimizer really stepped (lr > 0 after the first warm-up step)
    assert mlx_row["check"]["loss"][0] != mlx_row["check"]["loss"][2]
    rows = [mlx_row, torch_row]
    bench.mark_agreement(rows, "float32")
    assert torch_row["invalid"] is False
    assert [r["peer"] for r in bench.ratios(rows)] == ["torch"]


def test_old_torch_optimizer_is_flagged_invalid(pair, monkeypatch):
    """The cause of the H100 t5-base gap (0.24 vs 1.90): torch ran AdamW at a constant 2e-4 with
    bias correction while MLX's recipe AdamW warms up and has no bias correction."""
    name, mlx_row, _ = pair
    if name != "t5-tiny":
        pytest.skip("one model is enough")
    monkeypatch.setattr(rm, "torch_adamw_groups", lambda cfg, n: [(2e-4, 1e-8)] * n)
    old = _row(name, "torch", bench.run_torch(name, BATCH, _args(), compiled=False))
    result = bench.agreement(mlx_row, old, "float32")
    assert result["rel_diff"]["loss"] < 1e-5  # same weights, same first batch
    assert not result["ok"] and "loss_after" in result["reason"], result
    rows = [mlx_row, old]
    bench.mark_agreement(rows, "float32")
    assert old["invalid"] is True and bench.ratios(rows) == []


def test_torch_adamw_groups_match_mlx_schedule():
    import math

    import mlx.core as mx

    from mlxcore.train.optim import schedule

    cfg = rm.optim_config()
    lr_at = schedule(cfg)
    for n, (lr, eps) in enumerate(rm.torch_adamw_groups(cfg, 40)):
        c1, c2 = 1 - cfg.beta1 ** (n + 1), 1 - cfg.beta2 ** (n + 1)
        assert lr * math.sqrt(c2) / c1 == pytest.approx(lr_at(mx.array(n)).item(), rel=1e-6, abs=1e-12)
        assert eps * math.sqrt(c2) == pytest.approx(cfg.eps)


@pytest.mark.parametrize("name", sorted(rm.TINY))
def test_tiny_models_get_ids_their_vocabulary_has(name):
    """From the command line (no --synthetic), a tiny model must not be fed the mined pairs:
    their ids pass its 512-token vocabulary, which MLX's CPU gather reads out of bounds."""
    cfg = rm.shape_config(name)
    data = bench._data(name, BATCH, argparse.Namespace(distinct=2))
    assert all(data[k].max() < cfg.vocab_size for k in ("query_ids", "doc_ids"))
    assert data["doc_ids"].shape[1] <= getattr(cfg, "max_position_embeddings", rm.DOC_LEN)


def test_rlaif_step_variant_names():
    """Each MLX part in its place is a variant; a misspelt or reordered one is refused, and so is a
    memory cap that is not a positive number of GB."""
    from benchmarks import rlaif_step as rs

    assert rs.variant("mlx_eval_micro_norecompute_cap") == {"qlora": False, "checkpoint": False, "eval_micro": True,
                                                           "recompute": False, "cap": True}
    assert all(map(rs.is_variant, ["mlx", "mlx_qlora_ckpt_eval_micro_norecompute_cap", "torch_compile_keep"]))
    assert not any(map(rs.is_variant, ["mlx_cap_norecompute", "mlx_recompute", "torch_eager"]))
    for argv in (["--frameworks", "mlx_keep"], ["--mlx-cap-gb", "0"], ["--mlx-cap-gb", "nan"]):
        with pytest.raises(SystemExit):
            rs.main(argv)
