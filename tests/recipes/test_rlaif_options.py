"""The RLAIF recipe's issue-33 options: GRPO controls (`--grpo.*`) and memory options
(`--memory.*`): range checks with one clear line, which rows enter the update, skipped
micro-batches changing no loss, the memory-driven micro-batch, and a smoke run with all on."""

import json
from functools import partial

import attrs
import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from mlxcore.rl.policy import GrpoConfig
from mlxio.errors import ConfigError
from mlxio.rl import auto_batch, grpo
from mlxio.run import distributed
from recipes import rlaif_qwen as rq
from recipes.rlaif_config import batch_settings, load_policy, loss_fn
from tests.recipes.test_rlaif_e2e import EXTRA, problems_file, smoke_cfg  # noqa: F401  (fixture)

SMOKE = rq.PRESETS["smoke"]


@pytest.mark.parametrize("argv, names", [
    (["--grpo.loss_type", "ppo"], "grpo.loss_type"),
    (["--grpo.clip_eps_high", "0.3"], "grpo.clip_eps_high"),
    (["--grpo.clip_eps_high", "-1", "--clip_eps", "0.2"], "grpo.clip_eps_high"),
    (["--grpo.importance_ratio", "sequence"], "grpo.importance_ratio"),
    (["--grpo.importance_ratio", "seq"], "grpo.importance_ratio"),
    (["--grpo.entropy_target", "0.3"], "grpo.entropy_target"),
    (["--grpo.entropy_coef", "-0.1"], "grpo.entropy_coef"),
    (["--clip_eps", "1.5"], "clip_eps"),
    (["--memory.logprob_chunk", "0"], "memory.logprob_chunk"),
    (["--memory.compute_dtype", "fp8"], "memory.compute_dtype"),
    (["--memory.recompute", "mlp,attention"], "memory.recompute"),
    (["--memory.budget_fraction", "2"], "memory.budget_fraction"),
    (["--memory.max_micro_batch", "0"], "memory.max_micro_batch"),
    (["--memory.auto_batch", "true", "--memory.eval_micro_batches", "false"], "memory.auto_batch"),
])
def test_bad_option_is_one_line_naming_it(argv, names, tmp_path):
    with pytest.raises(ConfigError) as err:
        rq.main(["--preset", "smoke", "--out_dir", str(tmp_path), *argv])
    assert names in str(err.value) and "\n" not in str(err.value)


def test_update_rows_skip_equal_groups_and_mask_truncated():
    total = np.array([1.0, 1.0, 0.0, 1.0, 0.5, 0.5, 0.2, 0.9])
    missing = np.array([False, False, False, False, False, True, False, False])
    ids = np.array([0, 0, 1, 1, 2, 2, 3, 3])  # group 2: one reward missing, the other alone
    finished = np.array([True, True, True, False, True, True, True, True])
    world = distributed.World(rank=0, size=1)
    keep, stats = grpo.update_rows(total, missing, ids, finished, GrpoConfig(), world)
    assert keep.tolist() == (~missing).tolist()
    assert stats == {"equal_reward_groups": 2, "truncated": 1, "rows_in_update": 7}
    keep, stats = grpo.update_rows(total, missing, ids, finished,
                                   GrpoConfig(skip_equal_groups=True, mask_truncated=True), world)
    assert keep.tolist() == [False, False, True, False, False, False, True, True]
    assert stats["rows_in_update"] == 3


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo"])
def test_dropping_empty_micro_batches_changes_no_loss_or_gradient(loss_type):
    """Rows with nothing to score go last and micro-batches of them alone are not run: the
    step's loss and gradient are those of the full batch (not so for bnpo, whose value depends
    on how rows fall into micro-batches by its definition)."""
    from mlxcore.train.step import accumulate

    cfg = attrs.evolve(SMOKE, grpo=GrpoConfig(loss_type=loss_type), clip_eps=0.2, beta=0.04,
                       train=attrs.evolve(SMOKE.train, accum=4), memory=attrs.evolve(SMOKE.memory, logprob_chunk=8))
    policy = load_policy(cfg)
    params = {k: v + 0.01 for k, v in tree_flatten(grpo.llm_lora.lora_tree(policy.model))}
    params = grpo.llm_lora.tree_unflatten(list(params.items()))
    rng = np.random.default_rng(0)
    n, t = 8, 12
    packed = {"tokens": rng.integers(1, 200, (n, t)).astype(np.int32),
              "completion_mask": (np.arange(t)[None] >= 5).astype(np.float32).repeat(n, 0)}
    adv = rng.standard_normal(n).astype(np.float32)
    valid = np.array([True, False, False, True, False, False, True, False])  # 3 rows: 2 micro-batches of 2
    loss = loss_fn(policy.model, cfg)
    grad_fn = mx.value_and_grad(lambda p, mb, key: loss(p, mb, key), argnums=0)

    def step(batch):
        keys = mx.random.split(mx.random.key(0), batch["tokens"].shape[0])
        loss, aux, grads = accumulate(lambda p, mb, key: grad_fn(p, mb, key), params, batch, keys)
        return float(loss), grads

    full = grpo.build_batch(policy.model, params, packed, adv, valid, **batch_settings(cfg))
    dropped = grpo.build_batch(policy.model, params, packed, adv, valid, **batch_settings(cfg), drop_empty=True)
    assert full["tokens"].shape[0] == 4 and dropped["tokens"].shape[0] == 2
    (a, ga), (b, gb) = step(full), step(dropped)
    assert b == pytest.approx(a, rel=1e-5, abs=1e-7)
    for (path, x), (_, y) in zip(tree_flatten(ga), tree_flatten(gb), strict=True):
        np.testing.assert_allclose(np.array(y), np.array(x), rtol=1e-4, atol=1e-7, err_msg=path)
    assert grpo.build_batch(policy.model, params, packed, adv, np.zeros(n, bool), **batch_settings(cfg),
                            drop_empty=True) is None


