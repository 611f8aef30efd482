"""The "before" evaluation of benchmarks.rlaif_arms, once for every arm and seed: the RLAIF
recipe's policy with LoRA off (the base model) on the recipe's evaluation sets, with the
recipe's evaluation settings and seeds, written to out_dir/before.json (resumable per set
through out_dir/eval_before.json, as the recipe's own evaluation).

    python -m benchmarks.rlaif_arms_before --preset gpu [recipe flags] --out_dir DIR
"""

from __future__ import annotations

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # first: MLX's CPU BLAS is chosen when mlx.core loads (mlxio.runtime)

import logging
from pathlib import Path

from benchmarks import rlaif_parts
from mlxcore.rl import policy as pg
from mlxio.atomic import write_json_atomic
from mlxio.rl.evaluation import evaluate_phase, load_problems, validate_data
from mlxio.run.config import to_dict
from mlxio.run.flags import cli, parse_args
from mlxio.sandbox.runner import require_isolation
from mlxio.weights import llm_lora
from recipes.rlaif_config import PRESETS


def main(argv: list[str] | None = None) -> dict:
    cfg, _ = parse_args(argv, PRESETS, prog="python -m benchmarks.rlaif_arms_before",
                        description=__doc__, default_preset="gpu")
    validate_data(cfg.data)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    require_isolation(cfg.sandbox.allow_weak, "--sandbox.allow_weak true")
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _, eval_sets = load_problems(cfg.data)
    policy = rlaif_parts.policy(cfg)
    base = llm_lora.bound_policy(policy, pg.reference_params(llm_lora.lora_tree(policy.model)))  # LoRA off
    # what makes "before" the same for every run: the base model, the data and the evaluation settings
    identity = {"model": cfg.model, "dequantize": cfg.dequantize, "dtype": cfg.memory.compute_dtype,
                "data": to_dict(cfg)["data"], "eval": to_dict(cfg)["eval"], "temperature": cfg.temperature,
                "top_p": cfg.top_p, "stop_at_code_end": cfg.stop_at_code_end}
    sets = evaluate_phase(base, "before", eval_sets=eval_sets, ev=cfg.eval, sandbox=cfg.sandbox,
                          temperature=cfg.temperature, top_p=cfg.top_p, stop_at_code_end=cfg.stop_at_code_end,
                          fns=[], cache=None, out_dir=out, run_id=identity)
    result = {"identity": identity, "sets": sets}
    write_json_atomic(out / "before.json", result)
    return result


if __name__ == "__main__":
    cli(main, "rlaif_arms_before")
