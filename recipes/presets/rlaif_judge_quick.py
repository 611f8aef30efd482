"""The verdict judge's default run: the config's defaults.

    python -m recipes.rlaif_judge               # --preset quick is the default

Why these settings: on 2 CPU cores, about 620 rollouts sampled and judged (4 training families x
3 templates x 8 problems x 4 completions; 3 held-out instances per template; 8 problems per
template of the held-out family), then 150 steps x 8 verdict prompts.
"""

SETTINGS: dict = {}
