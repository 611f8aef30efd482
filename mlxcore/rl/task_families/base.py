"""Shared pieces of the procedural task templates: the `Spec` a template draws, the
`Signature` its levels share, word and number helpers, and `leveled`, which builds a
template's three difficulty levels."""

from __future__ import annotations

import random
from collections.abc import Callable

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


@attrs.frozen
class Signature:
    """What the levels of one template share: the parameter list and the test inputs (each
    level states only its name, return type, description and solution, `spec`)."""

    params: str
    cases: tuple[tuple, ...]

    @classmethod
    def of(cls, arg: str, type_: str, values) -> Signature:
        """`def f(arg: type_)`, tested on each of `values`."""
        return cls(f"{arg}: {type_}", tuple((v,) for v in values))

    def spec(self, name: str, returns: str, doc: str, body: str, examples: int = 1) -> Spec:
        return Spec(name=name, params=self.params, returns=returns, doc=doc, body=body, cases=self.cases,
                    examples=examples)


def word_line(rng: random.Random, n: int, sep: str = " ", upper: bool = False) -> str:
    words = [rng.choice(WORDS) for _ in range(n)]
    if upper:
        words = [w.capitalize() if rng.random() < 0.5 else w.upper() for w in words]
    return sep.join(words)


def ints(rng: random.Random, n: int, lo: int, hi: int) -> list[int]:
    return [rng.randint(lo, hi) for _ in range(n)]


def quote(chars: str) -> str:
    """'a', 'b' and 'c'."""
    items = [repr(c) for c in chars]
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def str_int_dict(rng: random.Random, n: int, lo: int, hi: int) -> dict[str, int]:
    return {k: rng.randint(lo, hi) for k in rng.sample(WORDS, n)}


def leveled(simple: Callable[[random.Random], Spec],
            graded: Callable[[random.Random, int], Spec]) -> Callable[[random.Random, int], Spec]:
    """A template `(rng, level) -> Spec`: level 1 is `simple(rng)` (one common idiom), level 2
    is `graded(rng, 1)`, level 3 `graded(rng, 2)` or `graded(rng, 3)` (drawn: a twist, more
    edge cases)."""
    def template(rng: random.Random, level: int) -> Spec:
        if level == 1:
            return simple(rng)
        return graded(rng, 1 if level == 2 else rng.choice((2, 3)))
    return template
