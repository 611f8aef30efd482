"""The templates of the procedural task source (`mlxio.rl.tasks`): FAMILIES[family][template]
is a function `(rng, level) -> Spec` that draws one instance - function and argument names,
constants, the test inputs - from `rng` (a `random.Random`) at difficulty `level` (1-3; higher
levels add a twist and more edge cases). The reference solution is source text (`Spec.body`):
`mlxio.rl.tasks` runs it to compute the expected values of the tests, and ships it as the
problem's canonical solution. Pure Python, no I/O.
"""

from __future__ import annotations

import random

import attrs

WORDS = ("apple", "river", "stone", "cloud", "maple", "tiger", "lemon", "pixel", "ocean", "quiet",
         "brave", "delta", "ember", "frost", "globe", "honey", "ivory", "jolly", "karma", "lunar")
KEYS = ("a", "b", "c", "x", "y", "id", "n", "port", "size", "mode", "top", "key", "w", "h")


@attrs.frozen(kw_only=True)
class Spec:
    """One drawn instance: `def name(params) -> returns`, described by `doc`, solved by `body`
    (indented 4 spaces); `cases` are argument tuples for the tests, the first `examples` of
    them shown in the docstring."""

    name: str
    params: str
    returns: str
    doc: str
    body: str
    cases: tuple[tuple, ...]
    examples: int = 1


def _word_line(rng: random.Random, n: int, sep: str = " ", upper: bool = False) -> str:
    words = [rng.choice(WORDS) for _ in range(n)]
    if upper:
        words = [w.capitalize() if rng.random() < 0.5 else w.upper() for w in words]
    return sep.join(words)


def _ints(rng: random.Random, n: int, lo: int, hi: int) -> list[int]:
    return [rng.randint(lo, hi) for _ in range(n)]


def _quote(chars: str) -> str:
    """'a', 'b' and 'c'."""
    items = [repr(c) for c in chars]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


# ---------------------------------------------------------------- strings

def count_chars(rng: random.Random, level: int) -> Spec:
    name = rng.choice(("count_letters", "letter_count", "tally_letters", "num_letters"))
    arg = rng.choice(("s", "text", "line", "word"))
    chars = "aeiou" if rng.random() < 0.3 else "".join(sorted(rng.sample("bcdlmnprst", rng.randint(2, 3))))
    lines = [_word_line(rng, rng.randint(1, 3), upper=level >= 2) for _ in range(3 + level)] + [""]
    cases = tuple((s,) for s in lines)
    if level == 1:
        return Spec(name=name, params=f"{arg}: str", returns="int", cases=cases,
                    doc=f"Return how many characters of {arg} are one of the letters {_quote(chars)}.",
                    body=f"    return sum(1 for ch in {arg} if ch in {chars!r})\n")
    if level == 2:
        return Spec(name=name, params=f"{arg}: str", returns="int", cases=cases, examples=2,
                    doc=f"Return how many characters of {arg} are one of the letters {_quote(chars)}, "
                        "ignoring case (upper-case letters count too).",
                    body=f"    return sum(1 for ch in {arg}.lower() if ch in {chars!r})\n")
    return Spec(name=name, params=f"{arg}: str", returns="dict[str, int]", cases=cases, examples=2,
                doc=f"Return a dict that maps each of the letters {_quote(chars)} occurring in {arg} "
                    "(ignoring case) to its number of occurrences; letters that do not occur are left out.",
                body=f"    counts = {{}}\n    for ch in {arg}.lower():\n        if ch in {chars!r}:\n"
                     "            counts[ch] = counts.get(ch, 0) + 1\n    return counts\n")


