"""Memory-driven batch size: the fit and the choice, the plan's step-down on failed probes, and
an end-to-end run that lowers the budget until the micro-batch must shrink - with real probes
in child processes, one of them killed by the memory cap, while this (the trainer's) process
trains on and stays under budget."""

import mlx.core as mx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlxcore.retrieval import objective
from mlxcore.train.optim import OptimConfig, make_optimizer
from mlxcore.train.step import init_state, make_train_step
from mlxio.errors import ConfigError
from mlxio.run import batch_probe, batch_sizer
from mlxio.run.batch_sizer import Probe

MB = 1024 * 1024


@given(fixed=st.floats(0, 1e9), per=st.floats(1, 1e8), sizes=st.lists(st.integers(1, 64), min_size=2, max_size=5,
                                                                     unique=True))
@settings(max_examples=20)
def test_fit_line_recovers_exact_costs(fixed, per, sizes):
    got_fixed, got_per = batch_sizer.fit_line(sizes, [fixed + per * s for s in sizes])
    assert got_per == pytest.approx(per, rel=1e-6)
    assert got_fixed == pytest.approx(fixed, rel=1e-6, abs=1e-3 * per)


def test_fit_line_with_one_size_is_pessimistic():
    assert batch_sizer.fit_line([4, 4], [400, 420]) == (0.0, 105.0)


@given(effective=st.integers(1, 96), fixed=st.integers(0, 1000), per=st.integers(1, 100),
       budget=st.integers(1, 10_000), max_micro=st.integers(1, 64))
@settings(max_examples=50)
def test_choice_is_the_largest_fitting_divisor(effective, fixed, per, budget, max_micro):
    got = batch_sizer.choose_micro_batch(effective, fixed, per, budget, max_micro, safety=1.0, min_micro=2)
    fitting = [d for d in range(2, effective + 1)
               if effective % d == 0 and d <= max_micro and fixed + per * d <= budget]
    assert got == (max(fitting) if fitting else None)


def fake_probe(peak_of, crash_above=None):
    calls = []

    def probe(spec, micro):
        calls.append(micro)
        if crash_above is not None and micro > crash_above:
            return Probe(micro, False, error="exit -11")
        return Probe(micro, True, peak_of(micro), 0.1)

    return probe, calls


def test_plan_steps_down_when_the_confirming_probe_crashes():
    probe, calls = fake_probe(lambda m: 100 * MB + 10 * MB * m, crash_above=8)
    plan = batch_sizer.plan_micro_batch({}, 48, budget=1000 * MB, max_micro=64, probe=probe, probe_sizes=(1, 2, 4))
    # the line predicts 48 fits (580 MB); 48, 24, 16 and 12 "abort"; 8, the next divisor, runs
    assert plan.micro_batch == 8 and plan.accum == 6
    assert calls == [1, 2, 4, 48, 24, 16, 12, 8]
    assert all(not p.ok for p in plan.probes if p.micro_batch > 8)


def test_plan_refuses_a_budget_nothing_fits():
    probe, _ = fake_probe(lambda m: 500 * MB + 10 * MB * m)
    with pytest.raises(ConfigError, match="no micro-batch fits"):
        batch_sizer.plan_micro_batch({}, 8, budget=400 * MB, probe=probe)


def test_recheck_shrinks_only_when_over_budget():
    plan = batch_sizer.Plan(micro_batch=16, accum=2, budget_bytes=1000, fixed_bytes=200, per_sample_bytes=40,
                            probes=())
    assert batch_sizer.recheck(plan, 16, 32, observed_peak=900) == 16
    assert batch_sizer.recheck(plan, 16, 32, observed_peak=1100) == 8  # 56/sample observed: 8 fits


def test_split_batch_keeps_samples_and_order():
    batch = {"x": mx.arange(2 * 6 * 3).reshape(2, 6, 3)}
    split = batch_sizer.split_batch(batch, 4)
    assert split["x"].shape == (3, 4, 3)
    assert mx.array_equal(split["x"].reshape(-1), batch["x"].reshape(-1))
    with pytest.raises(ValueError, match="does not split"):
        batch_sizer.split_batch(batch, 5)


SPEC = {"query_len": 8, "doc_len": 16, "steps": 1}
EFFECTIVE = 16


@pytest.mark.slow
def test_lowering_the_budget_shrinks_the_batch_and_the_trainer_survives():
    sizes = {}

    def probe(spec, micro):  # real child processes; each size measured once
        if micro not in sizes:
            sizes[micro] = batch_sizer.run_probe(spec, micro, timeout_s=120)
        return sizes[micro]

    roomy = batch_sizer.plan_micro_batch(SPEC, EFFECTIVE, 64 * 1024 * MB, max_micro=8, min_micro=2, probe=probe)
    assert roomy.micro_batch == 8 and roomy.accum == 2
    assert all(p.ok for p in roomy.probes)
    fixed, per = roomy.fixed_bytes, roomy.per_sample_bytes
    assert per > 0

    chosen = []
    budget = int(max(fixed + per * 8, sizes[8].peak_bytes) / 0.9) + MB  # 8 fits: by the line and measured
    while True:  # lower the budget until the micro-batch must shrink to 2
        plan = batch_sizer.plan_micro_batch(SPEC, EFFECTIVE, budget, max_micro=8, min_micro=2, probe=probe)
        chosen.append(plan.micro_batch)
        if plan.micro_batch == 2:
            break
        budget = int(budget * 0.95)  # steps of ~5%: the window where only 2 fits is ~2 samples wide
    assert chosen == sorted(chosen, reverse=True) and chosen[0] == 8 and chosen[-1] == 2
    assert plan.accum == EFFECTIVE // 2

    # the size that no longer fits, probed under the lowered budget as a device limit: the child
    # dies (or reports an overshoot), this process does not
    capped = batch_sizer.run_probe({**SPEC, "accum": EFFECTIVE // 8, "memory_limit_bytes": budget}, 8,
                                   timeout_s=120)
    assert not capped.ok and "exit -6" in capped.error, capped  # SIGABRT, as MLX's OOM abort

    # train here at the chosen split of the same effective batch: peak stays within budget
    enc_spec, params, trainable = batch_probe.build(batch_probe.ProbeSpec(micro_batch=plan.micro_batch, **SPEC))
    optimizer = make_optimizer(OptimConfig(lr=1e-4, warmup_steps=1, total_steps=4))
    step = make_train_step(objective.contrastive_loss_fn(enc_spec), optimizer, trainable=trainable)
    opt_state = init_state(optimizer, params, trainable)
    full = batch_probe.synthetic_batch(enc_spec.model.vocab_size, EFFECTIVE, 1, SPEC["query_len"], SPEC["doc_len"])
    batch = batch_sizer.split_batch(full, plan.micro_batch)
    assert batch["doc_ids"].shape == (plan.accum, plan.micro_batch, SPEC["doc_len"])
    mx.eval(params, opt_state, batch)
    mx.reset_peak_memory()
    for i in range(2):
        params, opt_state, metrics = step(params, opt_state, batch, mx.array(i))
        mx.eval(params, opt_state, metrics)
    assert mx.get_peak_memory() <= budget
    assert int(metrics["skipped"]) == 0
