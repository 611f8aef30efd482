"""RLAIF end to end in seconds: a tiny random llama, 4 steps.

    python -m recipes.rlaif_qwen --preset smoke

Why these settings: the smallest run through every phase (rollouts, rewards, updates,
checkpoints, evaluation, exports); a random byte-level model never writes a function, so the
printable-ASCII share is the reward that varies and trains.
"""

from mlxio.rl.grpo import TINY_PREFIX

SETTINGS = {
    "model": TINY_PREFIX + "llama",  # random weights, no download
    "lora": {"rank": 4, "alpha": 8.0},
    "optim": {"lr": 1e-2, "total_steps": 4},  # a visible change in 4 steps
    "group_size": 4,
    "max_new_tokens": 12,
    "rewards": {"printable": 1.0},  # the one reward a random model earns in part
    # procedural d1 arithmetic (short prompts), a handful of problems
    "data": {"families": ["arithmetic"], "heldout_families": [], "train_per_template": 3, "heldout_per_template": 1,
             "max_train": 8},
    "eval": {"problems": 2, "samples": 2, "max_new_tokens": 12, "batch": 8},
    "train": {"steps": 4, "checkpoint_every": 2},  # a checkpoint half-way
    "out_dir": "runs/rlaif_smoke",
}
