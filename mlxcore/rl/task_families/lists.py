"""Family `lists`: filtered sums, running / window operations, filters."""

from __future__ import annotations

import random

from mlxcore.rl.task_families.base import Signature, Spec, ints, leveled

ARGS = ("nums", "values", "xs", "numbers")


def _condition(rng: random.Random, var: str) -> tuple[str, str, str]:
    """(noun phrase, name stem, Python test of `var`) for a number filter."""
    k, t = rng.randint(3, 5), rng.randint(-2, 6)
    return rng.choice((("even numbers", "even", f"{var} % 2 == 0"),
                       ("odd numbers", "odd", f"{var} % 2 == 1"),
                       (f"numbers that are multiples of {k}", f"multiples_of_{k}", f"{var} % {k} == 0"),
                       (f"numbers greater than {t}", "large", f"{var} > {t}"),
                       (f"numbers less than {t}", "small", f"{var} < {t}")))


def _sum_filtered(rng: random.Random, level: int) -> Spec:
    arg = rng.choice(ARGS)
    what, stem, cond = _condition(rng, "x")
    lists = [ints(rng, rng.randint(2, 5 + level), -3 * (level > 1), 12) for _ in range(3 + level)]
    task = Signature.of(arg, "list[int]", [*lists, []])
    if level == 1:
        return task.spec(f"sum_{stem}", "int", f"Return the sum of the {what} in {arg} (0 if there are none).",
                         f"    return sum(x for x in {arg} if {cond})\n")
    if level == 2:
        return task.spec(f"sum_{stem}_squares", "int",
                         f"Return the sum of the squares of the {what} in {arg} (0 if none).",
                         f"    return sum(x * x for x in {arg} if {cond})\n", examples=2)
    return task.spec(f"sum_{stem}_even_positions", "int",
                     f"Return the sum of the {what} of {arg} that stand at even positions (index 0, 2, 4, ...).",
                     f"    return sum(x for i, x in enumerate({arg}) if i % 2 == 0 and {cond})\n", examples=2)


def _running_op(rng: random.Random, level: int) -> Spec:
    arg = rng.choice(ARGS)
    op = rng.choice(("max", "min", "sum"))
    lists = [ints(rng, rng.randint(2, 5 + level), -9 * (level > 1), 9) for _ in range(3 + level)]
    task = Signature.of(arg, "list[int]", [*lists, []])
    step = "out[-1] + x" if op == "sum" else f"{op}(out[-1], x)"

    def running(items: str) -> str:  # the running `op` over `items`
        return f"    out = []\n    for x in {items}:\n        out.append(x if not out else {step})\n    return out\n"

    if level == 1:
        return task.spec(f"running_{op}", "list[int]",
                         f"Return the running {op} of {arg}: element i of the result is the {op} "
                         f"of {arg}[0], ..., {arg}[i].", running(arg))
    if level == 2:
        return task.spec(f"running_abs_{op}", "list[int]",
                         f"Return the running {op} of the absolute values of {arg}: element i is "
                         f"the {op} of abs({arg}[0]), ..., abs({arg}[i]).", running(f"map(abs, {arg})"), examples=2)
    k = rng.randint(2, 3)
    return task.spec(f"window_{op}", "list[int]",
                     f"Return the {op} of every window of {k} consecutive elements of {arg}, in "
                     f"order (element i is the {op} of {arg}[i:i + {k}]); [] if {arg} has fewer "
                     f"than {k} elements.",
                     f"    return [{op}({arg}[i:i + {k}]) for i in range(len({arg}) - {k} + 1)]\n", examples=2)


def _filter_range(rng: random.Random, level: int) -> Spec:
    arg = rng.choice(ARGS)
    lo = rng.randint(-3, 3)
    hi = lo + rng.randint(2, 6)
    lists = [ints(rng, rng.randint(3, 6 + level), lo - 4, hi + 4) for _ in range(3 + level)]
    if level == 3:
        lists.append([lo, lo, hi, hi, lo])
    task = Signature.of(arg, "list[int]", [*lists, []])
    if level == 1:
        return task.spec(rng.choice(("keep_greater", "above", "filter_greater")), "list[int]",
                         f"Return the numbers of {arg} that are greater than {lo}, in their original order.",
                         f"    return [x for x in {arg} if x > {lo}]\n")
    if level == 2:
        return task.spec(rng.choice(("keep_between", "in_range", "filter_range")), "list[int]",
                         f"Return the numbers of {arg} between {lo} and {hi} (both included), in "
                         "their original order.",
                         f"    return [x for x in {arg} if {lo} <= x <= {hi}]\n", examples=2)
    return task.spec(rng.choice(("unique_between", "distinct_in_range", "unique_in_range")), "list[int]",
                     f"Return the numbers of {arg} between {lo} and {hi} (both included), each "
                     "once, in the order of their first occurrence.",
                     f"    out = []\n    for x in {arg}:\n        if {lo} <= x <= {hi} and x not in out:\n"
                     "            out.append(x)\n    return out\n", examples=2)


def _aggregate(rng: random.Random) -> Spec:
    arg = rng.choice(ARGS)
    what, fn, name = rng.choice((("sum", "sum", "total"), ("largest", "max", "largest"),
                                 ("smallest", "min", "smallest")))
    values = [ints(rng, rng.randint(1, 6), -5, 20) for _ in range(5)]
    return Signature.of(arg, "list[int]", values).spec(
        name, "int", f"Return the {what} of the numbers in {arg} ({arg} is not empty).", f"    return {fn}({arg})\n")


def _map_each(rng: random.Random) -> Spec:
    arg, k = rng.choice(ARGS), rng.randint(2, 9)
    what, expr, name = rng.choice(((f"multiplied by {k}", f"x * {k}", f"times_{k}"),
                                   (f"increased by {k}", f"x + {k}", f"add_{k}"),
                                   ("squared", "x * x", "squares")))
    values = [ints(rng, rng.randint(1, 5), -5, 12) for _ in range(4)] + [[]]
    return Signature.of(arg, "list[int]", values).spec(
        name, "list[int]", f"Return a new list with every number of {arg} {what}, in order.",
        f"    return [{expr} for x in {arg}]\n")


def _keep_kind(rng: random.Random) -> Spec:
    arg = rng.choice(ARGS)
    what, cond, name = rng.choice((("even", "x % 2 == 0", "evens"), ("odd", "x % 2 == 1", "odds"),
                                   ("positive", "x > 0", "positives")))
    values = [ints(rng, rng.randint(2, 6), -6, 12) for _ in range(4)] + [[]]
    return Signature.of(arg, "list[int]", values).spec(
        name, "list[int]", f"Return the {what} numbers of {arg}, in their original order.",
        f"    return [x for x in {arg} if {cond}]\n")


TEMPLATES = {"sum_filtered": leveled(_aggregate, _sum_filtered),
             "running_op": leveled(_map_each, _running_op),
             "filter_range": leveled(_keep_kind, _filter_range)}