def reverse_words(rng: random.Random, level: int) -> Spec:
    name = rng.choice(("reverse_words", "flip_words", "words_backwards", "reversed_words"))
    arg = rng.choice(("s", "sentence", "text", "line"))
    if level == 1:
        sep, what = rng.choice(((" ", "space"), (",", "comma"), ("-", "dash"), ("/", "slash")))
        cases = tuple((_word_line(rng, rng.randint(1, 4), sep),) for _ in range(4))
        return Spec(name=name, params=f"{arg}: str", returns="str", cases=cases,
                    doc=f"Return {arg} with the order of its {what}-separated ({sep!r}) words reversed.",
                    body=f"    return {sep!r}.join(reversed({arg}.split({sep!r})))\n")
    lines = ["  ".join(_word_line(rng, rng.randint(1, 2)) for _ in range(rng.randint(1, 3)))
             for _ in range(3 + level)] + [" " + _word_line(rng, 2) + " ", ""]
    cases = tuple((s,) for s in lines)
    if level == 2:
        return Spec(name=name, params=f"{arg}: str", returns="str", cases=cases, examples=2,
                    doc=f"Reverse the order of the words of {arg}. Words are separated by runs of "
                        "spaces; join them with single spaces, with no leading or trailing space.",
                    body=f"    return ' '.join(reversed({arg}.split()))\n")
    return Spec(name=name.replace("words", "letters"), params=f"{arg}: str", returns="str",
                cases=cases, examples=2,
                doc=f"Reverse the letters of each word of {arg}, keeping the words in order. Words "
                    "are separated by runs of spaces; join them with single spaces.",
                body=f"    return ' '.join(w[::-1] for w in {arg}.split())\n")


def replace_chars(rng: random.Random, level: int) -> Spec:
    arg = rng.choice(("s", "text", "word", "line"))
    lines = [_word_line(rng, rng.randint(1, 3)) for _ in range(3 + level)] + [""]
    cases = tuple((s,) for s in lines)
    if level == 1:
        a, b = rng.sample("aeiourst", 2)
        return Spec(name=rng.choice(("replace_letter", "swap_letter", "substitute")),
                    params=f"{arg}: str", returns="str", cases=cases,
                    doc=f"Return {arg} with every {a!r} replaced by {b!r}.",
                    body=f"    return {arg}.replace({a!r}, {b!r})\n")
    if level == 2:
        chars = "".join(sorted(rng.sample("aeilnorst", rng.randint(2, 3))))
        return Spec(name=rng.choice(("remove_letters", "strip_letters", "drop_letters")),
                    params=f"{arg}: str", returns="str", cases=cases, examples=2,
                    doc=f"Return {arg} without any of the letters {_quote(chars)}.",
                    body=f"    return ''.join(ch for ch in {arg} if ch not in {chars!r})\n")
    k = rng.randint(1, 5)
    cases += ((_word_line(rng, 2) + " xyz",),)
    return Spec(name=rng.choice(("shift_letters", "rotate_letters", "caesar")),
                params=f"{arg}: str", returns="str", cases=cases, examples=2,
                doc=f"Shift every lower-case letter of {arg} {k} places forward in the alphabet, "
                    "wrapping around from 'z' to 'a'; other characters stay as they are.",
                body=f"    out = []\n    for ch in {arg}:\n        if 'a' <= ch <= 'z':\n"
                     f"            out.append(chr((ord(ch) - ord('a') + {k}) % 26 + ord('a')))\n"
                     "        else:\n            out.append(ch)\n    return ''.join(out)\n")


# ---------------------------------------------------------------- lists

def _condition(rng: random.Random, var: str) -> tuple[str, str, str]:
    """(noun phrase, name stem, Python test of `var`) for a number filter."""
    k, t = rng.randint(3, 5), rng.randint(-2, 6)
    return rng.choice((("even numbers", "even", f"{var} % 2 == 0"),
                       ("odd numbers", "odd", f"{var} % 2 == 1"),
                       (f"numbers that are multiples of {k}", f"multiples_of_{k}", f"{var} % {k} == 0"),
                       (f"numbers greater than {t}", "large", f"{var} > {t}"),
                       (f"numbers less than {t}", "small", f"{var} < {t}")))


