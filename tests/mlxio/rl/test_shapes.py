"""The shapes a step can meet are listed before step 1 (`mlxio.rl.shapes.plan`, issue 33 item 5):
over many random steps of each preset (prompt and completion lengths, rows left out of the
update drawn by hypothesis) the prefill, decode and update shapes the recipe's own functions
produce are in the plan's list, and the list is small: at most 1 + len(decode ladder) +
len(update widths) (x accum for a one-graph update), 6 for the gpu preset."""

import attrs
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlxcore.rl import packing
from mlxcore.train import buckets
from mlxio.rl import grpo, shapes
from mlxio.rl.rollout import generate_group
from mlxio.rl.shapes import ShapesConfig
from mlxio.weights import llm
from recipes.rlaif_config import PRESETS, batch_settings, shape_plan

# prompt token lengths (chat template applied) of the presets' training sets, SmolLM2's
# tokenizer (the gpu preset's levels 1-2: 89-165; quick's level 1: 89-151)
PROMPT_RANGE = {"gpu": (89, 165), "quick": (89, 151), "full": (89, 151), "smoke": (20, 40)}


def _plan(name: str, cfg=None):
    cfg = cfg or PRESETS[name]
    return shape_plan(cfg, PROMPT_RANGE[name], cfg.prompts_per_step, cfg.prompts_per_step * cfg.group_size)


def test_the_gpu_presets_list():
    p = _plan("gpu")
    assert p.prompt_width == 192 and p.cache_slots == 512
    assert p.decode_batches == (64, 32, 16)  # shapes.min_decode_batch 16
    assert p.update_widths == (256, 384)  # the largest 2 of 96, 128, 192, 256, 384 (shapes.update_widths 2)
    assert p.positions == (5120, 5120)  # 32 rows x min(160, width - 89), in 512s
    assert len(p.keys()) == 1 + 3 + 2 == 6


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_the_list_is_small(name):
    cfg = PRESETS[name]
    p = _plan(name)
    per_width = cfg.train.accum if not cfg.memory.eval_micro_batches else 1
    assert len(p.keys()) == 1 + len(p.decode_batches) + len(p.update_widths) * per_width
    assert len(p.decode_batches) <= 1 + max(0, (p.decode_batches[0] // cfg.shapes.min_decode_batch).bit_length() - 1)
    assert len(p.update_widths) <= 8  # bucket widths 1.5x / 2x apart between the shortest and longest row
    one = shape_plan(attrs.evolve(cfg, shapes=ShapesConfig(update_widths=1, min_decode_batch=1 << 16)),
                      PROMPT_RANGE[name], cfg.prompts_per_step, cfg.prompts_per_step * cfg.group_size)
    assert len(one.keys()) == 1 + 1 + per_width and one.update_widths == p.update_widths[-1:]


@settings(max_examples=60)
@given(data=st.data(), name=st.sampled_from(["gpu", "quick", "full", "smoke"]),
       one_graph=st.booleans(), skip_equal=st.booleans())
def test_random_steps_stay_in_the_list(data, name, one_graph, skip_equal):
    """The recipe's own shape-making functions over drawn steps: `prefill_width`, the decode
    ladder, `packing.pack_tokens` at the plan's widths and `grpo.build_batch` (drop_empty, rows
    left out) at its scored positions."""
    cfg = PRESETS[name]
    cfg = attrs.evolve(cfg, beta=0.0, clip_eps=None, inner_epochs=1,  # (no model: no frozen log-probs)
                       memory=attrs.evolve(cfg.memory, eval_micro_batches=not one_graph))
    p = _plan(name, cfg)
    keys = p.keys()
    lo, hi = PROMPT_RANGE[name]
    prompts = data.draw(st.lists(st.integers(lo, hi), min_size=cfg.prompts_per_step, max_size=cfg.prompts_per_step))
    n = cfg.prompts_per_step * cfg.group_size
    completions = data.draw(st.lists(st.integers(1, cfg.max_new_tokens), min_size=n, max_size=n))
    for bucketed in (True, False):
        width = buckets.prefill_width(max(prompts) - 1, bucketed, p.prompt_width)
        assert ("prefill", cfg.prompts_per_step, width) in keys
        assert ("decode", n, buckets.cache_length(width, cfg.max_new_tokens)) in keys
    assert {("decode", b, p.cache_slots) for b in buckets.batch_ladder(n, cfg.shapes.min_decode_batch)} <= keys
    packed = packing.pack_tokens([[7] * k for k in prompts], [[9] * c for c in completions], 0, p.update_widths)
    valid = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)) if skip_equal else [True] * n)
    if not valid.any():
        return
    batch = grpo.build_batch(None, None, packed, np.zeros(n, np.float32), valid, **batch_settings(cfg),
                             drop_empty=data.draw(st.booleans()),
                             positions_width=p.positions_for(packed["tokens"].shape[1]))
    assert shapes.update_key(batch, one_graph) in keys


def test_a_prompt_longer_than_planned_falls_back_to_its_own_bucket():
    p = _plan("gpu")
    assert buckets.prefill_width(300, True, p.prompt_width) == buckets.bucket_width(300)
    packed = packing.pack_tokens([[1] * 300], [[2] * 160], 0, p.update_widths)
    assert packed["tokens"].shape[1] == buckets.bucket_width(460)


@settings(max_examples=8)
@given(prompt_lens=st.lists(st.integers(2, 30), min_size=2, max_size=2), seed=st.integers(0, 2**16),
       temperature=st.sampled_from([0.0, 1.0]))
def test_a_tiny_models_rollouts_stay_in_the_list(prompt_lens, seed, temperature):
    """generate_group's reported shapes (prefill, every decode batch it compacted to) on a tiny
    llama, with prompts of drawn lengths: in the plan of a config that allows 2 .. 30 tokens."""
    policy = _tiny()
    cfg = attrs.evolve(PRESETS["smoke"], max_new_tokens=20, shapes=ShapesConfig(min_decode_batch=2))
    p = shape_plan(cfg, (2, 30), 2, 8)
    texts = ["ab" * (k // 2) + "c" * (k % 2) for k in prompt_lens]  # (a byte-level tokenizer)
    ro = generate_group(policy, texts, 4, temperature, 1.0, 20, seed, use_chat_template=False, engine="static",
                        prompt_width=p.prompt_width, min_decode_batch=2)
    assert list(map(len, ro.prompt_tokens)) == prompt_lens
    assert set(ro.shapes) <= p.keys(), (ro.shapes, p.keys())
    packed = packing.pack(ro, 0, p.update_widths)
    cfg = attrs.evolve(cfg, beta=0.0)
    batch = grpo.build_batch(None, None, packed, np.zeros(8, np.float32), np.ones(8, bool), **batch_settings(cfg),
                             positions_width=p.positions_for(packed["tokens"].shape[1]))
    assert shapes.update_key(batch, False) in p.keys()


_POLICY = []


def _tiny():
    if not _POLICY:
        policy = llm.tiny_policy("llama", seed=1)
        _POLICY.append(policy)
    return _POLICY[0]
