"""LoRA fine-tuning of a multi-vector (XTR / ColBERT-style) retriever for code search.

    python -m recipes.xtr_lora                        # quick preset: all-MiniLM-L6-v2 on pairs mined
                                                      # from the stdlib and 8 pinned PyPI packages
    python -m recipes.xtr_lora --data.source pairs.jsonl --data.packages ""   # your {query, code} lines
    python -m recipes.xtr_lora --model DIR_OR_HUB_ID  # google/xtr-base-en or any T5/BERT encoder
    python -m recipes.xtr_lora --preset full --help   # every option with its default
    python -m recipes.xtr_lora --resume               # continue the run in --out_dir exactly
    python -m recipes.xtr_lora --profile-memory       # memory.json + memory.png in --out_dir
    python -m recipes.xtr_lora --memory.auto_batch true --memory.gradient_checkpointing true \\
        --memory.compute_dtype bfloat16 --quant.qat '*=4/64' --quant.ptq '*=4/64'
    mlx.launch -n 2 --backend ring -- python -m recipes.xtr_lora   # data-parallel (docs/distributed.md)

Options and presets: recipes/xtr_lora_config.py.
Top to bottom: config -> encoder + LoRA -> (query, code) pairs -> token cache -> BM25 and
untrained baselines -> compiled training steps with checkpoints -> evaluation -> export.
Per-token embeddings are L2-normalised; a query scores a document by MaxSim (mean over real
query tokens of the best cosine over document tokens); the loss is InfoNCE over in-batch
negatives (temperature 0.07 as in the XTR seed report; 0.03 in the MiniLM presets) + 0.1 x
margin loss (margin 0.2).
"""

from __future__ import annotations

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # first: MLX's CPU BLAS is chosen when mlx.core loads (mlxio.runtime)

import argparse
import logging
import time
from pathlib import Path

import attrs
import mlx.core as mx

from mlxcore.retrieval import objective
from mlxcore.train import precision
from mlxcore.train.buckets import padded_length
from mlxcore.train.optim import make_optimizer
from mlxcore.train.step import init_state, make_train_step
from mlxcore.train.tree import combine, partition
from mlxio.atomic import write_json_atomic
from mlxio.data import xtr_data, xtr_tokens
from mlxio.data.token_cache import DataPosition
from mlxio.errors import ConfigError, LoadError
from mlxio.gpu import kernel_cache
from mlxio.run import batch_sizer, budget, checks, config, context, distributed
from mlxio.run.best import BestKeeper
from mlxio.run.flags import add_run_flags, cli, parse_args
from mlxio.run.loop import TrainLoop
from mlxio.run.phases import PhaseClock
from mlxio.run.reporting import StepWindows
from mlxio.run.runlog import plot_curves
from mlxio.search.evaluation import Evaluator, baselines, eval_scalars, results_table, summary_line
from mlxio.weights import quantize as quant_io
from mlxio.weights.cards import base_model_name, command_line
from mlxio.weights.encoders import default_encoder_path, load_encoder
from mlxio.weights.export import export_retriever, mean_pooling_view
from mlxio.weights.quantize import save_ptq
from mlxio.weights.retriever import load_trainable
from recipes.xtr_lora_config import PRESETS, Config, trajectory_hash, validate

log = logging.getLogger("xtr_lora")

def batch_plan(cfg: Config, model_path: str, targets: tuple[str, ...], world_size: int,
               record: Path | None) -> batch_sizer.Plan:
    """`--memory.auto_batch`: the micro-batch that fits, from probes at full-length batches."""
    spec = batch_sizer.probe_spec(model_path, targets, cfg.lora, cfg.loss, cfg.quant.qat,
                                  query_len=padded_length(cfg.data.max_query_len, cfg.data.bucket),
                                  doc_len=padded_length(cfg.data.max_doc_len, cfg.data.bucket),
                                  gradient_checkpointing=cfg.memory.gradient_checkpointing,
                                  compute_dtype=cfg.memory.compute_dtype)
    return batch_sizer.plan_for_run(spec, cfg.train.micro_batch * cfg.train.accum, budget_mb=cfg.memory.budget_mb,
                                    budget_fraction=cfg.memory.budget_fraction,
                                    max_micro_batch=cfg.memory.max_micro_batch, world_size=world_size, record=record)


