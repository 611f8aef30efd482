"""RLAIF's default run: the config's defaults, 12 steps x 2 prompts x 8 completions of level-1
procedural tasks on the embedded SmolLM2-135M, for 2 CPU cores.

    python -m recipes.rlaif_qwen                # --preset quick is the default
    make rlaif

Why these settings: what a CPU finishes in a sitting (its time:
benchmarks/results/cpu/rlaif_quick.json); only the evaluation is made cheaper.
"""

SETTINGS = {
    # n = 4 samples per problem (the GPU preset's 16 take too long on a CPU), batches of 8,
    # at most 160 new tokens as in training
    "eval": {"samples": 4, "batch": 8, "max_new_tokens": 160},
}
