"""Base pass rate of the RLAIF policy on the procedural tasks (mlxcore.rl.tasks), per family and
difficulty level: the figure the task source is tuned by (RL needs groups in which some
samples pass and some fail; the target is ~10-60% on training instances).

The policy is the recipe's own (`benchmarks.rlaif_parts.policy` on the quick preset's config: the
embedded SmolLM2-135M-Instruct unless --model, LoRA at zero = the base model). For each family
and level, `--problems` training instances (spread over the family's templates) each get
`--samples` completions from `generate_group` at the recipe's temperature / top_p, with its
instruction prompt and stop at the end of the first code block; `ExecutionReward` scores them
in the sandbox. Writes dev/results/<machine>/task_difficulty.json.

    nice python -m dev.task_difficulty --problems 6 --samples 4
"""

from __future__ import annotations

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # first: MLX's CPU BLAS is chosen when mlx.core loads (mlxio.runtime)

import argparse
import itertools
import json
import sys
import time

import attrs
import numpy as np

from benchmarks import rlaif_parts
from benchmarks.common import write_result
from dev import RESULTS
from mlxcore.rl import tasks
from mlxio.rl import rollout
from mlxio.rl.evaluation import instruction
from mlxio.rl.rewards import ExecutionReward, FormatReward
from mlxio.sandbox.runner import SandboxLimits
from recipes.rlaif_config import PRESETS