def parse(argv: list[str] | None) -> tuple[Config, argparse.Namespace]:
    """(checked config, run flags) from the command line."""
    def extra_flags(parser: argparse.ArgumentParser) -> None:
        add_run_flags(parser, stop_after_aliases=("--train.stop_after",))
        parser.add_argument("--lenient", action="store_true", help="same as --data.lenient true")

    cfg, flags = parse_args(argv, PRESETS, prog="python -m recipes.xtr_lora", description=__doc__,
                                   default_preset="quick", extra=extra_flags)
    if flags.lenient:
        cfg = attrs.evolve(cfg, data=attrs.evolve(cfg.data, lenient=True))
    validate(cfg, "command line")
    return cfg, flags


@context.releases_out_dirs
def main(argv: list[str] | None = None) -> dict:
    """Train, evaluate and export the retriever per the command line; returns eval.json's contents.
    Setup (encoder, data, step, resume, baselines), the training loop (`train`), then the
    evaluation, report and exports (`finish`)."""
    cfg, flags = parse(argv)
    out_dir = checks.check_out_dir(cfg.out_dir, "out_dir")
    cache_dir = checks.check_out_dir(cfg.cache_dir, "cache_dir")
    world = context.start(out_dir, config.to_dict(cfg), cfg.train.seed, flags.resume, flags.overwrite)
    distributed.local_size(cfg.train.micro_batch, world, "train.micro_batch")
    started, clock = time.perf_counter(), PhaseClock()  # clock: wall and CPU time per phase
    model_path, model, evaluate = load_model(cfg, world, clock)
    data, tokens = load_data(cfg, model_path, model, cache_dir, clock)
    step_fn, params, opt_state, resumed, run_id = make_step(cfg, flags, model, model_path, out_dir, world)
    start_step = resumed.step if resumed else 0
    baseline = run_baselines(cfg, evaluate, model, model_path, data, cache_dir, clock) if world.is_main else None
    keeper, on_dev = (dev_evaluation(evaluate, model, baseline, out_dir, start_step if resumed else None,
                                     lambda record: loop.write(record))
                      if cfg.train.dev_eval_every and world.is_main else (None, None))

    # ---- train
    plan = None  # memory-driven micro-batch: the same micro_batch x accum samples per step, split to fit
    if cfg.memory.auto_batch:
        plan = batch_plan(cfg, model_path, model.targets, world.size,
                          record=out_dir / "batch_plan.json" if world.is_main else None)
    loop = TrainLoop.open(out_dir, world, run_id=run_id, config=config.to_dict(cfg), train=cfg.train,
                          start=start_step, end=context.last_step(cfg.train.steps, flags.stop_after),
                          resumed=resumed is not None, opt_state=opt_state, project="xtr_lora", desc="train",
                          report_to=cfg.report_to, headline=("loss", "lr", "samples_per_s"),
                          hint=f"The last good checkpoint is kept in {out_dir / 'checkpoints'}.",
                          profile_memory=flags.profile_memory)
    batches = tokens.batches(cfg.train.micro_batch, cfg.train.accum, cfg.train.seed,
                             DataPosition(**resumed.meta["data_position"]) if resumed else DataPosition(),
                             cfg.data.bucket, world, cfg.train.batch_order)
    params, opt_state, train_s, micro = train(cfg, loop, step_fn, params, opt_state, batches, model.trainable, plan,
                                              on_dev)
    records = loop.reporter.read() if world.is_main else []
    samples_per_step, steps_run = cfg.train.micro_batch * cfg.train.accum, loop.end - start_step
    clock.lap("train", f"{steps_run} steps at {samples_per_step * steps_run / max(train_s, 1e-9):.1f} samples/s"
              + (f", loss {records[-1]['loss']:.4f} (last window)" if records and "loss" in records[-1] else ""))
    # the reporter stays open for the evaluation's metrics (TensorBoard / W&B), closed after them
    if not loop.finish(opt_state, steps_run, f"xtr_lora memory: {Path(model_path).name}", keep_reporter=True):
        return {"stopped_at": loop.end} if loop.stopped_early else {"rank": world.rank}
    return finish(cfg, argv, model_path, model, evaluate, data, baseline, keeper, loop, params, records,
                  Finished(out_dir=out_dir, train_s=train_s, micro=micro, steps_run=steps_run, started=started,
                           clock=clock))


@attrs.frozen
class Finished:
    """How the training loop went, for the report: the run folder, the loop's seconds, micro-batch
    and steps run in this process, the run's start (perf_counter) and its phase clock."""

    out_dir: Path
    train_s: float
    micro: int
    steps_run: int
    started: float
    clock: PhaseClock


