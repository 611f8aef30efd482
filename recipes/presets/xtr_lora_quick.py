"""The retriever's default run: one contrastive batch of 256 in-batch pairs a step, 15 steps.

    python -m recipes.xtr_lora                  # --preset quick is the default
    make train                                  # the same, after installing

Why these settings: the levers sweep on held-out packages and files (dev/gpu/xtr_quick_levers.sh,
benchmarks/results/h100/xtr_quick_levers.json; dev/LOG.md) found this the best of its kind.
"""

SETTINGS = {
    "data": {"hard_negatives": 0},  # in-batch negatives only: guarded hard negatives added little at twice the cost
    "lora": {"targets": ["query", "key", "value", "dense"]},  # LoRA on every linear layer, not just q / v
    "optim": {"lr": 4e-4, "warmup_steps": 2, "total_steps": 15},  # a short run takes a larger step
    "loss": {"temperature": 0.03},  # sharper than the default 0.07 over a batch of 256
    "train": {
        "micro_batch": 32, "accum": 8,  # 32 x 8 = 256 pairs: one contrastive batch ...
        "grad_cache": True,  # ... computed micro-batch by micro-batch (GradCache)
        "steps": 15,  # the last step is kept
    },
}
