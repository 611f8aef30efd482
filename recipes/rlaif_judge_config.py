"""Configuration of the verdict-judge recipe (`recipes.rlaif_judge`): the option tree, its presets,
the cross-field checks and the judge's base (`load_policy`); `sample` lives beside its code
(mlxio.rl.verifier), `sandbox` in mlxio.rl.execution. Every field is a command-line option (`--data.logs a.jsonl,b.jsonl`,
`--optim.lr 1e-4`); `python -m recipes.rlaif_judge --help` lists them with their defaults.
"""

from __future__ import annotations

from typing import ClassVar

import attrs

from mlxcore.fields import MAX_SEED, MAX_STEPS, bounded
from mlxcore.rl import tasks
from mlxcore.train.lora import LoraConfig
from mlxcore.train.optim import OptimConfig
from mlxio.errors import ConfigError
from mlxio.rl import grpo
from mlxio.rl.execution import SandboxConfig
from mlxio.rl.verifier import SampleConfig
from mlxio.run.checks import check
from mlxio.weights import llm
from recipes import presets


@attrs.frozen(kw_only=True)
class DataConfig:
    # rollout logs to learn from: rollouts.jsonl files or the out_dirs of RLAIF runs
    # (python -m recipes.rlaif_qwen writes one); their verdicts are the labels
    logs: tuple[str, ...] = ()
    # procedural families never trained on: their completions form the held-out-family set
    heldout_families: tuple[str, ...] = ("parsing",)
    # non-procedural task ids (HumanEval, a JSONL of problems): share of problems held out, by hashed id
    heldout_fraction: float = bounded(0.2, gt=0, lt=1)
    max_tokens: int = bounded(768, ge=16, le=1 << 20)  # longer verdict prompts are left out (counted)


@attrs.frozen(kw_only=True)
class TrainConfig:
    """The run's length, batching and cadence (the RLAIF recipe's `train.*` names)."""

    steps: int = bounded(150, ge=1, le=MAX_STEPS)
    batch: int = bounded(8, ge=2, le=65536)  # verdict prompts per optimizer step: half passing, half failing
    accum: int = bounded(2, ge=1, le=65536)  # the batch goes through in this many micro-batches
    log_every: int = bounded(5, ge=1, le=MAX_STEPS)
    checkpoint_every: int = bounded(25, ge=1, le=MAX_STEPS)
    keep_checkpoints: int = bounded(2, ge=1, le=1000)
    max_consecutive_skips: int = bounded(3, ge=1, le=MAX_STEPS)
    seed: int = bounded(0, ge=0, le=MAX_SEED)  # LoRA initialisation and batch order


@attrs.frozen(kw_only=True)
class EvalConfig:
    batch: int = bounded(8, ge=1, le=65536)  # verdict prompts scored together
    resamples: int = bounded(10_000, ge=1, le=1_000_000)  # bootstrap resamples (over problems) for the 95% intervals


@attrs.frozen(kw_only=True)
class Config:
    model: str | None = None  # None: embedded SmolLM2-135M-Instruct GGUF; or a dir / GGUF / hub id
    dequantize: bool = True  # float32 base (MLX's CPU quantised matmul is far slower); false: QLoRA
    lora: LoraConfig = LoraConfig(rank=8, alpha=16.0, targets=("q_proj", "k_proj", "v_proj", "o_proj",
                                                                "gate_proj", "up_proj", "down_proj"))
    # the last N blocks get LoRA: the backward pass stops there (the forward is the cost on a CPU)
    lora_layers: int | None = bounded(8, ge=1, le=4096)
    optim: OptimConfig = OptimConfig(name="adamw", lr=3e-4, weight_decay=0.0, warmup_steps=10,
                                     total_steps=150, clip_norm=1.0)
    # mx.compile the step; None: yes except on a CUDA device (see recipes.rlaif_config)
    compile: bool | None = None
    data: DataConfig = DataConfig()
    sample: SampleConfig = SampleConfig()
    sandbox: SandboxConfig = SandboxConfig()
    train: TrainConfig = TrainConfig()
    eval: EvalConfig = EvalConfig()
    # also report each record to: "tensorboard", "wandb"; metrics.jsonl always
    report_to: tuple[str, ...] = ()
    out_dir: str = bounded("runs/rlaif_judge", nonempty=True)

    LEGACY_KEYS: ClassVar[dict[str, str | None]] = {}
    # settings that follow another unless given themselves: the schedule spans the run
    DERIVED: ClassVar[dict[str, str]] = {"optim.total_steps": "train.steps"}


PRESETS = presets.load("rlaif_judge", Config)  # recipes/presets/rlaif_judge_*.py


def load_policy(cfg: Config) -> llm.Policy:
    """The judge's base with fresh LoRA (`mlxio.rl.grpo.load_model`, the RLAIF policy's loader)."""
    return grpo.load_model(cfg.model, cfg.lora, cfg.lora_layers, cfg.train.seed, dequantize=cfg.dequantize)


def validate(cfg: Config) -> None:
    """Every field against its declared range (`mlxio.run.checks.check`), then the cross-field
    checks (ConfigError naming the field)."""
    check(cfg)
    try:
        tasks.check_selection(cfg.sample.families, cfg.data.heldout_families, cfg.sample.difficulty)
    except ValueError as err:
        section = "data." if str(err).startswith("heldout_families") else "sample."
        raise ConfigError(f"{section}{err}") from None
    if cfg.train.batch % 2:
        raise ConfigError(f"train.batch: must be even (half passing, half failing completions), got {cfg.train.batch}")
    if (cfg.train.batch // 2) % cfg.train.accum:
        raise ConfigError(f"train.accum={cfg.train.accum} must divide train.batch / 2 = {cfg.train.batch // 2} "
                          "(every micro-batch holds both classes alike)")
    if not cfg.data.logs and not cfg.sample.train_per_template:
        raise ConfigError("sample.train_per_template: 0 with no --data.logs leaves nothing to train on",
                          fix="give --data.logs or set --sample.train_per_template 1 or more")
    if cfg.lora.dropout:
        raise ConfigError("lora.dropout: not supported on causal-LM judges (their forward takes no PRNG key); set 0")
