"""Family `dicts`: invert, count by value, merge and sum."""

from __future__ import annotations

import random

from mlxcore.rl.task_families.base import WORDS, Signature, Spec, leveled, str_int_dict

D = "dict[str, int]"


def _invert_dict(rng: random.Random, level: int) -> Spec:
    arg = rng.choice(("d", "mapping", "table"))
    if level == 1:
        dicts = [dict(zip(rng.sample(WORDS, n), rng.sample(range(20), n), strict=True))
                 for n in (rng.randint(1, 4) for _ in range(4))] + [{}]
        return Signature.of(arg, D, dicts).spec(
            rng.choice(("invert", "invert_dict", "swap_keys_values")), "dict[int, str]",
            f"Return a dict that maps each value of {arg} to its key (the values of {arg} are all different).",
            f"    return {{v: k for k, v in {arg}.items()}}\n")
    task = Signature.of(arg, D, [str_int_dict(rng, rng.randint(2, 5), 0, 3) for _ in range(4 + level)] + [{}])
    group = f"    out = {{}}\n    for k, v in {arg}.items():\n        out.setdefault(v, []).append(k)\n"
    if level == 2:
        return task.spec(rng.choice(("group_by_value", "invert_multi", "keys_by_value")), "dict[int, list[str]]",
                         f"Return a dict that maps each value of {arg} to the sorted list of the keys that have it.",
                         group + "    return {v: sorted(ks) for v, ks in out.items()}\n", examples=2)
    return task.spec(rng.choice(("shared_values", "duplicate_values", "repeated_values")), "dict[int, list[str]]",
                     f"Return a dict that maps each value shared by at least two keys of {arg} to the sorted "
                     "list of those keys; values held by one key only are left out.",
                     group + "    return {v: sorted(ks) for v, ks in out.items() if len(ks) >= 2}\n", examples=2)


def _count_values(rng: random.Random, level: int) -> Spec:
    arg = rng.choice(("d", "mapping", "table"))
    task = Signature.of(arg, D, [str_int_dict(rng, rng.randint(1, 6), 0, 3) for _ in range(4 + level)] + [{}])
    if level == 1:
        v = rng.randint(0, 3)
        return task.spec(rng.choice(("count_value", "keys_with_value", "how_many")), "int",
                         f"Return how many keys of {arg} have the value {v}.",
                         f"    return sum(1 for v in {arg}.values() if v == {v})\n")

    def tally(var: str) -> str:  # the loop that counts the keys of each value into `var`
        return f"    {var} = {{}}\n    for v in {arg}.values():\n        {var}[v] = {var}.get(v, 0) + 1\n"

    if level == 2:
        return task.spec(rng.choice(("count_by_value", "value_counts", "tally_values")), "dict[int, int]",
                         f"Return a dict that maps each value of {arg} to the number of keys that have it.",
                         tally("out") + "    return out\n", examples=2)
    return task.spec(rng.choice(("most_common_value", "top_value", "mode_value")), "int | None",
                     f"Return the value held by the most keys of {arg}; on a tie, the smallest such value; "
                     f"None if {arg} is empty.",
                     tally("counts") + "    if not counts:\n        return None\n"
                     "    return min(counts, key=lambda v: (-counts[v], v))\n", examples=2)


def _merge_sum(rng: random.Random, level: int) -> Spec:
    if level == 1:
        arg, c = rng.choice(("d", "mapping", "table")), rng.choice("abclmrst")
        dicts = [str_int_dict(rng, rng.randint(1, 6), -5, 9) for _ in range(4)]
        return Signature.of(arg, D, [*dicts, {c + "x": 1, "z" + c: 2, c: 3}, {}]).spec(
            rng.choice(("sum_prefixed", "total_for_prefix", "sum_starting")), "int",
            f"Return the sum of the values of {arg} whose key starts with {c!r}.",
            f"    return sum(v for k, v in {arg}.items() if k.startswith({c!r}))\n")
    a, b = rng.choice((("a", "b"), ("left", "right"), ("first", "second")))
    pairs = [(str_int_dict(rng, rng.randint(0, 3), -3, 3), str_int_dict(rng, rng.randint(1, 3), -3, 3))
             for _ in range(3 + level)] + [({"x": 2}, {"x": -2, "y": 1})]
    task = Signature(f"{a}: {D}, {b}: {D}", tuple(pairs))
    merge = (f"Merge {a} and {b} into a new dict; a key in both gets the sum of its two values.",
             f"    out = dict({a})\n    for k, v in {b}.items():\n        out[k] = out.get(k, 0) + v\n")
    if level == 2:
        return task.spec(rng.choice(("merge_sum", "add_dicts", "combine_counts")), D,
                         merge[0], merge[1] + "    return out\n", examples=2)
    return task.spec(rng.choice(("merge_nonzero", "add_dicts_nonzero", "net_counts")), D,
                     merge[0] + " Leave out every key whose resulting value is 0.",
                     merge[1] + "    return {k: v for k, v in out.items() if v != 0}\n", examples=2)


def _sorted_keys(rng: random.Random) -> Spec:
    arg = rng.choice(("d", "mapping", "table"))
    values = [str_int_dict(rng, rng.randint(1, 5), 0, 9) for _ in range(4)] + [{}]
    return Signature.of(arg, D, values).spec(rng.choice(("sorted_keys", "keys_in_order", "key_list")), "list[str]",
                                             f"Return the keys of {arg} as a list, sorted alphabetically.",
                                             f"    return sorted({arg})\n")


def _max_value(rng: random.Random) -> Spec:
    arg = rng.choice(("d", "mapping", "table"))
    what, fn = rng.choice((("largest", "max"), ("smallest", "min")))
    values = [str_int_dict(rng, rng.randint(1, 5), -9, 20) for _ in range(5)]
    return Signature.of(arg, D, values).spec(f"{what}_value", "int",
                                             f"Return the {what} value in {arg} ({arg} is not empty).",
                                             f"    return {fn}({arg}.values())\n")


def _sum_values(rng: random.Random) -> Spec:
    arg = rng.choice(("d", "mapping", "table"))
    values = [str_int_dict(rng, rng.randint(1, 5), -5, 20) for _ in range(4)] + [{}]
    return Signature.of(arg, D, values).spec(rng.choice(("sum_values", "total", "value_sum")), "int",
                                             f"Return the sum of the values of {arg} (0 for an empty dict).",
                                             f"    return sum({arg}.values())\n")


TEMPLATES = {"invert_dict": leveled(_sorted_keys, _invert_dict),
             "count_values": leveled(_max_value, _count_values),
             "merge_sum": leveled(_sum_values, _merge_sum)}
