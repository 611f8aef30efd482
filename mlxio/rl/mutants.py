"""Pass / fail pairs with known labels: each HumanEval problem's canonical solution and its first
mutant (one operator, constant or return changed) that fails the tests in the sandbox. A judge
that reads code should score the first above the second (`benchmarks.judge_auc`,
`dev.teacher_effect`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from mlxcore.rl.tasks import Problem
from mlxio.rl.rewards import ExecutionReward

# (pattern, replacement), tried in order on the canonical solution; the first that fails wins
MUTATIONS = [
    (r" < ", " > "), (r" > ", " < "), (r"<=", ">"), (r">=", "<"), (r" == ", " != "),
    (r" != ", " == "), (r" \+ ", " - "), (r" - ", " + "), (r"\bTrue\b", "False"),
    (r"\bFalse\b", "True"), (r"\band\b", "or"), (r"\bor\b", "and"), (r"\b1\b", "2"),
    (r"\b0\b", "1"), (r"\[0\]", "[-1]"), (r"\breturn (?!None)", "return None and "),
]


def as_completion(problem: Problem, body: str) -> str:
    """A full-function answer in the format the policy is asked for."""
    return "```python\n" + problem.prompt + body.rstrip("\n") + "\n```"


def build_pairs(problems: Sequence[Problem], execution: ExecutionReward) -> list[dict]:
    """[{task_id, kind, mutation, completion, passed}]: the canonical solution of each problem
    and its first mutant that the sandbox fails (of up to three mutations, then `return None`)."""
    rows = []
    for p in problems:
        variants = []
        for pattern, repl in MUTATIONS:
            mutated = re.sub(pattern, repl, p.canonical_solution, count=1)
            if mutated != p.canonical_solution:
                variants.append((f"{pattern} -> {repl}", mutated))
            if len(variants) == 3:
                break
        variants.append(("return None", "    return None\n"))
        bodies = [("canonical", p.canonical_solution), *variants]
        completions = [as_completion(p, b) for _, b in bodies]
        passed = execution.score([p] * len(completions), completions)
        rows.append({"task_id": p.task_id, "kind": "canonical", "mutation": None,
                     "completion": completions[0], "passed": passed[0] == 1.0})
        for (name, _), comp, ok in zip(bodies[1:], completions[1:], passed[1:], strict=True):
            if ok == 0.0:
                rows.append({"task_id": p.task_id, "kind": "mutant", "mutation": name,
                             "completion": comp, "passed": False})
                break
    return rows
