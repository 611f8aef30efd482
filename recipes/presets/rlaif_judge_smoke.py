"""The verdict judge end to end in a few minutes on a CPU.

    python -m recipes.rlaif_judge --preset smoke

Why these settings: 9 problems x 2 completions sampled, 12 steps of LoRA on the last two blocks:
every phase runs (sampling, the frozen blocks' states, training, evaluation, the card).
"""

SETTINGS = {
    "lora": {"rank": 4, "alpha": 8.0, "targets": ["q_proj", "v_proj", "down_proj"]},
    "lora_layers": 2,  # only the last two blocks train: the rest is computed once per prompt
    "optim": {"lr": 2e-3, "warmup_steps": 0, "total_steps": 12},
    "sample": {"families": ["lists"], "train_per_template": 1, "heldout_per_template": 1, "family_per_template": 1,
               "completions": 2, "max_new_tokens": 48, "batch": 6},  # a few short completions
    "train": {"steps": 12, "batch": 4, "accum": 1, "log_every": 1, "checkpoint_every": 4},
    "eval": {"resamples": 200},  # a quick bootstrap
    "out_dir": "runs/rlaif_judge_smoke",
}