def sum_filtered(rng: random.Random, level: int) -> Spec:
    arg = rng.choice(("nums", "values", "xs", "numbers"))
    what, stem, cond = _condition(rng, "x")
    lists = [_ints(rng, rng.randint(2, 5 + level), -3 * (level > 1), 12) for _ in range(3 + level)]
    cases = tuple((v,) for v in [*lists, []])
    if level == 1:
        return Spec(name=f"sum_{stem}", params=f"{arg}: list[int]", returns="int", cases=cases,
                    doc=f"Return the sum of the {what} in {arg} (0 if there are none).",
                    body=f"    return sum(x for x in {arg} if {cond})\n")
    if level == 2:
        return Spec(name=f"sum_{stem}_squares", params=f"{arg}: list[int]", returns="int",
                    cases=cases, examples=2,
                    doc=f"Return the sum of the squares of the {what} in {arg} (0 if none).",
                    body=f"    return sum(x * x for x in {arg} if {cond})\n")
    return Spec(name=f"sum_{stem}_even_positions", params=f"{arg}: list[int]", returns="int",
                cases=cases, examples=2,
                doc=f"Return the sum of the {what} of {arg} that stand at even positions "
                    "(index 0, 2, 4, ...).",
                body=f"    return sum(x for i, x in enumerate({arg}) if i % 2 == 0 and {cond})\n")


def running_op(rng: random.Random, level: int) -> Spec:
    arg = rng.choice(("nums", "values", "xs", "numbers"))
    op = rng.choice(("max", "min", "sum"))
    lists = [_ints(rng, rng.randint(2, 5 + level), -9 * (level > 1), 9) for _ in range(3 + level)]
    cases = tuple((v,) for v in [*lists, []])
    step = "out[-1] + x" if op == "sum" else f"{op}(out[-1], x)"
    if level == 1:
        return Spec(name=f"running_{op}", params=f"{arg}: list[int]", returns="list[int]",
                    cases=cases,
                    doc=f"Return the running {op} of {arg}: element i of the result is the {op} "
                        f"of {arg}[0], ..., {arg}[i].",
                    body=f"    out = []\n    for x in {arg}:\n"
                         f"        out.append(x if not out else {step})\n    return out\n")
    if level == 2:
        return Spec(name=f"running_abs_{op}", params=f"{arg}: list[int]", returns="list[int]",
                    cases=cases, examples=2,
                    doc=f"Return the running {op} of the absolute values of {arg}: element i is "
                        f"the {op} of abs({arg}[0]), ..., abs({arg}[i]).",
                    body=f"    out = []\n    for x in map(abs, {arg}):\n"
                         f"        out.append(x if not out else {step})\n    return out\n")
    k = rng.randint(2, 3)
    return Spec(name=f"window_{op}", params=f"{arg}: list[int]", returns="list[int]",
                cases=cases, examples=2,
                doc=f"Return the {op} of every window of {k} consecutive elements of {arg}, in "
                    f"order (element i is the {op} of {arg}[i:i + {k}]); [] if {arg} has fewer "
                    f"than {k} elements.",
                body=f"    return [{op}({arg}[i:i + {k}]) for i in range(len({arg}) - {k} + 1)]\n")


def filter_range(rng: random.Random, level: int) -> Spec:
    arg = rng.choice(("nums", "values", "xs", "numbers"))
    lo = rng.randint(-3, 3)
    hi = lo + rng.randint(2, 6)
    lists = [_ints(rng, rng.randint(3, 6 + level), lo - 4, hi + 4) for _ in range(3 + level)]
    if level == 3:
        lists.append([lo, lo, hi, hi, lo])
    cases = tuple((v,) for v in [*lists, []])
    if level == 1:
        return Spec(name=rng.choice(("keep_greater", "above", "filter_greater")),
                    params=f"{arg}: list[int]", returns="list[int]", cases=cases,
                    doc=f"Return the numbers of {arg} that are greater than {lo}, in their original order.",
                    body=f"    return [x for x in {arg} if x > {lo}]\n")
    if level == 2:
        return Spec(name=rng.choice(("keep_between", "in_range", "filter_range")),
                    params=f"{arg}: list[int]", returns="list[int]", cases=cases, examples=2,
                    doc=f"Return the numbers of {arg} between {lo} and {hi} (both included), in "
                        "their original order.",
                    body=f"    return [x for x in {arg} if {lo} <= x <= {hi}]\n")
    return Spec(name=rng.choice(("unique_between", "distinct_in_range", "unique_in_range")),
                params=f"{arg}: list[int]", returns="list[int]", cases=cases, examples=2,
                doc=f"Return the numbers of {arg} between {lo} and {hi} (both included), each "
                    "once, in the order of their first occurrence.",
                body=f"    out = []\n    for x in {arg}:\n        if {lo} <= x <= {hi} and x not in out:\n"
                     "            out.append(x)\n    return out\n")


