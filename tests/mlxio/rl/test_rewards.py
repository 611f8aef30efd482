"""Problems, code extraction, reward functions, the reward cache and reward combination."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mlxcore.rl.tasks import Problem
from mlxio.errors import ConfigError, DataError
from mlxio.rl.problems import extract_code, load_humaneval, load_problems_jsonl
from mlxio.rl.rewards import (
    AIFeedbackReward,
    ExecutionReward,
    FormatReward,
    RewardCache,
    combine_rewards,
)
from mlxio.sandbox import runner
from mlxio.sandbox.runner import SandboxLimits

LIMITS = SandboxLimits(timeout_s=5.0, memory_mb=512)
ADD = Problem(task_id="t/add", prompt='def add(a: int, b: int) -> int:\n    """Sum."""\n',
              entry_point="add", test="def check(candidate):\n    assert candidate(2, 3) == 5\n")


@pytest.fixture(scope="module")
def humaneval():
    return load_humaneval()


# ---------------------------------------------------------------- problems

def test_load_humaneval(humaneval):
    assert len(humaneval) == 164
    assert humaneval[0].task_id == "HumanEval/0"
    assert humaneval[0].entry_point == "has_close_elements"
    assert "def check(candidate)" in humaneval[0].test and humaneval[0].canonical_solution


_TEXT = st.text(st.characters(exclude_characters="\x00"), max_size=30)  # NUL lines are rejected


@given(st.lists(st.tuples(_TEXT, _TEXT), max_size=5, unique_by=lambda t: t[0]))
def test_problems_jsonl_round_trip(tmp_path_factory, rows):
    path = tmp_path_factory.mktemp("p") / "problems.jsonl"
    problems = [Problem(task_id=t, prompt=p, entry_point="f", test="def check(c): pass",
                        canonical_solution=p[::-1]) for t, p in rows]
    path.write_text("".join(json.dumps({**{k: getattr(p, k) for k in
                                          ("task_id", "prompt", "entry_point", "test",
                                           "canonical_solution")}, "extra": 1}) + "\n"
                            for p in problems))
    assert load_problems_jsonl(path) == problems


@pytest.mark.parametrize("line, message", [
    ("not json", ":2: invalid JSON"),
    ('["a"]', ":2: expected a JSON object"),
    ('{"task_id": "b", "prompt": "", "test": ""}', ":2: missing field 'entry_point'"),
    ('{"task_id": "b", "prompt": 3, "entry_point": "f", "test": ""}', ":2: field 'prompt'"),
    ('{"task_id": "b", "prompt": "", "entry_point": "f-g", "test": ""}', "is not a function name"),
    ('{"task_id": "a", "prompt": "", "entry_point": "f", "test": ""}', "'task_id' repeats"),
    ('{"task_id": "b", "prompt": "\\ud800", "entry_point": "f", "test": ""}', ":2: field 'prompt': lone surrogate"),
    ('{"task_id": "b", "prompt": "a\\u0000", "entry_point": "f", "test": ""}', ":2: field 'prompt': contains a NUL"),
    ('{"task_id": "b", "prompt": ' + "[" * 40 + "]" * 40 + ', "entry_point": "f", "test": ""}', ":2: JSON nested deeper"),
])
def test_bad_problem_files_name_file_line_field(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    good = {"task_id": "a", "prompt": "", "entry_point": "f", "test": ""}
    path.write_text(json.dumps(good) + "\n" + line + "\n")
    with pytest.raises(DataError, match=message) as err:
        load_problems_jsonl(path)
    assert "bad.jsonl" in str(err.value)


# ---------------------------------------------------------------- extraction

@pytest.mark.parametrize("completion", [
    "    return a + b\n",  # continues the prompt
    "    return a + b\n\nThis adds the numbers.\n",  # prose after the code
    "Here you go:\n```python\ndef add(a, b):\n    return a + b\n```\nDone.",
    "```python\nimport math\n```\n```py\ndef add(a, b):\n    return a + b\n```",
    "def add(a, b):\n    return a + b\n",  # full function, no fence
    "```python\ndef add(a, b):\n    return a + b\n",  # unclosed fence
])
def test_extract_code_styles_all_run(completion):
    code = extract_code(completion, ADD)
    namespace: dict = {}
    exec(code, namespace)  # trusted strings written above
    assert namespace["add"](2, 3) == 5


def test_extract_code_keeps_prompt_helpers_for_full_functions():
    problem = Problem(task_id="h", prompt="import math\n\ndef helper(x):\n    return x * 2\n\n"
                      "def f(x):\n    '''doc'''\n", entry_point="f", test="")
    code = extract_code("```python\ndef f(x):\n    return helper(math.floor(x))\n```", problem)
    namespace: dict = {}
    exec(code, namespace)
    assert namespace["f"](2.5) == 4


def test_extract_code_with_instruction_prompt():
    problem = Problem(task_id="i", prompt="Write add(a, b) returning the sum.",
                      entry_point="add", test="")
    assert extract_code("```python\ndef add(a, b):\n    return a + b\n```", problem) == (
        "def add(a, b):\n    return a + b\n")


# ---------------------------------------------------------------- reward functions

def test_execution_reward_on_humaneval(humaneval):
    picks = [humaneval[i] for i in (0, 2, 32, 38, 53, 163)]  # 32/38 use prompt helpers
    reward = ExecutionReward(LIMITS, workers=2)
    assert reward.score(picks, [p.canonical_solution for p in picks]) == [1.0] * 6
    assert reward.score(picks, [""] * 6) == [0.0] * 6  # prompt alone returns None
    wrong = ["    return 0\n", "    return None\n", "    return 0.0\n", "    return s\n",
             "    return x - y\n", "    return []\n"]
    assert reward.score(picks, wrong) == [0.0] * 6
    full = ("```python\nfrom typing import List\n\ndef has_close_elements(numbers: List[float], "
            "threshold: float) -> bool:\n    return any(abs(a - b) < threshold for i, a in "
            "enumerate(numbers) for b in numbers[i + 1:])\n```")
    assert reward.score(picks[:1], [full]) == [1.0]


def test_execution_reward_infra_is_missing(monkeypatch):
    monkeypatch.setattr(runner, "launcher_argv", lambda backend, workdir, **kw: ["/nonexistent/bwrap"])
    assert ExecutionReward(LIMITS).score([ADD], ["    return a + b\n"]) == [None]


@pytest.mark.parametrize("completion, expected", [
    ("```python\ndef add(a, b):\n    return a + b\n```", 1.0),
    ("```\ndef add(a, b):\n    return a + b\n```", 1.0),
    ("```python\ndef add(a, b)\n    return a + b\n```", 0.5),  # defines it, does not parse
    ("```python\ndef plus(a, b):\n    return a + b\n```", 0.5),  # parses, wrong name
    ("def add(a, b):\n    return a + b\n", 0.5),  # no fence
    ("```js\nfunction add(a, b) { return a + b }\n```", 0.0),
    ("I cannot help with that.", 0.0),
])
def test_format_reward(completion, expected):
    assert FormatReward().score([ADD], [completion]) == [expected]


class TableJudge:
    """A judge whose answers are given: {completion: score or None}."""

    def __init__(self, table):
        self.table, self.calls, self.lock = table, 0, threading.Lock()

    def config_key(self):
        return "table"

    def judge(self, prompt, completion):
        with self.lock:
            self.calls += 1
        return self.table[completion]


def test_ai_feedback_reward_maps_and_keeps_missing():
    judge = TableJudge({"a": 7.0, "b": None, "c": 10.0, "d": 0.0})
    reward = AIFeedbackReward(judge)
    assert reward.score([ADD] * 4, ["a", "b", "c", "d"]) == [0.7, None, 1.0, 0.0]
    assert reward.config_key() == "aif-v3:table"


# ---------------------------------------------------------------- cache

def test_cache_round_trip_and_counters(tmp_path):
    cache = RewardCache(tmp_path)
    k1, k2 = RewardCache.key("r", "cfg", "p", "c1"), RewardCache.key("r", "cfg", "p", "c2")
    assert k1 != k2 and k1 != RewardCache.key("r", "cfg2", "p", "c1")
    assert RewardCache.key("ab", "c", "", "") != RewardCache.key("a", "bc", "", "")
    assert cache.get(k1) is None and cache.misses == 1
    cache.put(k1, 0.25)
    assert cache.get(k1) == 0.25 and cache.hits == 1
    cache.flush()
    (tmp_path / ".tmp-seg-crashed.jsonl").write_text("half a line")  # a writer that died
    reopened = RewardCache(tmp_path)
    assert reopened.get(k1) == 0.25 and reopened.get(k2) is None and len(reopened) == 1
    with pytest.raises(ValueError):
        cache.put(k2, float("nan"))


def test_cache_corrupt_segment_names_file_line(tmp_path):
    (tmp_path / "seg-1.jsonl").write_text('["k", 1.0]\n{"bad": \n')
    with pytest.raises(DataError, match=r"seg-1.jsonl:2"):
        RewardCache(tmp_path)


def test_cache_compacts_and_survives_concurrent_puts(tmp_path):
    cache = RewardCache(tmp_path)

    def writer(t):
        for i in range(50):
            cache.put(f"{t}-{i}", float(i))
            if i % 10 == 0:
                cache.flush()

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    cache.flush()
    assert len(list(tmp_path.glob("seg-*.jsonl"))) > 4
    compacted = RewardCache(tmp_path, max_segments=4)
    assert len(list(tmp_path.glob("seg-*.jsonl"))) == 1
    assert len(compacted) == 200 and compacted.get("3-49") == 49.0


# ---------------------------------------------------------------- combination

class TableReward:
    """Scores by completion text from a table (None = missing); counts scored items."""

    def __init__(self, name, table):
        self.name, self.table, self.scored = name, table, 0

    def config_key(self):
        return "v1"

    def score(self, problems, completions):
        self.scored += len(completions)
        return [self.table[c] for c in completions]


maybe = st.one_of(st.none(), st.floats(0, 1, width=32))


@given(st.lists(st.tuples(maybe, maybe, maybe), min_size=1, max_size=12),
       st.lists(st.floats(0.05, 5), min_size=3, max_size=3))
def test_combine_renormalises_over_present(rows, weights):
    completions = [f"c{i}" for i in range(len(rows))]
    rewards = [(TableReward(f"r{j}", {c: row[j] for c, row in zip(completions, rows, strict=True)}), w)
               for j, w in enumerate(weights)]
    out = combine_rewards(rewards, [ADD] * len(rows), completions)
    for i, row in enumerate(rows):
        present = [(v, w) for v, w in zip(row, weights, strict=True) if v is not None]
        assert out.missing[i] == (not present)
        for j, v in enumerate(row):
            assert np.isnan(out.per_reward[f"r{j}"][i]) == (v is None)
        if present:
            expected = sum(v * w for v, w in present) / sum(w for _, w in present)
            assert out.total[i] == pytest.approx(expected, rel=1e-5, abs=1e-6)
        else:
            assert np.isnan(out.total[i])
    assert out.total.dtype == np.float32 and out.total.shape == (len(rows),)


def test_combine_dedupes_and_caches(tmp_path):
    table = {"x": 1.0, "y": 0.0, "z": None}
    completions = ["x", "y", "x", "z", "x"]
    first = TableReward("t", table)
    out = combine_rewards([(first, 1.0)], [ADD] * 5, completions, RewardCache(tmp_path))
    assert first.scored == 3  # x, y, z once each
    assert out.cache_misses == 3 and out.cache_hits == 0
    assert out.missing.tolist() == [False, False, False, True, False]
    second = TableReward("t", table)
    again = combine_rewards([(second, 1.0)], [ADD] * 5, completions, RewardCache(tmp_path))
    assert second.scored == 1  # only the missing "z" is tried again
    assert again.cache_hits == 2 and again.cache_misses == 1
    np.testing.assert_array_equal(again.total, out.total)


def test_combine_rejects_bad_weights_and_names():
    r = TableReward("t", {"x": 1.0})
    with pytest.raises(ConfigError, match="weights"):
        combine_rewards([(r, 0.0)], [ADD], ["x"])
    with pytest.raises(ConfigError, match="unique"):
        combine_rewards([(r, 1.0), (r, 1.0)], [ADD], ["x"])
    with pytest.raises(ValueError, match="completions"):
        combine_rewards([(r, 1.0)], [ADD, ADD], ["x"])


def test_combine_execution_and_format_end_to_end(tmp_path):
    completions = ["```python\ndef add(a, b):\n    return a + b\n```", "    return a - b\n"]
    out = combine_rewards([(ExecutionReward(LIMITS), 2.0), (FormatReward(), 1.0)],
                          [ADD, ADD], completions, RewardCache(tmp_path))
    assert out.per_reward["execution"].tolist() == [1.0, 0.0]
    assert out.per_reward["format"].tolist() == [1.0, 0.0]
    assert out.total.tolist() == [1.0, 0.0]
