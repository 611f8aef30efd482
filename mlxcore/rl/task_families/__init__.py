"""The templates of the procedural task source (`mlxcore.rl.tasks`): FAMILIES[family][template]
is a function `(rng, level) -> Spec` that draws one instance - function and argument names,
constants, test inputs - from `rng` (a `random.Random`) at difficulty `level`: 1 is one common
idiom (`s.count('a')`, `max(a, b)`), 2 a short loop or comprehension with a condition, 3 a
twist and more edge cases. The reference solution is source text (`Spec.body`):
`mlxcore.rl.tasks` runs it to compute the tests' expected values and ships it as the problem's
canonical solution. Pure Python, no I/O.
"""

from mlxcore.rl.task_families import arithmetic, dicts, lists, parsing, strings
from mlxcore.rl.task_families.base import Spec

FAMILIES = {"strings": strings.TEMPLATES, "lists": lists.TEMPLATES,
            "arithmetic": arithmetic.TEMPLATES, "dicts": dicts.TEMPLATES,
            "parsing": parsing.TEMPLATES}

__all__ = ["FAMILIES", "Spec"]