# ---------------------------------------------------------------- arithmetic

def clamp(rng: random.Random, level: int) -> Spec:
    lo = rng.randint(-10, 5)
    hi = lo + rng.randint(3, 15)
    name = rng.choice(("clamp", "limit", "bound", "clip"))
    if level == 1:
        arg = rng.choice(("x", "n", "value"))
        cases = ((lo - rng.randint(1, 9),), (hi + rng.randint(1, 9),), (rng.randint(lo, hi),),
                 (lo,), (hi,))
        return Spec(name=name, params=f"{arg}: int", returns="int", cases=cases,
                    doc=f"Return {arg} limited to the range [{lo}, {hi}]: {lo} if {arg} is below "
                        f"it, {hi} if above it, else {arg} itself.",
                    body=f"    return max({lo}, min({hi}, {arg}))\n")
    if level == 2:
        cases = tuple((rng.randint(-20, 20), a, a + rng.randint(0, 9))
                      for a in _ints(rng, 4, -10, 10)) + ((5, 9, 1), (0, 3, -3))
        return Spec(name=name, params="x: int, lo: int, hi: int", returns="int", cases=cases,
                    examples=2,
                    doc="Return x limited to the range [lo, hi]. If lo is greater than hi, swap "
                        "them first.",
                    body="    if lo > hi:\n        lo, hi = hi, lo\n    return max(lo, min(hi, x))\n")
    arg = rng.choice(("nums", "values", "xs"))
    cases = tuple((_ints(rng, rng.randint(2, 6), lo - 6, hi + 6),) for _ in range(5)) + (([],),)
    return Spec(name=f"{name}_all", params=f"{arg}: list[int]", returns="tuple[list[int], int]",
                cases=cases, examples=2,
                doc=f"Limit every number of {arg} to the range [{lo}, {hi}]. Return a tuple of the "
                    "limited list and how many numbers had to change.",
                body=f"    out = [max({lo}, min({hi}, x)) for x in {arg}]\n"
                     f"    return out, sum(1 for a, b in zip({arg}, out) if a != b)\n")


def digits(rng: random.Random, level: int) -> Spec:
    arg = rng.choice(("n", "num", "number"))
    what, stem, expr = rng.choice((("sum of the decimal digits", "digit_sum", "sum(ds)"),
                                   ("largest decimal digit", "max_digit", "max(ds)"),
                                   ("number of odd decimal digits", "odd_digits",
                                    "sum(1 for d in ds if d % 2)")))
    nums = [rng.randint(0, 10 ** rng.randint(1, 6)) for _ in range(4 + level)] + [0, 7]
    if level == 1:
        return Spec(name=stem, params=f"{arg}: int", returns="int", cases=tuple((x,) for x in nums),
                    doc=f"Return the {what} of {arg} (a non-negative integer).",
                    body=f"    ds = [int(c) for c in str({arg})]\n    return {expr}\n")
    if level == 2:
        nums = [x * rng.choice((1, -1)) for x in nums] + [-5]
        return Spec(name=stem, params=f"{arg}: int", returns="int", cases=tuple((x,) for x in nums),
                    examples=2,
                    doc=f"Return the {what} of {arg}; a negative {arg} has "
                        "the same digits as its absolute value.",
                    body=f"    ds = [int(c) for c in str(abs({arg}))]\n    return {expr}\n")
    return Spec(name=rng.choice(("digital_root", "repeated_digit_sum", "digit_root")),
                params=f"{arg}: int", returns="int", cases=tuple((x,) for x in nums), examples=2,
                doc=f"Sum the decimal digits of {arg} (a non-negative integer), then the digits of "
                    "that sum, and so on until one digit is left; return that digit.",
                body=f"    while {arg} >= 10:\n        {arg} = sum(int(c) for c in str({arg}))\n"
                     f"    return {arg}\n")


