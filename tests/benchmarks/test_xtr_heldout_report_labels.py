"""The retriever runs table's labels (benchmarks/xtr_heldout_packages_report.py): runs that differ
in a setting their command changed get different rows, and a setting given at its preset's value
adds nothing."""

from __future__ import annotations

from benchmarks import xtr_heldout_packages_report as report

BASE = "python -m recipes.xtr_lora --preset quick --train.seed 0 --train.grad_cache true --optim.lr 4e-4"


def entry(extra: str = "") -> dict:
    return {"preset": "quick", "seed": 0, "train_sources": ["a"] * 7, "steps": 15,
            "contrastive_batch": 256, "grad_cache": True, "hard_negatives": False, "command": f"{BASE} {extra}".strip()}


def test_a_changed_setting_is_named():
    assert report.data_label(entry("--loss.margin_weight 0")) == "7, lr 0.0004, margin weight 0"
    assert report.data_label(entry("--optim.clip_norm 0 --lora.alpha 64")) == "7, lr 0.0004, LoRA alpha 64, clip 0"
    assert report.run_label(entry("--optim.warmup_steps 0")) != report.run_label(entry())


def test_a_setting_at_the_presets_value_adds_nothing():
    assert report.data_label(entry("--optim.warmup_steps 2 --loss.margin_weight 0.1")) == "7, lr 0.0004"
    assert report.data_label(entry()) == "7, lr 0.0004"


def test_a_worded_setting_is_named_as_given():
    assert report.data_label(entry("--train.batch_order random")) == "7, lr 0.0004, batch order random"
    assert report.data_label(entry("--train.batch_order length")) == "7, lr 0.0004"  # quick's own