def load_model(cfg: Config, world, clock: PhaseClock):
    """(model path, the trainable encoder + LoRA (+ projection), its evaluator), once the
    settings that cannot fit are refused."""
    model_path = cfg.model or str(default_encoder_path())
    model = load_trainable(model_path, cfg.lora, projection_dim=cfg.train.projection_dim, seed=cfg.train.seed,
                           gradient_checkpointing=cfg.memory.gradient_checkpointing,
                           compute_dtype=cfg.memory.compute_dtype,
                           max_lengths={"data.max_query_len": cfg.data.max_query_len,
                                        "data.max_doc_len": cfg.data.max_doc_len})
    encoder, params, trainable = model.encoder, model.params, model.trainable
    if not cfg.memory.auto_batch:  # settings that cannot fit, refused before any data is mined
        docs = cfg.train.micro_batch * (1 + cfg.data.hard_negatives) // world.size  # this rank's share
        budget.check_encoder(encoder.spec.model, docs, cfg.data.max_doc_len, "train.micro_batch", cfg.train.micro_batch,
                             backward=True, where=model_path,
                             fix="lower --train.micro_batch (raise --train.accum to keep the step's pairs) or "
                                 "--data.max_doc_len, or set --memory.auto_batch true")
    budget.check_encoder(encoder.spec.model, cfg.train.eval_batch, cfg.data.max_doc_len, "train.eval_batch",
                         cfg.train.eval_batch, backward=False, where=model_path)
    distributed.check_replicated(partition(params, trainable)[0], world, "initial trainable weights")
    evaluate = Evaluator(encoder=encoder, query_len=cfg.data.max_query_len, doc_len=cfg.data.max_doc_len,
                         batch=cfg.train.eval_batch, compiled=cfg.train.compile)
    clock.lap("load_model", f"{Path(model_path).name}, {model.trainable_params:,} trainable parameters")
    return model_path, model, evaluate


def load_data(cfg: Config, model_path: str, model, cache_dir: Path, clock: PhaseClock):
    """(the data: pairs, hard negatives, held-out tasks; its token cache)."""
    encoder = model.encoder
    # pairs (+ hard negatives, mined and guarded by the guide's MaxSim), held-out tasks, token cache
    guide, guide_params, guide_id = encoder, model.untrained, f"{model_path} untrained seed {cfg.train.seed}"
    if cfg.data.negative_guide:
        try:
            guide = load_encoder(cfg.data.negative_guide)
        except LoadError as err:
            raise ConfigError(f"data.negative_guide does not load: {err}") from None
        guide_params, guide_id = guide.params, str(Path(cfg.data.negative_guide).resolve())
    data = xtr_data.load_data(cfg.data, cache_dir, cfg.train.seed, lambda texts, max_length: xtr_data.token_embeddings(
        guide_params, guide, texts, max_length, cfg.train.eval_batch), guide_id)
    clock.lap("data", f"{len(data.train):,} training pairs")  # mining (or its cache), splits, hard negatives
    tokens = xtr_tokens.tokenise(data.train, cfg.data, encoder.tokenizer, cache_dir)
    clock.lap("tokenise", f"{len(data.train):,} pairs in the token cache")
    return data, tokens


def make_step(cfg: Config, flags, model, model_path: str, out_dir: Path, world):
    """(compiled step, trainable params, optimizer state, the checkpoint resumed or None, run id)."""
    params, trainable = model.params, model.trainable
    optimizer = make_optimizer(cfg.optim)
    if cfg.train.grad_cache and world.size > 1:
        raise ConfigError("train.grad_cache runs on one process (its documents are not gathered across ranks)")
    grad_cache = objective.training_parts(model.spec, cfg.loss, quant_io.parse_rules(cfg.quant.qat, "quant.qat"),
                                          cfg.lora.scale) if cfg.train.grad_cache else None
    loss_fn = objective.training_loss(model.spec, cfg.loss, quant_io.parse_rules(cfg.quant.qat, "quant.qat"),
                                      cfg.lora.scale, distributed.document_gather(world))
    step_fn = make_train_step(distributed.data_parallel_loss(loss_fn, world),
                              optimizer, trainable=trainable, clip_norm=cfg.optim.clip_norm, seed=cfg.train.seed,
                              reduce_grads=distributed.grad_reducer(world), jit=kernel_cache.use_compile(cfg.train.compile),
                              eval_micro_batches=cfg.memory.eval_micro_batches, grad_cache=grad_cache)
    run_id = {"config_hash": trajectory_hash(config.to_dict(cfg)), "base_model": model_path}
    params, opt_state, resumed = context.resume_into(
        flags.resume, out_dir, run_id, params, init_state(optimizer, params, trainable), world, config.to_dict(cfg),
        Config.LEGACY_KEYS, trajectory_hash, trainable, defaults=config.default_values(Config))
    return step_fn, params, opt_state, resumed, run_id


