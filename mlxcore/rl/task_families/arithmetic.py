"""Family `arithmetic`: clamp, digits, gcd / lcm."""

from __future__ import annotations

import random

from mlxcore.rl.task_families.base import Signature, Spec, ints, leveled

ARGS = ("n", "num", "number")
PAIRS = (("a", "b"), ("x", "y"), ("m", "n"))


def _clamp(rng: random.Random, level: int) -> Spec:
    lo = rng.randint(-10, 5)
    hi = lo + rng.randint(3, 15)
    name = rng.choice(("clamp", "limit", "bound", "clip"))
    if level == 1:
        arg = rng.choice(("x", "n", "value"))
        values = [lo - rng.randint(1, 9), hi + rng.randint(1, 9), rng.randint(lo, hi), lo, hi]
        return Signature.of(arg, "int", values).spec(
            name, "int", f"Return {arg} limited to the range [{lo}, {hi}]: {lo} if {arg} is below "
            f"it, {hi} if above it, else {arg} itself.", f"    return max({lo}, min({hi}, {arg}))\n")
    if level == 2:
        cases = tuple((rng.randint(-20, 20), a, a + rng.randint(0, 9))
                      for a in ints(rng, 4, -10, 10)) + ((5, 9, 1), (0, 3, -3))
        return Signature("x: int, lo: int, hi: int", cases).spec(
            name, "int", "Return x limited to the range [lo, hi]. If lo is greater than hi, swap them first.",
            "    if lo > hi:\n        lo, hi = hi, lo\n    return max(lo, min(hi, x))\n", examples=2)
    arg = rng.choice(("nums", "values", "xs"))
    values = [ints(rng, rng.randint(2, 6), lo - 6, hi + 6) for _ in range(5)] + [[]]
    return Signature.of(arg, "list[int]", values).spec(
        f"{name}_all", "tuple[list[int], int]", f"Limit every number of {arg} to the range [{lo}, {hi}]. Return a "
        "tuple of the limited list and how many numbers had to change.",
        f"    out = [max({lo}, min({hi}, x)) for x in {arg}]\n"
        f"    return out, sum(1 for a, b in zip({arg}, out) if a != b)\n", examples=2)


def _digits(rng: random.Random, level: int) -> Spec:
    arg = rng.choice(ARGS)
    what, stem, expr = rng.choice((("sum of the decimal digits", "digit_sum", "sum(ds)"),
                                   ("largest decimal digit", "max_digit", "max(ds)"),
                                   ("number of odd decimal digits", "odd_digits",
                                    "sum(1 for d in ds if d % 2)")))
    nums = [rng.randint(0, 10 ** rng.randint(1, 6)) for _ in range(4 + level)] + [0, 7]
    if level == 1:
        return Signature.of(arg, "int", nums).spec(
            stem, "int", f"Return the {what} of {arg} (a non-negative integer).",
            f"    ds = [int(c) for c in str({arg})]\n    return {expr}\n")
    if level == 2:
        nums = [x * rng.choice((1, -1)) for x in nums] + [-5]
        return Signature.of(arg, "int", nums).spec(
            stem, "int", f"Return the {what} of {arg}; a negative {arg} has the same digits as its absolute value.",
            f"    ds = [int(c) for c in str(abs({arg}))]\n    return {expr}\n", examples=2)
    return Signature.of(arg, "int", nums).spec(
        rng.choice(("digital_root", "repeated_digit_sum", "digit_root")), "int",
        f"Sum the decimal digits of {arg} (a non-negative integer), then the digits of "
        "that sum, and so on until one digit is left; return that digit.",
        f"    while {arg} >= 10:\n        {arg} = sum(int(c) for c in str({arg}))\n    return {arg}\n", examples=2)


def _gcd_like(rng: random.Random, level: int) -> Spec:
    a, b = rng.choice(PAIRS)
    pairs = [(rng.randint(1, 12) * g, rng.randint(1, 12) * g)
             for g in (rng.randint(1, 9) for _ in range(4 + level))] + [(7, 1), (6, 6)]
    task = Signature(f"{a}: int, {b}: int", tuple(pairs))
    if level == 1:
        return task.spec(rng.choice(("gcd", "greatest_common_divisor", "common_divisor")), "int",
                         f"Return the greatest common divisor of the positive integers {a} and {b}.",
                         f"    while {b}:\n        {a}, {b} = {b}, {a} % {b}\n    return {a}\n")
    if level == 2:
        return task.spec(rng.choice(("lcm", "least_common_multiple", "common_multiple")), "int",
                         f"Return the least common multiple of the positive integers {a} and {b}.",
                         f"    x, y = {a}, {b}\n    while y:\n        x, y = y, x % y\n    return {a} * {b} // x\n",
                         examples=2)
    arg = rng.choice(("nums", "values", "xs"))
    lists = [[g * rng.randint(1, 9) for _ in range(rng.randint(1, 4))]
             for g in (rng.randint(1, 6) for _ in range(5))] + [[]]
    return Signature.of(arg, "list[int]", lists).spec(
        rng.choice(("gcd_all", "list_gcd", "common_divisor_all")), "int",
        f"Return the greatest common divisor of all the positive integers in {arg}; 0 for an empty list.",
        f"    g = 0\n    for x in {arg}:\n        while x:\n            g, x = x, g % x\n    return g\n", examples=2)


def _larger(rng: random.Random) -> Spec:
    a, b = rng.choice(PAIRS)
    what, fn = rng.choice((("larger", "max"), ("smaller", "min")))
    cases = tuple((rng.randint(-20, 20), rng.randint(-20, 20)) for _ in range(5))
    return Signature(f"{a}: int, {b}: int", cases).spec(
        rng.choice((what, f"{what}_of", f"pick_{what}")), "int", f"Return the {what} of {a} and {b}.",
        f"    return {fn}({a}, {b})\n")


def _count_digits(rng: random.Random) -> Spec:
    arg = rng.choice(ARGS)
    values = [rng.randint(0, 10 ** rng.randint(1, 7)) for _ in range(5)] + [0, 7]
    return Signature.of(arg, "int", values).spec(
        rng.choice(("count_digits", "num_digits", "digit_count")), "int",
        f"Return the number of decimal digits of {arg} (a non-negative integer).", f"    return len(str({arg}))\n")


def _divide(rng: random.Random) -> Spec:
    a, b = rng.choice(PAIRS)
    what, op, name = rng.choice((("remainder", "%", "remainder"),
                                 ("whole-number quotient (rounded down)", "//", "quotient")))
    cases = tuple((rng.randint(0, 100), rng.randint(1, 12)) for _ in range(5))
    return Signature(f"{a}: int, {b}: int", cases).spec(
        name, "int", f"Return the {what} of {a} divided by {b} ({b} is positive).", f"    return {a} {op} {b}\n")


TEMPLATES = {"clamp": leveled(_larger, _clamp), "digits": leveled(_count_digits, _digits),
             "gcd_like": leveled(_divide, _gcd_like)}
