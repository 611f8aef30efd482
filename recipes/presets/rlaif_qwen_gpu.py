"""RLAIF's learning run on one GPU: 100 steps x 8 prompts x 8 completions of levels 1-2.

    python -m recipes.rlaif_qwen --preset gpu

Why these settings: the run in docs/performance.md (benchmarks/results/h100/rlaif_learning.json),
evaluated with n = 16 on 96 held-out instances, 24 problems of the held-out family and
HumanEval's held-out split.
"""

SETTINGS = {
    "prompts_per_step": 8,  # a GPU decodes more rows a step almost for free (launch-bound)
    "compile": True,  # the compiled steps pay off over 100 steps
    "optim": {"total_steps": 100},
    "train": {"steps": 100, "log_every": 5, "checkpoint_every": 10},
    "data": {"difficulty": [1, 2], "heldout_per_template": 4, "transfer": ["humaneval"]},  # harder tasks, HumanEval too
    "sandbox": {"workers": 8, "reference_timeout": 10.0},  # 8 sandboxes at once; a reference solution gets 10 s
    "eval": {"batch": 4, "workers": 8},
    "shapes": {"update_widths": 2, "min_decode_batch": 16},  # few array shapes: each new one compiles on a GPU
    "out_dir": "runs/rlaif_gpu",
}
