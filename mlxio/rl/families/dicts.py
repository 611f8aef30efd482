"""Family `dicts`: invert, count by value, merge and sum."""

from __future__ import annotations

import random

from mlxio.rl.families.base import WORDS, Spec, leveled, str_int_dict


def _invert_dict(rng: random.Random, level: int) -> Spec:
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
    dicts = [str_int_dict(rng, rng.randint(2, 5), 0, 3) for _ in range(4 + level)] + [{}]
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


def _count_values(rng: random.Random, level: int) -> Spec:
    arg = rng.choice(("d", "mapping", "table"))
    dicts = [str_int_dict(rng, rng.randint(1, 6), 0, 3) for _ in range(4 + level)] + [{}]
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


def _merge_sum(rng: random.Random, level: int) -> Spec:
    if level == 1:
        arg, c = rng.choice(("d", "mapping", "table")), rng.choice("abclmrst")
        dicts = [str_int_dict(rng, rng.randint(1, 6), -5, 9) for _ in range(4)]
        dicts += [{c + "x": 1, "z" + c: 2, c: 3}, {}]
        return Spec(name=rng.choice(("sum_prefixed", "total_for_prefix", "sum_starting")),
                    params=f"{arg}: dict[str, int]", returns="int",
                    cases=tuple((d,) for d in dicts),
                    doc=f"Return the sum of the values of {arg} whose key starts with {c!r}.",
                    body=f"    return sum(v for k, v in {arg}.items() if k.startswith({c!r}))\n")
    a, b = rng.choice((("a", "b"), ("left", "right"), ("first", "second")))
    pairs = [(str_int_dict(rng, rng.randint(0, 3), -3, 3), str_int_dict(rng, rng.randint(1, 3), -3, 3))
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


def _sorted_keys(rng: random.Random) -> Spec:
    arg = rng.choice(("d", "mapping", "table"))
    cases = tuple((str_int_dict(rng, rng.randint(1, 5), 0, 9),) for _ in range(4)) + (({},),)
    return Spec(name=rng.choice(("sorted_keys", "keys_in_order", "key_list")),
                params=f"{arg}: dict[str, int]", returns="list[str]", cases=cases,
                doc=f"Return the keys of {arg} as a list, sorted alphabetically.",
                body=f"    return sorted({arg})\n")


def _max_value(rng: random.Random) -> Spec:
    arg = rng.choice(("d", "mapping", "table"))
    what, fn = rng.choice((("largest", "max"), ("smallest", "min")))
    cases = tuple((str_int_dict(rng, rng.randint(1, 5), -9, 20),) for _ in range(5))
    return Spec(name=f"{what}_value", params=f"{arg}: dict[str, int]", returns="int", cases=cases,
                doc=f"Return the {what} value in {arg} ({arg} is not empty).",
                body=f"    return {fn}({arg}.values())\n")


def _sum_values(rng: random.Random) -> Spec:
    arg = rng.choice(("d", "mapping", "table"))
    cases = tuple((str_int_dict(rng, rng.randint(1, 5), -5, 20),) for _ in range(4)) + (({},),)
    return Spec(name=rng.choice(("sum_values", "total", "value_sum")),
                params=f"{arg}: dict[str, int]", returns="int", cases=cases,
                doc=f"Return the sum of the values of {arg} (0 for an empty dict).",
                body=f"    return sum({arg}.values())\n")


TEMPLATES = {"invert_dict": leveled(_sorted_keys, _invert_dict),
             "count_values": leveled(_max_value, _count_values),
             "merge_sum": leveled(_sum_values, _merge_sum)}
