"""Family `parsing`: key=value pairs, integers in text, times and durations."""

from __future__ import annotations

import random

from mlxio.rl.families.base import KEYS, WORDS, Spec, ints, leveled


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


def _parse_ints(rng: random.Random, level: int) -> Spec:
    arg = rng.choice(("s", "text", "line", "data"))
    name = rng.choice(("parse_ints", "read_numbers", "extract_ints", "to_ints"))
    if level <= 2:
        sep = rng.choice((" ", ",", ";", "|"))
        joiner = sep if level == 1 else sep.strip() + " " if sep != " " else "  "
        lines = [joiner.join(map(str, ints(rng, rng.randint(1, 5), -20 * (level > 1), 99)))
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


def _parse_duration(rng: random.Random, level: int) -> Spec:
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


def _split(rng: random.Random) -> Spec:
    arg, sep = rng.choice(("s", "text", "line", "data")), rng.choice((";", ",", "|", "-"))
    cases = tuple((sep.join(rng.sample(KEYS, rng.randint(1, 4))),) for _ in range(5))
    return Spec(name=rng.choice(("split_items", "pieces", "split_on")),
                params=f"{arg}: str", returns="list[str]", cases=cases,
                doc=f"Split {arg} at every {sep!r} and return the list of the pieces.",
                body=f"    return {arg}.split({sep!r})\n")


def _one_int(rng: random.Random) -> Spec:
    arg = rng.choice(("s", "text", "line", "data"))
    cases = tuple((" " * rng.randint(0, 2) + str(x) + " " * rng.randint(0, 2),)
                  for x in ints(rng, 5, -50, 999))
    return Spec(name=rng.choice(("parse_int", "read_int", "to_int")),
                params=f"{arg}: str", returns="int", cases=cases,
                doc=f"{arg} holds one integer, maybe with spaces around it. Return it as an int.",
                body=f"    return int({arg})\n")


def _clock_part(rng: random.Random) -> Spec:
    arg = rng.choice(("s", "text", "stamp", "t"))
    what, index, name = rng.choice((("hour", 0, "hour_of"), ("minute", 1, "minute_of")))
    cases = tuple((f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}",) for _ in range(5))
    return Spec(name=name, params=f"{arg}: str", returns="int", cases=cases,
                doc=f"{arg} is a time 'HH:MM'. Return the {what} as an int.",
                body=f"    return int({arg}.split(':')[{index}])\n")


TEMPLATES = {"parse_pairs": leveled(_split, _parse_pairs),
             "parse_ints": leveled(_one_int, _parse_ints),
             "parse_duration": leveled(_clock_part, _parse_duration)}
