"""Family `parsing`: key=value pairs, integers in text, times and durations."""

from __future__ import annotations

import random

from mlxcore.rl.task_families.base import KEYS, WORDS, Signature, Spec, ints, leveled

ARGS = ("s", "text", "line", "data")
CLOCK_ARGS = ("s", "text", "stamp", "t")


def _parse_pairs(rng: random.Random, level: int) -> Spec:
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
    task = Signature.of(arg, "str", lines)
    head = (f"Parse {arg}, a list of items separated by {sep!r}, each item a key and an "
            f"integer value joined by {eq!r}, into a dict from key to int.")
    if level == 1:
        return task.spec(name, "dict[str, int]", head + f" An empty {arg} gives an empty dict.",
                         f"    out = {{}}\n    for item in {arg}.split({sep!r}):\n        if item:\n"
                         f"            k, v = item.split({eq!r})\n            out[k] = int(v)\n"
                         "    return out\n")
    twist = " A key that appears more than once gets the sum of its values." if level == 3 else ""
    return task.spec(name, "dict[str, int]",
                     head + " Spaces around items, keys and values are ignored, and empty items are skipped." + twist,
                     f"    out = {{}}\n    for item in {arg}.split({sep!r}):\n"
                     "        if item.strip():\n"
                     f"            k, v = item.split({eq!r})\n"
                     + ("            out[k.strip()] = out.get(k.strip(), 0) + int(v)\n" if level == 3
                        else "            out[k.strip()] = int(v)\n")
                     + "    return out\n", examples=2)


def _parse_ints(rng: random.Random, level: int) -> Spec:
    arg = rng.choice(ARGS)
    name = rng.choice(("parse_ints", "read_numbers", "extract_ints", "to_ints"))
    if level <= 2:
        sep = rng.choice((" ", ",", ";", "|"))
        joiner = sep if level == 1 else sep.strip() + " " if sep != " " else "  "
        task = Signature.of(arg, "str", [joiner.join(map(str, ints(rng, rng.randint(1, 5), -20 * (level > 1), 99)))
                                         for _ in range(3 + level)] + [""])
        if level == 1:
            return task.spec(name, "list[int]", f"Return the integers written in {arg}, separated by {sep!r}, as a "
                             "list of int; [] for an empty string.",
                             f"    return [int(t) for t in {arg}.split({sep!r}) if t]\n")
        body = (f"    return [int(t) for t in {arg}.split()]\n" if sep == " " else
                f"    return [int(t) for t in {arg}.split({sep!r}) if t.strip()]\n")
        return task.spec(name, "list[int]", f"Return the integers written in {arg}, separated by {sep!r} with "
                         "optional spaces around them (they may be negative), as a list of int; "
                         "[] for an empty string.", body, examples=2)
    lines = [" ".join(f"{rng.choice(WORDS)}{rng.choice(('', '-', ' '))}{rng.randint(0, 300)}"
                      for _ in range(rng.randint(1, 3))) for _ in range(5)] + ["no digits", ""]
    return Signature.of(arg, "str", lines).spec(
        name, "list[int]", f"Return every integer in {arg}, in order, as a list of int: a run of "
        "digits, negative when a '-' comes right before it; any other characters separate numbers.",
        f"    import re\n    return [int(t) for t in re.findall('-?[0-9]+', {arg})]\n", examples=2)


def _parse_duration(rng: random.Random, level: int) -> Spec:
    arg = rng.choice(CLOCK_ARGS)
    if level == 1:
        lines = [f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}" for _ in range(4)] + ["00:00"]
        return Signature.of(arg, "str", lines).spec(
            rng.choice(("to_minutes", "minutes_of_day", "clock_minutes")), "int",
            f"{arg} is a time 'HH:MM'. Return the number of minutes since midnight.",
            f"    h, m = {arg}.split(':')\n    return int(h) * 60 + int(m)\n")
    if level == 2:
        lines = [f"{rng.randint(0, 9)}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}"
                 for _ in range(5)] + ["0:00:00"]
        return Signature.of(arg, "str", lines).spec(
            rng.choice(("to_seconds", "duration_seconds", "total_seconds")), "int",
            f"{arg} is a duration 'H:MM:SS'. Return its length in seconds.",
            f"    h, m, sec = {arg}.split(':')\n    return int(h) * 3600 + int(m) * 60 + int(sec)\n", examples=2)
    lines = [f"{rng.randint(1, 9)}h{rng.randint(1, 59)}m" for _ in range(3)]
    lines += [f"{rng.randint(1, 59)}m", f"{rng.randint(1, 9)}h", ""]
    return Signature.of(arg, "str", lines).spec(
        rng.choice(("parse_duration", "duration_minutes", "to_minutes")), "int",
        f"{arg} is a duration such as '1h30m', '45m' or '2h' (hours and/or minutes, "
        "hours first). Return its length in minutes; 0 for an empty string.",
        f"    total, num = 0, ''\n    for ch in {arg}:\n        if ch.isdigit():\n"
        "            num += ch\n        elif ch == 'h':\n"
        "            total, num = total + int(num) * 60, ''\n        elif ch == 'm':\n"
        "            total, num = total + int(num), ''\n    return total\n", examples=2)


def _split(rng: random.Random) -> Spec:
    arg, sep = rng.choice(ARGS), rng.choice((";", ",", "|", "-"))
    lines = [sep.join(rng.sample(KEYS, rng.randint(1, 4))) for _ in range(5)]
    return Signature.of(arg, "str", lines).spec(
        rng.choice(("split_items", "pieces", "split_on")), "list[str]",
        f"Split {arg} at every {sep!r} and return the list of the pieces.", f"    return {arg}.split({sep!r})\n")


def _one_int(rng: random.Random) -> Spec:
    arg = rng.choice(ARGS)
    lines = [" " * rng.randint(0, 2) + str(x) + " " * rng.randint(0, 2) for x in ints(rng, 5, -50, 999)]
    return Signature.of(arg, "str", lines).spec(
        rng.choice(("parse_int", "read_int", "to_int")), "int",
        f"{arg} holds one integer, maybe with spaces around it. Return it as an int.", f"    return int({arg})\n")


def _clock_part(rng: random.Random) -> Spec:
    arg = rng.choice(CLOCK_ARGS)
    what, index, name = rng.choice((("hour", 0, "hour_of"), ("minute", 1, "minute_of")))
    lines = [f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}" for _ in range(5)]
    return Signature.of(arg, "str", lines).spec(
        name, "int", f"{arg} is a time 'HH:MM'. Return the {what} as an int.",
        f"    return int({arg}.split(':')[{index}])\n")


TEMPLATES = {"parse_pairs": leveled(_split, _parse_pairs),
             "parse_ints": leveled(_one_int, _parse_ints),
             "parse_duration": leveled(_clock_part, _parse_duration)}