def run_baselines(cfg: Config, evaluate, model, model_path: str, data, cache_dir: Path, clock: PhaseClock):
    """BM25 and the untrained encoder on the held-out sets (cached: they do not change between runs)."""
    baseline = baselines(evaluate, model.untrained, data, cache_dir,
                         {"model": model_path, "q": cfg.data.max_query_len, "d": cfg.data.max_doc_len,
                          "projection": cfg.train.projection_dim, "seed": cfg.train.seed},
                         cfg.data.heldout_packages)
    untrained = {**baseline.results, **({"heldout_packages": baseline.packages} if baseline.packages else {})}
    clock.lap("untrained_eval", summary_line(untrained, "untrained"))
    return baseline


def dev_evaluation(evaluate, model, baseline, out_dir: Path, resume_step: int | None, write):
    """(keeper, on_dev): the dev evaluation every N steps (`on_dev(step, trained)`, its record
    written by `write`); the best step's adapters are kept, and are what the run evaluates and
    exports."""
    if not any(t.dev_queries for t in baseline.tasks):
        raise ConfigError("train.dev_eval_every needs dev queries; this run's held-out sets left none "
                          "(raise data.eval_fraction or set data.dev_queries)")
    keeper = BestKeeper.open(out_dir, "dev_mrr@10", resume_step=resume_step)
    trainable = model.trainable

    def on_dev(step: int, trained) -> None:
        metrics = evaluate.dev(precision.restore_frozen(trained, model.untrained, trainable), baseline.tasks)
        write({"step": step, **metrics})
        if keeper.offer(step, metrics, partition(trained, trainable)[0]):
            log.info("step %d: dev MRR@10 %.4f, the best so far (kept in %s)", step, keeper.value, keeper.root)

    return keeper, on_dev


def finish(cfg: Config, argv, model_path: str, model, evaluate, data, baseline, keeper, loop: TrainLoop, params,
           records: list, run: Finished) -> dict:
    """Evaluate, report and export the trained retriever (float32 base again), post-training
    quantisation; returns eval.json's contents."""
    encoder, trainable = model.encoder, model.trainable
    out_dir, train_s, micro, steps_run, started, clock = (run.out_dir, run.train_s, run.micro, run.steps_run,
                                                          run.started, run.clock)
    samples_per_step = cfg.train.micro_batch * cfg.train.accum
    params = precision.restore_frozen(params, model.untrained, trainable)
    if keeper is not None and keeper.step is not None and keeper.step != cfg.train.steps:
        params = combine(partition(params, trainable)[1], keeper.load())  # the best dev step's adapters
    single_vector = cfg.export and "projection" not in params and mean_pooling_view(encoder)  # merged/ in ST
    results = {**baseline.with_fine_tuned(evaluate, params, single_vector),
               "data": {"sources": data.sources, **data.report}}
    clock.lap("final_eval", summary_line(results, "fine-tuned", baseline="untrained"))
    loop.reporter.write_summary(loop.end, eval_scalars(results))
    loop.reporter.close()
    if cfg.quant.ptq:
        dequantized, compression = save_ptq(params, cfg.lora.scale, cfg.quant.ptq, out_dir / "quantized", model_path)
        results["quantized"] = {**evaluate(dequantized, data.task, baseline.bm25[0]), "compression": compression}
    results["run"] = {
        "wall_s": time.perf_counter() - started, "train_s": train_s, "steps": steps_run,
        "samples_per_s": samples_per_step * steps_run / max(train_s, 1e-9),
        "micro_batch": micro, "accum": samples_per_step // micro, "eval_interval": cfg.train.eval_interval,
        "contrastive_batch": samples_per_step if cfg.train.grad_cache else micro, "grad_cache": cfg.train.grad_cache,
        "lr": cfg.optim.lr, "temperature": cfg.loss.temperature,
        "trainable_params": model.trainable_params, "model": model_path, "queries": len(data.task.queries),
        "seed": cfg.train.seed, "command": command_line(argv, "recipes.xtr_lora"),
        "candidates": len(data.task.candidates), "dev_queries": len(data.task.dev_queries),
        "hybrid": "min-max score interpolation, one semantic weight (1.0: semantic alone) chosen on the dev queries "
                  "of held-out files and held-out packages together by the one-standard-error rule (the most "
                  "semantic weight within one SE of the best dev MRR@10; fusion_dev); RRF k=60 when too few",
    }
    if keeper is not None:
        results["dev_eval"] = {
            "every": cfg.train.dev_eval_every, "metric": "semantic mrr@10 over the dev queries of every held-out set "
            "(dev_<metric>_0: held-out files, _1: held-out packages)", "best_step": keeper.step, "best": keeper.value,
            "curve": [r for r in records if "dev_mrr@10" in r]}
    # the step whose weights were evaluated above and are exported below
    results["run"]["weights_step"] = keeper.step if keeper is not None and keeper.step else cfg.train.steps
    write_json_atomic(out_dir / "eval.json", results)
    log.info("results:\n%s", results_table(results))
    plot_curves(records, out_dir / "curves.png", ("loss", "info_nce", "margin", "dev_mrr@10", "lr", "samples_per_s"),
                f"xtr_lora: {Path(model_path).name} (means over each logging window)")
    if cfg.export:
        export_retriever(encoder, params, cfg.lora, out_dir, query_length=cfg.data.max_query_len,
                         document_length=cfg.data.max_doc_len, base=base_model_name(model_path), results=results,
                         command=command_line(argv, "recipes.xtr_lora"),
                         data=xtr_data.training_note(cfg.data, steps_run, samples_per_step, data.task,
                                                     data.package_task))
    clock.lap("export")
    results["run"]["phases"] = clock.as_dict()  # wall and CPU seconds per phase, export included
    write_json_atomic(out_dir / "eval.json", results)
    log.info("done in %.0f s: %.1f samples/s training", results["run"]["wall_s"], results["run"]["samples_per_s"])
    return results




