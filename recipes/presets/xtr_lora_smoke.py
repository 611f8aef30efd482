"""The retriever end to end in a minute on a CPU: mine, train 8 steps, evaluate, export.

    python -m recipes.xtr_lora --preset smoke

Why these settings: the smallest run that still exercises every phase (mining, checkpoints,
evaluation against the baselines, the three exports); its numbers mean nothing.
"""

from mlxio.data import pairs

SETTINGS = {
    "out_dir": "runs/xtr_lora_smoke",
    "data": {
        "source": str(pairs.stdlib_root() / "email"),  # one small stdlib package instead of the whole library
        "packages": [], "heldout_packages": [],  # no PyPI download
        "eval_fraction": 0.3, "eval_queries": 40, "min_eval_queries": 10, "min_eval_candidates": 40,  # enough to rank
        "max_doc_len": 64,  # short documents: fast steps
        "hard_negatives": 0,  # no mining pass
    },
    "optim": {"lr": 1e-3, "weight_decay": 0.01, "warmup_steps": 2, "total_steps": 8},  # a visible change in 8 steps
    "train": {
        "micro_batch": 4, "accum": 2, "steps": 8,
        "log_every": 1, "checkpoint_every": 4,  # a record every step, a checkpoint half-way (resume is tested on it)
        "eval_batch": 16,
    },
}