def gcd_like(rng: random.Random, level: int) -> Spec:
    a, b = rng.choice((("a", "b"), ("x", "y"), ("m", "n")))
    pairs = [(rng.randint(1, 12) * g, rng.randint(1, 12) * g)
             for g in (rng.randint(1, 9) for _ in range(4 + level))] + [(7, 1), (6, 6)]
    if level == 1:
        return Spec(name=rng.choice(("gcd", "greatest_common_divisor", "common_divisor")),
                    params=f"{a}: int, {b}: int", returns="int", cases=tuple(pairs),
                    doc=f"Return the greatest common divisor of the positive integers {a} and {b}.",
                    body=f"    while {b}:\n        {a}, {b} = {b}, {a} % {b}\n    return {a}\n")
    if level == 2:
        return Spec(name=rng.choice(("lcm", "least_common_multiple", "common_multiple")),
                    params=f"{a}: int, {b}: int", returns="int", cases=tuple(pairs), examples=2,
                    doc=f"Return the least common multiple of the positive integers {a} and {b}.",
                    body=f"    x, y = {a}, {b}\n    while y:\n        x, y = y, x % y\n"
                         f"    return {a} * {b} // x\n")
    arg = rng.choice(("nums", "values", "xs"))
    lists = [[g * rng.randint(1, 9) for _ in range(rng.randint(1, 4))]
             for g in (rng.randint(1, 6) for _ in range(5))] + [[]]
    return Spec(name=rng.choice(("gcd_all", "list_gcd", "common_divisor_all")),
                params=f"{arg}: list[int]", returns="int", cases=tuple((v,) for v in lists),
                examples=2,
                doc=f"Return the greatest common divisor of all the positive integers in {arg}; "
                    "0 for an empty list.",
                body=f"    g = 0\n    for x in {arg}:\n        while x:\n            g, x = x, g % x\n"
                     "    return g\n")


# ---------------------------------------------------------------- dicts

def _str_int_dict(rng: random.Random, n: int, lo: int, hi: int) -> dict[str, int]:
    return {k: rng.randint(lo, hi) for k in rng.sample(WORDS, n)}


def invert_dict(rng: random.Random, level: int) -> Spec:
    arg = rng.choice(("d", "mapping", "table"))
    if level == 1:
        dicts = [dict(zip(rng.sample(WORDS, n), rng.sample(range(20), n), strict=True))
                 for n in (rng.randint(1, 4) for _ in range(4))] + [{}]
        return Spec(name=rng.choice(("invert", "invert_dict", "swap_keys_values")),
                    params=f"{arg}: dict[str, int]", returns="dict[int, str]",
                    cases=tuple((d,) for d in dicts),
                    doc=f"Return a dict that maps each value of {arg} to its key (the values of "
                        f"{arg} are all different).",
                    body=f"    return {{v: k for k, v in {arg}.items()}}\n")
    dicts = [_str_int_dict(rng, rng.randint(2, 5), 0, 3) for _ in range(4 + level)] + [{}]
    if level == 2:
        return Spec(name=rng.choice(("group_by_value", "invert_multi", "keys_by_value")),
                    params=f"{arg}: dict[str, int]", returns="dict[int, list[str]]",
                    cases=tuple((d,) for d in dicts), examples=2,
                    doc=f"Return a dict that maps each value of {arg} to the sorted list of the "
                        "keys that have it.",
                    body=f"    out = {{}}\n    for k, v in {arg}.items():\n"
                         "        out.setdefault(v, []).append(k)\n"
                         "    return {v: sorted(ks) for v, ks in out.items()}\n")
    return Spec(name=rng.choice(("shared_values", "duplicate_values", "repeated_values")),
                params=f"{arg}: dict[str, int]", returns="dict[int, list[str]]",
                cases=tuple((d,) for d in dicts), examples=2,
                doc=f"Return a dict that maps each value shared by at least two keys of {arg} to "
                    "the sorted list of those keys; values held by one key only are left out.",
                body=f"    out = {{}}\n    for k, v in {arg}.items():\n"
                     "        out.setdefault(v, []).append(k)\n"
                     "    return {v: sorted(ks) for v, ks in out.items() if len(ks) >= 2}\n")