def train(cfg: Config, loop: TrainLoop, step_fn, params, opt_state, batches, trainable, plan, on_dev=None):
    """Optimizer steps loop.start .. loop.end - 1, evaluated lazily every `train.eval_interval`
    steps (and at checkpoints and dev evaluations); a metrics record every `train.log_every`;
    `on_dev(step, params)` every `train.dev_eval_every` steps and at the run's last. Returns (params,
    opt_state, seconds in training steps (data waits included, evaluation and checkpoints
    not), the micro-batch the run ended with (auto_batch may shrink it))."""
    samples_per_step = cfg.train.micro_batch * cfg.train.accum
    micro = plan.micro_batch if plan is not None else cfg.train.micro_batch
    windows = StepWindows(cfg.train.log_every, loop.end, samples_per_step)
    pending, train_s, tic = [], 0.0, time.perf_counter()
    with batches:
        for step_no in range(loop.start, loop.end):
            position, batch = next(batches)
            arrays = {k: mx.array(v) for k, v in batch.items()}
            if micro != cfg.train.micro_batch:
                arrays = batch_sizer.split_batch(arrays, micro)
            with kernel_cache.compile_notice("training step", kernel_cache.shapes(arrays)) as first:
                params, opt_state, metrics = step_fn(params, opt_state, arrays, mx.array(step_no))
                if first and kernel_cache.on_gpu():  # wait here, so the notice names the shape
                    mx.eval(params, opt_state, metrics)
            pending.append((step_no + 1, metrics))
            every = cfg.train.dev_eval_every
            dev_due = on_dev is not None and ((step_no + 1) % every == 0 or step_no + 1 == cfg.train.steps)
            if (step_no + 1) % cfg.train.eval_interval and not loop.checkpoint_due(step_no + 1) and not dev_due:
                continue  # stay lazy: the next step builds on this one's unevaluated outputs
            mx.eval(params, opt_state, [m for _, m in pending])
            elapsed = time.perf_counter() - tic
            train_s += elapsed
            last = pending[-1][1]  # the progress line shows the last evaluated step's loss
            loop.bar.set_postfix(loss=f"{float(last['loss']):.4f}", lr=f"{float(last['lr']):.2e}")
            for record in windows.records(pending, elapsed):
                loop.write(record)  # a window of non-finite (skipped) steps has no loss mean
            loop.bar.update(len(pending))
            peak = mx.get_peak_memory()  # before the profiler resets it
            loop.end_step(step_no + 1, opt_state, partition(params, trainable)[0], attrs.asdict(position),
                          micro_batch=micro)
            if plan is not None:  # a longer bucket than probed may need a smaller split
                micro = batch_sizer.recheck(plan, micro, samples_per_step, peak, min_micro=2)
                mx.reset_peak_memory()
            if dev_due:  # not in train_s: tic restarts below
                on_dev(step_no + 1, params)
            pending, tic = [], time.perf_counter()
    return params, opt_state, train_s, micro


if __name__ == "__main__":
    cli(main, "xtr_lora")