def test_auto_batch_plan_takes_the_largest_micro_batch_that_fits(tmp_path):
    cfg = attrs.evolve(SMOKE, memory=attrs.evolve(SMOKE.memory, auto_batch=True, budget_mb=1e6))
    policy = load_policy(cfg)
    model, params = policy.model, grpo.llm_lora.lora_tree(policy.model)
    from mlxcore.train.optim import make_optimizer
    from mlxcore.train.step import init_state, make_train_step

    opt = make_optimizer(cfg.optim)
    step_fn = make_train_step(loss_fn(model, cfg), opt, jit=False, eval_micro_batches=True)
    state = init_state(opt, params)
    vocab = int(policy.config["vocab_size"])
    probe_batch = partial(grpo.build_batch, model, params, **{**batch_settings(cfg), "accum": 1})

    def plan(memory):
        return auto_batch.plan(memory, probe_batch, params, step_fn, state, 8, 20, cfg.max_new_tokens, vocab)

    found = plan(cfg.memory)
    assert (found.micro_batch, found.accum) == (8, 1) and found.probes[0].peak_bytes > 0
    assert found.per_sample_bytes > 0
    # a budget between the fixed cost and one more completion: micro-batches of 1
    budget = (found.fixed_bytes + 1.5 * found.per_sample_bytes) / 0.9 / 2**20
    assert plan(attrs.evolve(cfg.memory, budget_mb=budget)).micro_batch == 1
    with pytest.raises(ConfigError, match="no micro-batch fits") as err:
        plan(attrs.evolve(cfg.memory, budget_mb=1e-3))
    assert "\n" not in str(err.value)
    # a step that came within 5% of the budget: more micro-batches next time
    assert auto_batch.recheck(found, 1, 8, int(found.budget_bytes)) > 1
    assert auto_batch.recheck(found, 1, 8, 0) == 1


@pytest.mark.slow
def test_smoke_run_with_every_option(problems_file, tmp_path):  # noqa: F811
    """Two steps with clip-higher, GSPO, dapo, an entropy target, equal groups skipped,
    truncation masked, bf16, gradient checkpointing and the memory-driven micro-batch: finite,
    and the new counts are logged."""
    cfg = smoke_cfg(tmp_path, problems_file, train={"steps": 2, "checkpoint_every": 2}, clip_eps=3e-4,
                    grpo=GrpoConfig(loss_type="dapo", clip_eps_high=4e-4, importance_ratio="sequence",
                                    entropy_coef=0.01, entropy_target=5.0, skip_equal_groups=True,
                                    mask_truncated=False),
                    memory=attrs.evolve(SMOKE.memory, compute_dtype="bfloat16", gradient_checkpointing=True,
                                        auto_batch=True, budget_mb=1e5, logprob_chunk=16))
    cfg = attrs.evolve(cfg, eval=attrs.evolve(cfg.eval, before=False, after=False))
    rq.run(cfg, extra_rewards=EXTRA)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 2
    for r in records:
        assert {"equal_reward_groups", "truncated", "rows_in_update", "update_skipped"} <= set(r)
        if not r["update_skipped"]:
            assert np.isfinite(r["loss"]) and r["token_entropy"] > 0
    plan = json.loads((tmp_path / "auto_batch.json").read_text())
    assert plan["accum"] * plan["micro_batch"] == cfg.prompts_per_step * cfg.group_size