def count_values(rng: random.Random, level: int) -> Spec:
    arg = rng.choice(("d", "mapping", "table"))
    dicts = [_str_int_dict(rng, rng.randint(1, 6), 0, 3) for _ in range(4 + level)] + [{}]
    cases = tuple((d,) for d in dicts)
    if level == 1:
        v = rng.randint(0, 3)
        return Spec(name=rng.choice(("count_value", "keys_with_value", "how_many")),
                    params=f"{arg}: dict[str, int]", returns="int", cases=cases,
                    doc=f"Return how many keys of {arg} have the value {v}.",
                    body=f"    return sum(1 for v in {arg}.values() if v == {v})\n")
    if level == 2:
        return Spec(name=rng.choice(("count_by_value", "value_counts", "tally_values")),
                    params=f"{arg}: dict[str, int]", returns="dict[int, int]", cases=cases,
                    examples=2,
                    doc=f"Return a dict that maps each value of {arg} to the number of keys that "
                        "have it.",
                    body=f"    out = {{}}\n    for v in {arg}.values():\n"
                         "        out[v] = out.get(v, 0) + 1\n    return out\n")
    return Spec(name=rng.choice(("most_common_value", "top_value", "mode_value")),
                params=f"{arg}: dict[str, int]", returns="int | None", cases=cases, examples=2,
                doc=f"Return the value held by the most keys of {arg}; on a tie, the smallest "
                    f"such value; None if {arg} is empty.",
                body=f"    counts = {{}}\n    for v in {arg}.values():\n"
                     "        counts[v] = counts.get(v, 0) + 1\n"
                     "    if not counts:\n        return None\n"
                     "    return min(counts, key=lambda v: (-counts[v], v))\n")


def merge_sum(rng: random.Random, level: int) -> Spec:
    if level == 1:
        arg, c = rng.choice(("d", "mapping", "table")), rng.choice("abclmrst")
        dicts = [_str_int_dict(rng, rng.randint(1, 6), -5, 9) for _ in range(4)]
        dicts += [{c + "x": 1, "z" + c: 2, c: 3}, {}]
        return Spec(name=rng.choice(("sum_prefixed", "total_for_prefix", "sum_starting")),
                    params=f"{arg}: dict[str, int]", returns="int",
                    cases=tuple((d,) for d in dicts),
                    doc=f"Return the sum of the values of {arg} whose key starts with {c!r}.",
                    body=f"    return sum(v for k, v in {arg}.items() if k.startswith({c!r}))\n")
    a, b = rng.choice((("a", "b"), ("left", "right"), ("first", "second")))
    pairs = [(_str_int_dict(rng, rng.randint(0, 3), -3, 3), _str_int_dict(rng, rng.randint(1, 3), -3, 3))
             for _ in range(3 + level)] + [({"x": 2}, {"x": -2, "y": 1})]
    if level == 2:
        return Spec(name=rng.choice(("merge_sum", "add_dicts", "combine_counts")),
                    params=f"{a}: dict[str, int], {b}: dict[str, int]", returns="dict[str, int]",
                    cases=tuple(pairs), examples=2,
                    doc=f"Merge {a} and {b} into a new dict; a key in both gets the sum of its two "
                        "values.",
                    body=f"    out = dict({a})\n    for k, v in {b}.items():\n"
                         "        out[k] = out.get(k, 0) + v\n    return out\n")
    return Spec(name=rng.choice(("merge_nonzero", "add_dicts_nonzero", "net_counts")),
                params=f"{a}: dict[str, int], {b}: dict[str, int]", returns="dict[str, int]",
                cases=tuple(pairs), examples=2,
                doc=f"Merge {a} and {b} into a new dict; a key in both gets the sum of its two "
                    "values. Leave out every key whose resulting value is 0.",
                body=f"    out = dict({a})\n    for k, v in {b}.items():\n"
                     "        out[k] = out.get(k, 0) + v\n"
                     "    return {k: v for k, v in out.items() if v != 0}\n")


