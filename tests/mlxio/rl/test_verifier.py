"""The verdict judge's model pieces: the split forward (frozen trunk once, LoRA blocks on its
states) equals the whole model's logits, padding changes nothing, balanced batches, answer
tokens."""

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mlxcore.train.lora import LoraConfig
from mlxcore.train.tree import map_leaves
from mlxio.errors import ConfigError
from mlxio.rl import verifier
from mlxio.rl.rollout_log import Judged
from mlxio.weights import llm, llm_lora


def lora_policy(kind: str, layers: int):
    policy = llm.tiny_policy(kind.removesuffix("-q4"), quantize=kind.endswith("-q4"))
    llm_lora.apply_lora(policy.model, LoraConfig(rank=4, alpha=8.0, targets=("q_proj", "v_proj", "down_proj")),
                        layers, mx.random.key(0))
    lora = llm_lora.lora_tree(policy.model)
    return policy, map_leaves(lambda a: a + 0.05, lora)  # lora_b no longer zero: the adapters count


@pytest.mark.parametrize("kind", ["llama", "qwen2", "llama-q4"])
@pytest.mark.parametrize("lora_layers", [1, 2])
def test_split_forward_equals_the_whole_model(kind, lora_layers):
    policy, lora = lora_policy(kind, lora_layers)
    model = policy.model
    ids = mx.array(np.random.default_rng(0).integers(0, 256, (3, 12)), mx.int32)
    last = mx.array([11, 3, 7])
    want = llm_lora.forward(model)(lora, ids)[mx.arange(3), last]
    for cut in range(len(model.layers) - lora_layers + 1):  # any cut at or before the first LoRA block
        hidden = llm_lora.trunk(model, cut)(ids)
        got = llm_lora.last_logits(model, cut)(lora, hidden, last)
        np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-4, atol=1e-4, err_msg=f"cut {cut}")
    compiled = mx.compile(llm_lora.last_logits(model, 0))(lora, llm_lora.trunk(model, 0)(ids), last)
    np.testing.assert_allclose(np.array(compiled), np.array(want), rtol=1e-4, atol=1e-4)


def encoded(n: int, seed: int = 0) -> verifier.Encoded:
    rng = np.random.default_rng(seed)
    rows = [rng.integers(0, 256, rng.integers(3, 40)).tolist() for _ in range(n)]
    labels = np.arange(n) % 3 == 0
    groups = [f"t{i // 2}" for i in range(n)]
    items = [Judged(task_id=g, prompt="p", completion=str(i), passed=bool(y))
             for i, (g, y) in enumerate(zip(groups, labels, strict=True))]
    return verifier.Encoded(items=items, rows=rows, labels=labels, groups=np.array(groups, object))


@given(st.integers(1, 7))
def test_states_and_scores_do_not_depend_on_padding_or_batch(batch):
    policy, lora = lora_policy("llama", 1)
    cut = len(policy.model.layers) - 1
    data = verifier.with_states(encoded(9), llm_lora.trunk(policy.model, cut), batch)
    for row, state in zip(data.rows, data.states, strict=True):  # each row alone, unpadded
        alone = llm_lora.trunk(policy.model, cut)(mx.array([row]))[0]
        np.testing.assert_allclose(np.array(state), np.array(alone), rtol=1e-5, atol=1e-5)
    answers = verifier.Answers(yes=1, no=2, yes_all=mx.array([1, 3]), no_all=mx.array([2]))
    logits = llm_lora.last_logits(policy.model, cut)
    p_yes, p_no = verifier.answer_probs(logits, lora, data, answers, batch)
    for i, row in enumerate(data.rows):
        probs = mx.softmax(llm_lora.forward(policy.model)(lora, mx.array([row]))[0, -1])
        assert p_yes[i] == pytest.approx(float(probs[1] + probs[3]), rel=1e-4)
        assert p_no[i] == pytest.approx(float(probs[2]), rel=1e-4)


def test_train_batches_are_balanced_in_every_micro_batch():
    policy, _ = lora_policy("llama", 1)
    data = verifier.with_states(encoded(10), llm_lora.trunk(policy.model, 1), 4)
    answers = verifier.Answers(yes=5, no=6, yes_all=mx.array([5]), no_all=mx.array([6]))
    for step in range(4):
        batch = verifier.train_batch(data, step, 8, 2, answers, seed=0)
        assert batch["inputs"].shape[:2] == (2, 4) and batch["inputs"].shape[2] % 32 == 0
        target = np.array(batch["target"])
        assert (np.sort(target, axis=1) == [[5, 5, 6, 6]] * 2).all()  # two of each class per micro-batch
        assert (np.array(batch["other"]) == 11 - target).all()


def test_answer_tokens_must_be_single_tokens():
    with pytest.raises(ConfigError, match="spells 'Yes' in 3 tokens; a verdict judge answers in one"):
        verifier.answer_ids(llm.tiny_tokenizer(), "tiny:llama")
    answers = verifier.answer_ids(llm.load_policy(None).tokenizer)  # the embedded SmolLM2
    assert answers.yes in np.array(answers.yes_all).tolist() and answers.no in np.array(answers.no_all).tolist()
    assert len(np.array(answers.yes_all)) > 1  # " Yes", "yes", ... count too when scoring