def pick_problems(family: str, level: int, count: int, task_seed: int) -> list:
    """`count` training instances of a family at `level`, round-robin over its templates."""
    names = tasks.template_names(family)
    per = -(-count // len(names))
    groups = [tasks.instances(family, t, level, "train", per, task_seed) for t in names]
    return tasks.interleave(groups)[:count]


def summarise(passed: np.ndarray, formatted: np.ndarray, lengths: np.ndarray) -> dict:
    """Figures of one cell: passed / formatted / lengths are [problems, samples]."""
    per_problem = passed.mean(1)
    return {"problems": int(passed.shape[0]), "samples": int(passed.size),
            "pass_rate": round(float(passed.mean()), 4),
            # groups GRPO learns from: some samples pass and some fail
            "mixed_groups": int(((per_problem > 0) & (per_problem < 1)).sum()),
            "problems_any_pass": int((per_problem > 0).sum()),
            "format_rate": round(float(formatted.mean()), 4),
            "mean_completion_tokens": round(float(lengths.mean()), 1)}


def results(args, argv, cfg, policy, cells: list[dict], templates: dict, done: bool,
            timing: tuple) -> dict:
    """The JSON payload so far (written after every cell, so an interrupted run keeps its
    finished cells; `complete` says whether every cell ran)."""
    load_s, gen_tokens, gen_s, wall_s = timing
    families = list(dict.fromkeys(c["family"] for c in cells))
    return {
        "command": "python -m dev.task_difficulty " + " ".join(argv if argv is not None else sys.argv[1:]),
        "complete": done,
        "model": str(policy.source or cfg.model), "temperature": cfg.temperature, "top_p": cfg.top_p,
        "max_new_tokens": args.max_new_tokens, "stop_at_code_end": cfg.stop_at_code_end,
        "problems_per_cell": args.problems, "samples_per_problem": args.samples,
        "task_seed": args.task_seed, "seed": args.seed, "split": "train",
        "cells": cells,
        # per family and level: pooled over the family's cells of that level
        "per_family": {f: {f"d{c['level']}": c["pass_rate"] for c in cells if c["family"] == f}
                       for f in families},
        "per_template": {k: round(float(np.mean(v)), 4) for k, v in templates.items()},
        "load_s": round(load_s, 1), "gen_tokens_per_s": round(gen_tokens / max(gen_s, 1e-9), 1),
        "wall_s": round(wall_s, 1),
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="policy (default: the embedded SmolLM2-135M)")
    ap.add_argument("--families", default=",".join(tasks.family_names()))
    ap.add_argument("--levels", default="1,2,3")
    ap.add_argument("--problems", type=int, default=6, help="per family and level")
    ap.add_argument("--samples", type=int, default=4, help="completions per problem")
    ap.add_argument("--max-new-tokens", type=int, default=160)
    ap.add_argument("--batch", type=int, default=24, help="sequences decoded together")
    ap.add_argument("--task-seed", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0, help="sampling seed")
    ap.add_argument("--machine", default="cpu")
    ap.add_argument("--name", default="task_difficulty")
    ap.add_argument("--dump", default=None, help="also write every completion to this JSONL")
    args = ap.parse_args(argv)
    base = PRESETS["quick"]
    cfg = attrs.evolve(base, model=args.model)
    families = [f for f in args.families.split(",") if f]
    levels = [int(x) for x in args.levels.split(",") if x]
    t0 = time.perf_counter()
    policy = rlaif_parts.policy(cfg)
    load_s = time.perf_counter() - t0
    limits = SandboxLimits(timeout_s=cfg.sandbox.timeout_s, memory_mb=cfg.sandbox.memory_mb)
    execution, fmt = ExecutionReward(limits, cfg.sandbox.workers), FormatReward()
    per_call = max(1, args.batch // args.samples)
    cells, templates, gen_tokens, gen_s = [], {}, 0, 0.0
    for level, family in itertools.product(levels, families):  # level-major: easy cells first
        probs = pick_problems(family, level, args.problems, args.task_seed)
        texts, lengths = [], []
        for start in range(0, len(probs), per_call):
            chunk = probs[start:start + per_call]
            t1 = time.perf_counter()
            ro = rollout.generate_group(policy, [instruction(p) for p in chunk], args.samples,
                                        cfg.temperature, cfg.top_p, args.max_new_tokens,
                                        seed=args.seed + start, stop_at_code_end=cfg.stop_at_code_end)
            gen_s += time.perf_counter() - t1
            gen_tokens += sum(map(len, ro.completion_tokens))
            texts += ro.texts
            lengths += [len(c) for c in ro.completion_tokens]
        each = [p for p in probs for _ in range(args.samples)]
        shape = (len(probs), args.samples)
        passed = np.array([s == 1.0 for s in execution.score(each, texts)]).reshape(shape)
        formatted = (np.array(fmt.score(each, texts)) == 1.0).reshape(shape)
        cell = {"family": family, "level": level,
                **summarise(passed, formatted, np.array(lengths).reshape(shape))}
        cells.append(cell)
        if args.dump:
            with open(args.dump, "a") as f:
                for p, t, ok in zip(each, texts, passed.reshape(-1), strict=True):
                    f.write(json.dumps({"task_id": p.task_id, "passed": bool(ok), "text": t}) + "\n")
        for p, row in zip(probs, passed, strict=True):
            key = f"{family}/{p.task_id.split('/')[3]}/d{level}"
            templates.setdefault(key, []).append(row.tolist())
        print(f"{family:<11} d{level}  pass {cell['pass_rate']:.3f}  mixed groups "
              f"{cell['mixed_groups']}/{cell['problems']}  format {cell['format_rate']:.2f}  "
              f"tokens {cell['mean_completion_tokens']:.0f}", file=sys.stderr, flush=True)
        write_result(args.name, results(args, argv, cfg, policy, cells, templates, done=False,
                                        timing=(load_s, gen_tokens, gen_s,
                                                time.perf_counter() - t0)), args.machine, RESULTS)
    payload = results(args, argv, cfg, policy, cells, templates, done=True,
                      timing=(load_s, gen_tokens, gen_s, time.perf_counter() - t0))
    path = write_result(args.name, payload, args.machine, RESULTS)
    print(f"wrote {path}", file=sys.stderr)
    return payload


if __name__ == "__main__":
    main()