# ---------------------------------------------------------------- parsing

def parse_pairs(rng: random.Random, level: int) -> Spec:
    arg = rng.choice(("s", "text", "spec", "config"))
    sep, eq = rng.choice((";", ",", "&", "|")), rng.choice(("=", ":"))
    name = rng.choice(("parse_pairs", "parse_settings", "parse_kv", "read_pairs"))

    def line(n: int, spaced: bool, repeat: bool) -> str:
        keys = [rng.choice(KEYS) for _ in range(n)] if repeat else rng.sample(KEYS, n)
        pad = (lambda t: " " * rng.randint(0, 1) + t + " " * rng.randint(0, 1)) if spaced else str
        return sep.join(pad(f"{k}{eq}{rng.randint(0, 99)}") for k in keys)

    lines = [line(rng.randint(1, 4), level >= 2, level == 3) for _ in range(3 + level)] + [""]
    if level >= 2:
        lines.append(line(2, True, False) + sep)
    cases = tuple((s,) for s in lines)
    head = (f"Parse {arg}, a list of items separated by {sep!r}, each item a key and an "
            f"integer value joined by {eq!r}, into a dict from key to int.")
    if level == 1:
        return Spec(name=name, params=f"{arg}: str", returns="dict[str, int]", cases=cases,
                    doc=head + f" An empty {arg} gives an empty dict.",
                    body=f"    out = {{}}\n    for item in {arg}.split({sep!r}):\n        if item:\n"
                         f"            k, v = item.split({eq!r})\n            out[k] = int(v)\n"
                         "    return out\n")
    twist = " A key that appears more than once gets the sum of its values." if level == 3 else ""
    return Spec(name=name, params=f"{arg}: str", returns="dict[str, int]", cases=cases,
                examples=2,
                doc=head + " Spaces around items, keys and values are ignored, and empty items "
                           "are skipped." + twist,
                body=f"    out = {{}}\n    for item in {arg}.split({sep!r}):\n"
                     "        if item.strip():\n"
                     f"            k, v = item.split({eq!r})\n"
                     + ("            out[k.strip()] = out.get(k.strip(), 0) + int(v)\n" if level == 3
                        else "            out[k.strip()] = int(v)\n")
                     + "    return out\n")


