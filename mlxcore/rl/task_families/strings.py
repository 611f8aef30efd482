"""Family `strings`: count letters, reverse, replace / shift letters."""

from __future__ import annotations

import random

from mlxcore.rl.task_families.base import Signature, Spec, leveled, quote, word_line

ARGS = ("s", "text", "line", "word")


def _count_chars(rng: random.Random, level: int) -> Spec:
    name = rng.choice(("count_letters", "letter_count", "tally_letters", "num_letters"))
    arg = rng.choice(ARGS)
    chars = "aeiou" if rng.random() < 0.3 else "".join(sorted(rng.sample("bcdlmnprst", rng.randint(2, 3))))
    lines = [word_line(rng, rng.randint(1, 3), upper=level >= 2) for _ in range(3 + level)] + [""]
    task = Signature.of(arg, "str", lines)
    if level == 1:
        return task.spec(name, "int", f"Return how many characters of {arg} are one of the letters {quote(chars)}.",
                         f"    return sum(1 for ch in {arg} if ch in {chars!r})\n")
    if level == 2:
        return task.spec(name, "int", f"Return how many characters of {arg} are one of the letters {quote(chars)}, "
                         "ignoring case (upper-case letters count too).",
                         f"    return sum(1 for ch in {arg}.lower() if ch in {chars!r})\n", examples=2)
    return task.spec(name, "dict[str, int]",
                     f"Return a dict that maps each of the letters {quote(chars)} occurring in {arg} "
                     "(ignoring case) to its number of occurrences; letters that do not occur are left out.",
                     f"    counts = {{}}\n    for ch in {arg}.lower():\n        if ch in {chars!r}:\n"
                     "            counts[ch] = counts.get(ch, 0) + 1\n    return counts\n", examples=2)


def _reverse_words(rng: random.Random, level: int) -> Spec:
    name = rng.choice(("reverse_words", "flip_words", "words_backwards", "reversed_words"))
    arg = rng.choice(("s", "sentence", "text", "line"))
    if level == 1:
        sep, what = rng.choice(((" ", "space"), (",", "comma"), ("-", "dash"), ("/", "slash")))
        lines = [word_line(rng, rng.randint(1, 4), sep) for _ in range(4)]
        return Signature.of(arg, "str", lines).spec(
            name, "str", f"Return {arg} with the order of its {what}-separated ({sep!r}) words reversed.",
            f"    return {sep!r}.join(reversed({arg}.split({sep!r})))\n")
    lines = ["  ".join(word_line(rng, rng.randint(1, 2)) for _ in range(rng.randint(1, 3)))
             for _ in range(3 + level)] + [" " + word_line(rng, 2) + " ", ""]
    task = Signature.of(arg, "str", lines)
    words = "Words are separated by runs of spaces; join them with single spaces"
    if level == 2:
        return task.spec(name, "str", f"Reverse the order of the words of {arg}. {words}, with no leading or "
                         "trailing space.", f"    return ' '.join(reversed({arg}.split()))\n", examples=2)
    return task.spec(name.replace("words", "letters"), "str",
                     f"Reverse the letters of each word of {arg}, keeping the words in order. {words}.",
                     f"    return ' '.join(w[::-1] for w in {arg}.split())\n", examples=2)


def _replace_chars(rng: random.Random, level: int) -> Spec:
    arg = rng.choice(("s", "text", "word", "line"))
    lines = [word_line(rng, rng.randint(1, 3)) for _ in range(3 + level)] + [""]
    if level == 1:
        a, b = rng.sample("aeiourst", 2)
        return Signature.of(arg, "str", lines).spec(
            rng.choice(("replace_letter", "swap_letter", "substitute")), "str",
            f"Return {arg} with every {a!r} replaced by {b!r}.", f"    return {arg}.replace({a!r}, {b!r})\n")
    if level == 2:
        chars = "".join(sorted(rng.sample("aeilnorst", rng.randint(2, 3))))
        return Signature.of(arg, "str", lines).spec(
            rng.choice(("remove_letters", "strip_letters", "drop_letters")), "str",
            f"Return {arg} without any of the letters {quote(chars)}.",
            f"    return ''.join(ch for ch in {arg} if ch not in {chars!r})\n", examples=2)
    k = rng.randint(1, 5)
    return Signature.of(arg, "str", [*lines, word_line(rng, 2) + " xyz"]).spec(
        rng.choice(("shift_letters", "rotate_letters", "caesar")), "str",
        f"Shift every lower-case letter of {arg} {k} places forward in the alphabet, "
        "wrapping around from 'z' to 'a'; other characters stay as they are.",
        f"    out = []\n    for ch in {arg}:\n        if 'a' <= ch <= 'z':\n"
        f"            out.append(chr((ord(ch) - ord('a') + {k}) % 26 + ord('a')))\n"
        "        else:\n            out.append(ch)\n    return ''.join(out)\n", examples=2)


def _count_one(rng: random.Random) -> Spec:
    c, arg = rng.choice("aeiorstln"), rng.choice(ARGS)
    lines = [word_line(rng, rng.randint(1, 3)) for _ in range(5)] + [""]
    return Signature.of(arg, "str", lines).spec(
        rng.choice((f"count_{c}", "count_letter", "letter_count")), "int",
        f"Return how many times the letter {c!r} occurs in {arg}.", f"    return {arg}.count({c!r})\n")


def _reverse(rng: random.Random) -> Spec:
    arg = rng.choice(ARGS)
    lines = [word_line(rng, rng.randint(1, 2)) for _ in range(4)] + [""]
    return Signature.of(arg, "str", lines).spec(
        rng.choice(("reverse", "reverse_string", "backwards")), "str",
        f"Return {arg} reversed (its last character first).", f"    return {arg}[::-1]\n")


def _change_case(rng: random.Random) -> Spec:
    arg = rng.choice(ARGS)
    what, method, name = rng.choice((("upper case", "upper", "to_upper"),
                                     ("lower case", "lower", "to_lower"),
                                     ("the opposite case", "swapcase", "swap_case")))
    lines = [word_line(rng, rng.randint(1, 3), upper=True) for _ in range(4)] + [""]
    return Signature.of(arg, "str", lines).spec(
        name, "str", f"Return {arg} with every letter changed to {what}.", f"    return {arg}.{method}()\n")


TEMPLATES = {"count_chars": leveled(_count_one, _count_chars),
             "reverse_words": leveled(_reverse, _reverse_words),
             "replace_chars": leveled(_change_case, _replace_chars)}
