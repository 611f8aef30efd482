"""benchmarks/rlaif_step.py's agreement check (benchmarks/rlaif_agreement.py) at a tiny size on
the CPU: MLX and PyTorch from one set of weights compute the same step (first gradient norm,
probe loss at fixed advantages and per-tensor gradient cosines agree), and PyTorch steps that
differ (PEFT's own LoRA A, targets shifted by one position, twice the KL weight) are flagged
invalid and kept out of the ratios."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

from benchmarks import rlaif_agreement as ra  # noqa: E402
from benchmarks import rlaif_step as rs  # noqa: E402
from benchmarks.generation import SHAPES, torch_model  # noqa: E402

REAL_LOSS = rs.torch_loss
SHAPE, ROWS, MICRO, PROMPT, COMPLETION = "llama-tiny", 4, 2, 8, 8


def _args(dtype: str) -> argparse.Namespace:
    return argparse.Namespace(check_steps=1, warmup=0, steps=1, dtype=dtype, chunk=8, mlx_cap_gb=5.0)


def _shifted_loss(model, mb, beta, clip_eps, keep=0):
    """A deliberately wrong step: the rows' tokens rotated by one position."""
    return REAL_LOSS(model, {**mb, "tokens": mb["tokens"].roll(1, dims=1)}, beta, clip_eps, keep)


def _runs(dtype: str, monkeypatch, wrong=("other_init", "shifted", "double_kl")) -> tuple[dict, dict]:
    """The benchmark's rows at a tiny shape: MLX, PyTorch eager (full logits and
    `logits_to_keep`) and the `wrong` PyTorch steps (torch_<name>)."""
    tm = torch_model(SHAPE, "cpu", dtype)
    data = rs.batch_arrays(ROWS, PROMPT, COMPLETION, SHAPES[SHAPE]["vocab_size"])
    lora_state = rs.lora_arrays(rs.mlx_policy(SHAPE, tm, dtype)[1])
    args = _args(dtype)
    runs = {"mlx": rs.run_mlx(SHAPE, tm, data, MICRO, args),
            "torch": rs.run_torch(tm, data, MICRO, args, False, lora_state),
            "torch_compile_keep": rs.run_torch(tm, data, MICRO, args, False, lora_state, keep=COMPLETION)}
    rng = np.random.default_rng(1)
    other = {k: (rng.uniform(-0.1, 0.1, v.shape).astype(np.float32) if k.endswith(".lora_a") else v)
             for k, v in lora_state.items()}
    if "other_init" in wrong:
        runs["torch_other_init"] = rs.run_torch(tm, data, MICRO, args, False, other)
    losses = {"shifted": _shifted_loss,
              "double_kl": lambda model, mb, beta, clip_eps, keep=0: REAL_LOSS(model, mb, 2 * beta, clip_eps, keep)}
    for name in set(wrong) & losses.keys():
        with monkeypatch.context() as m:
            m.setattr(rs, "torch_loss", losses[name])
            runs[f"torch_{name}"] = rs.run_torch(tm, data, MICRO, args, False, lora_state)
    grads = {fw: r.pop("probe_grads") for fw, r in runs.items()}
    for r in runs.values():
        r["tokens_per_s"] = 1.0
    return runs, grads


@pytest.fixture(scope="module")
def float32_runs():
    with pytest.MonkeyPatch.context() as mp:
        return _runs("float32", mp)


def test_the_same_step_agrees_and_different_steps_are_flagged(float32_runs):
    runs, grads = float32_runs
    # the probe is well-conditioned: its loss is near -PROBE_ADVANTAGE, far from 0
    assert runs["mlx"]["probe"]["loss"] == pytest.approx(-ra.PROBE_ADVANTAGE, abs=0.3)
    rs.mark_agreement(runs, grads, "float32")
    for fw in ("torch", "torch_compile_keep"):
        same = runs[fw]["agreement"]
        assert same["ok"] and not runs[fw]["invalid"], same
        assert same["rel_diff"]["grad_norm"] < 1e-5 and same["rel_diff"]["probe_loss"] < 1e-5
        assert same["min_param_cosine"] > 0.99999 and same["params_compared"] > 0
        assert same["params_zero"] > 0  # lora_a: zero on both sides while lora_b is 0
    reasons = {fw: runs[fw]["agreement"].get("reason", "") for fw in
               ("torch_other_init", "torch_shifted", "torch_double_kl")}
    assert all(runs[fw]["invalid"] for fw in reasons), reasons
    assert "grad_norm" in reasons["torch_other_init"]
    assert "cosine" in reasons["torch_shifted"] and "probe_loss" in reasons["torch_shifted"]
    assert "probe_loss" in reasons["torch_double_kl"]
    assert sorted(rs.ratios(runs)) == ["mlx_over_torch", "mlx_over_torch_compile_keep"]  # no peak memory on a CPU


def test_bfloat16_same_step_agrees(monkeypatch):
    """The same step in the GPU runs' dtype passes at bfloat16's tolerances."""
    runs, grads = _runs("bfloat16", monkeypatch, wrong=("shifted",))
    rs.mark_agreement(runs, grads, "bfloat16")
    for fw in ("torch", "torch_compile_keep"):
        assert runs[fw]["agreement"]["ok"], runs[fw]["agreement"]
    assert runs["torch_shifted"]["invalid"]


def test_gradient_cosines_edge_cases():
    a = {"x.lora_a": np.zeros((3, 2), np.float32), "x.lora_b": np.ones((2, 3), np.float32)}
    same = ra.gradient_cosines(a, {k: 2 * v for k, v in a.items()})
    assert same["cosine"] == pytest.approx(1.0) and same["params_compared"] == 1 and same["params_zero"] == 1
    one_sided = ra.gradient_cosines(a, {"x.lora_a": np.ones((3, 2), np.float32), "x.lora_b": a["x.lora_b"]})
    assert one_sided["min_param_cosine"] == 0.0 and one_sided["worst_param"] == "x.lora_a"
    with pytest.raises(ValueError, match="different tensors"):
        ra.gradient_cosines(a, {"x.lora_b": a["x.lora_b"]})
    assert not ra.agreement({"check": {"grad_norm": [1.0]}, "probe": {"loss": -1.0}}, {"check": {}}, a, a,
                            "float32")["ok"]