def parse_ints(rng: random.Random, level: int) -> Spec:
    arg = rng.choice(("s", "text", "line", "data"))
    name = rng.choice(("parse_ints", "read_numbers", "extract_ints", "to_ints"))
    if level <= 2:
        sep = rng.choice((" ", ",", ";", "|"))
        joiner = sep if level == 1 else sep.strip() + " " if sep != " " else "  "
        lines = [joiner.join(map(str, _ints(rng, rng.randint(1, 5), -20 * (level > 1), 99)))
                 for _ in range(3 + level)] + [""]
        if level == 1:
            return Spec(name=name, params=f"{arg}: str", returns="list[int]",
                        cases=tuple((s,) for s in lines),
                        doc=f"Return the integers written in {arg}, separated by {sep!r}, as a "
                            "list of int; [] for an empty string.",
                        body=f"    return [int(t) for t in {arg}.split({sep!r}) if t]\n")
        body = (f"    return [int(t) for t in {arg}.split()]\n" if sep == " " else
                f"    return [int(t) for t in {arg}.split({sep!r}) if t.strip()]\n")
        return Spec(name=name, params=f"{arg}: str", returns="list[int]",
                    cases=tuple((s,) for s in lines), examples=2,
                    doc=f"Return the integers written in {arg}, separated by {sep!r} with "
                        "optional spaces around them (they may be negative), as a list of int; "
                        "[] for an empty string.", body=body)
    lines = [" ".join(f"{rng.choice(WORDS)}{rng.choice(('', '-', ' '))}{rng.randint(0, 300)}"
                      for _ in range(rng.randint(1, 3))) for _ in range(5)] + ["no digits", ""]
    return Spec(name=name, params=f"{arg}: str", returns="list[int]",
                cases=tuple((s,) for s in lines), examples=2,
                doc=f"Return every integer in {arg}, in order, as a list of int: a run of "
                    "digits, negative when a '-' comes right before it; any other characters "
                    "separate numbers.",
                body="    import re\n"
                     f"    return [int(t) for t in re.findall('-?[0-9]+', {arg})]\n")


def parse_duration(rng: random.Random, level: int) -> Spec:
    arg = rng.choice(("s", "text", "stamp", "t"))
    if level == 1:
        lines = [f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}" for _ in range(4)] + ["00:00"]
        return Spec(name=rng.choice(("to_minutes", "minutes_of_day", "clock_minutes")),
                    params=f"{arg}: str", returns="int", cases=tuple((s,) for s in lines),
                    doc=f"{arg} is a time 'HH:MM'. Return the number of minutes since midnight.",
                    body=f"    h, m = {arg}.split(':')\n    return int(h) * 60 + int(m)\n")
    if level == 2:
        lines = [f"{rng.randint(0, 9)}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}"
                 for _ in range(5)] + ["0:00:00"]
        return Spec(name=rng.choice(("to_seconds", "duration_seconds", "total_seconds")),
                    params=f"{arg}: str", returns="int", cases=tuple((s,) for s in lines),
                    examples=2,
                    doc=f"{arg} is a duration 'H:MM:SS'. Return its length in seconds.",
                    body=f"    h, m, sec = {arg}.split(':')\n"
                         "    return int(h) * 3600 + int(m) * 60 + int(sec)\n")
    lines = [f"{rng.randint(1, 9)}h{rng.randint(1, 59)}m" for _ in range(3)]
    lines += [f"{rng.randint(1, 59)}m", f"{rng.randint(1, 9)}h", ""]
    return Spec(name=rng.choice(("parse_duration", "duration_minutes", "to_minutes")),
                params=f"{arg}: str", returns="int", cases=tuple((s,) for s in lines), examples=2,
                doc=f"{arg} is a duration such as '1h30m', '45m' or '2h' (hours and/or minutes, "
                    "hours first). Return its length in minutes; 0 for an empty string.",
                body=f"    total, num = 0, ''\n    for ch in {arg}:\n        if ch.isdigit():\n"
                     "            num += ch\n        elif ch == 'h':\n"
                     "            total, num = total + int(num) * 60, ''\n        elif ch == 'm':\n"
                     "            total, num = total + int(num), ''\n    return total\n")


FAMILIES = {
    "strings": {"count_chars": count_chars, "reverse_words": reverse_words,
                "replace_chars": replace_chars},
    "lists": {"sum_filtered": sum_filtered, "running_op": running_op, "filter_range": filter_range},
    "arithmetic": {"clamp": clamp, "digits": digits, "gcd_like": gcd_like},
    "dicts": {"invert_dict": invert_dict, "count_values": count_values, "merge_sum": merge_sum},
    "parsing": {"parse_pairs": parse_pairs, "parse_ints": parse_ints,
                "parse_duration": parse_duration},
}
