"""RLAIF on a real code model: PPO-clipped updates, 200 steps.

    python -m recipes.rlaif_qwen --preset full --model path/to/Qwen2.5-Coder-1.5B-Instruct

Why these settings: a larger model takes a smaller learning rate, more of its attention
adapted, and two clipped updates per batch of rollouts (docs/rlaif.md).
"""

SETTINGS = {
    "lora": {"rank": 16, "alpha": 32.0, "targets": ["q_proj", "k_proj", "v_proj", "o_proj"]},  # all attention projections
    "optim": {"lr": 1e-5, "warmup_steps": 10, "total_steps": 200},  # a 1.5B+ model: a small, warmed-up step
    "prompts_per_step": 4,
    "max_new_tokens": 384,  # room for a whole function with its explanation
    "clip_eps": 0.2, "inner_epochs": 2,  # two updates per batch need PPO's ratio clipping
    "compile": True,  # on a GPU too: the kernels compile once and the run is long
    "eval": {"max_new_tokens": 512},
    "train": {"steps": 200, "accum": 8, "checkpoint_every": 20, "keep_checkpoints": 3},  # 8 micro-batches: memory
    "out_dir": "runs/rlaif_full",
}
