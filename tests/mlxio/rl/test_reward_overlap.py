"""Rewards started while the rollout decodes (mlxio.rl.reward_overlap): the rollout reports each
completion once, as soon as it is final, with the text it returns; the prefetched rewards
combine to exactly what scoring afterwards gives (values, cache counts), each completion judged
once, cached ones not at all."""

import threading

import attrs
import numpy as np
import pytest

from mlxcore.rl.tasks import Problem
from mlxio.rl import rollout
from mlxio.rl.reward_overlap import Prefetch
from mlxio.rl.rewards import AIFeedbackReward, FormatReward, RewardCache, combine_rewards
from mlxio.weights import llm
from tests.mlxio.rl.test_rollout_fence import fence_sampler


@pytest.mark.parametrize("engine", ["batch", "static"])
def test_each_row_is_reported_once_with_its_final_text(monkeypatch, engine):
    monkeypatch.setattr(rollout, "make_sampler", fence_sampler(b"`\nx"))  # the batch engine's rows end early
    seen = []
    ro = rollout.generate_group(llm.tiny_policy("llama"), ["Write add(a, b).", "hi"], group_size=4,
                                max_new_tokens=24, seed=0, stop_at_code_end=True, engine=engine,
                                on_row_end=lambda row, text: seen.append((row, text)))
    assert sorted(row for row, _ in seen) == list(range(8))
    assert all(text == ro.texts[row] for row, text in seen)
    if engine == "batch":
        assert ro.finished.any() and not ro.finished.all()
        assert ro.finished[seen[0][0]]  # a row that stopped early was reported first


@attrs.define
class CountingJudge:
    """A deterministic judge that counts its calls per (prompt, completion)."""

    calls: dict = attrs.Factory(dict)
    lock: threading.Lock = attrs.Factory(threading.Lock)

    def config_key(self) -> str:
        return "counting-v1"

    def judge(self, prompt: str, completion: str) -> float | None:
        with self.lock:
            self.calls[prompt, completion] = self.calls.get((prompt, completion), 0) + 1
        return None if completion == "broken" else float(len(completion) % 11)


PROBLEMS = [Problem(task_id=f"t/{i}", prompt=f"def f{i}(x):\n", entry_point=f"f{i}", test="def check(c): pass")
            for i in range(2)]
TEXTS = ["```python\ndef f0(x):\n    return x\n```", "abc", "broken", "abc",  # prompt 0 (a repeat, a missing)
         "```python\ndef f1(x): return 1\n```", "zz", "abc", "q"]                 # prompt 1


@pytest.mark.parametrize("reported", [range(8), [5, 0, 2], []])
def test_prefetched_rewards_equal_rewards_scored_afterwards(tmp_path, reported):
    judge, plain_judge = CountingJudge(), CountingJudge()
    problems = [PROBLEMS[i // 4] for i in range(8)]
    cache, plain_cache = RewardCache(tmp_path / "a"), RewardCache(tmp_path / "b")
    for c in (cache, plain_cache):  # one value already cached: never judged again
        c.put(RewardCache.key("ai_feedback", AIFeedbackReward(judge).config_key(), _text(PROBLEMS[1]), "q"), 0.25)
    with Prefetch([(AIFeedbackReward(judge), 1.0), (FormatReward(), 0.5)], lambda row: problems[row], cache,
                  workers=3) as prefetch:
        for row in reported:
            prefetch.on_row_end(row, TEXTS[row])
        got = combine_rewards(prefetch.fns, problems, TEXTS, cache)
    want = combine_rewards([(AIFeedbackReward(plain_judge), 1.0), (FormatReward(), 0.5)], problems, TEXTS,
                           plain_cache)
    np.testing.assert_array_equal(got.total, want.total)
    np.testing.assert_array_equal(got.missing, want.missing)
    for name in want.per_reward:
        np.testing.assert_array_equal(got.per_reward[name], want.per_reward[name])
    assert (got.cache_hits, got.cache_misses) == (want.cache_hits, want.cache_misses)
    assert judge.calls == plain_judge.calls and set(judge.calls.values()) == {1}
    assert ("def f1(x):\n", "q") not in judge.calls


def test_off_starts_nothing(tmp_path):
    judge = CountingJudge()
    prefetch = Prefetch([(AIFeedbackReward(judge), 1.0)], lambda row: PROBLEMS[0], None, workers=2, enabled=False)
    prefetch.on_row_end(0, "abc")
    prefetch.close()
    assert judge.calls == {} and prefetch.fns[0][0].__class__ is AIFeedbackReward


def _text(p: Problem) -> str:
    from mlxio.rl.rewards import _problem_text

    return _problem_text(p)
