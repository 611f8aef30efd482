"""Configuration of the RLAIF recipe (`recipes.rlaif_qwen`) and its worker
(`recipes.rlaif_worker`): the option tree, its presets, the cross-field checks, and how the
options reach the library (`open_session`, `load_policy`, `loss_fn`, `batch_settings`, `reward_fns`). Every
field is a command-line option (`--group_size 8`, `--optim.lr 1e-5`); `python -m
recipes.rlaif_qwen --help` lists them with their defaults. The sections live beside the code
they configure: `data`, `eval` in mlxio.rl.evaluation, `rewards`, `teacher` in
mlxio.rl.rewards, `sandbox` in mlxio.rl.execution, `memory` in mlxio.rl.grpo, `lora`, `optim`,
`grpo` in mlxcore; `train` (the loop's length and cadence) is the recipe's own.
"""

from __future__ import annotations

from typing import ClassVar

import attrs

from mlxcore.fields import MAX_NEW_TOKENS, MAX_SEED, MAX_STEPS, bounded
from mlxcore.rl.policy import GrpoConfig
from mlxcore.train.lora import LoraConfig
from mlxcore.train.optim import OptimConfig
from mlxio.errors import ConfigError
from mlxio.gpu import kernel_cache
from mlxio.rl import grpo, memory_bounds, rewards, session, shapes
from mlxio.rl.evaluation import DataConfig, EvalConfig, validate_data
from mlxio.rl.execution import SandboxConfig
from mlxio.rl.grpo import TINY_PREFIX, MemoryConfig  # TINY_PREFIX + "llama": a tiny random model
from mlxio.rl.rewards import RewardConfig, TeacherConfig
from mlxio.rl.rollout import ENGINES
from mlxio.rl.shapes import ShapePlan, ShapesConfig
from mlxio.rl.verdict_reward import VerdictJudgeReward
from mlxio.run import distributed
from mlxio.run.checks import check, check_schedule, check_url
from mlxio.run.config import to_dict
from mlxio.weights import llm
from mlxio.weights.llm import TINY_KINDS
from mlxio.weights.llm_lora import RECOMPUTABLE
from recipes import presets


@attrs.frozen(kw_only=True)
class TrainConfig:
    """The run's length, batching and cadence: the same names as the retriever recipe's `train.*`."""

    # quick: 12 steps x 2 prompts x 8 completions of procedural level-1 tasks: a run a 2-core CPU finishes
    steps: int = bounded(12, ge=1, le=MAX_STEPS)
    accum: int = bounded(2, ge=1, le=65536)  # the P * G completions of a step go through in this many micro-batches
    log_every: int = bounded(1, ge=1, le=MAX_STEPS)  # a metrics.jsonl record every N steps: the means over those N steps
    checkpoint_every: int = bounded(4, ge=1, le=MAX_STEPS)  # save a resumable checkpoint every N steps
    keep_checkpoints: int = bounded(2, ge=1, le=1000)  # checkpoints kept (older ones deleted)
    max_consecutive_skips: int = bounded(3, ge=1, le=MAX_STEPS)  # non-finite steps in a row before the run stops
    seed: int = bounded(0, ge=0, le=MAX_SEED)  # seed of initialisation, prompt order and sampling


@attrs.frozen(kw_only=True)
class Config:
    model: str | None = bounded(None, nonempty=True)  # None: embedded SmolLM2-135M-Instruct GGUF; or a dir / hub id
    # MLX's CPU quantised matmul is far slower than float BLAS, so on CPU the 4-bit base is
    # dequantised (to float32: CPU float16 matmuls skip BLAS) for plain LoRA; keep it quantised
    # (QLoRA, --dequantize false) on a GPU.
    dequantize: bool = True
    lora: LoraConfig = LoraConfig(rank=8, alpha=16.0, targets=("q_proj", "v_proj"))
    lora_layers: int | None = bounded(None, ge=1, le=4096)  # LoRA on the last N blocks (None = all)
    # lr 2e-4: the learning run of --preset gpu used it (docs/performance.md)
    optim: OptimConfig = OptimConfig(name="adamw", lr=2e-4, weight_decay=0.0, warmup_steps=0,
                                     total_steps=12, clip_norm=1.0)
    prompts_per_step: int = bounded(2, ge=1, le=65536)
    group_size: int = bounded(8, ge=1, le=65536)
    temperature: float = bounded(0.8, gt=0, le=100)  # sampling; 0 (greedy) would make every group identical
    top_p: float = bounded(0.95, gt=0, le=1)
    max_new_tokens: int = bounded(160, ge=1, le=MAX_NEW_TOKENS)
    # rollout decoding (mlxio.rl.rollout.generate_group's engine): "static" (compiled fixed-shape
    # step), "batch" (mlx-lm's BatchGenerator), "auto" (static on a GPU, batch on the CPU)
    rollout_engine: str = bounded("auto", choices=ENGINES, validator=attrs.validators.in_(ENGINES))
    # a completion ends once its first ``` code block closes (training and evaluation): the
    # talk after it costs decode time and is nothing the rewards read
    stop_at_code_end: bool = True
    advantage: str = bounded("grpo", choices=("grpo", "baseline"), validator=attrs.validators.in_(("grpo", "baseline")))
    beta: float = bounded(0.04, ge=0, le=100)  # KL(policy || LoRA-off reference) weight
    clip_eps: float | None = bounded(None, gt=0, lt=1)  # PPO ratio clipping; set it when inner_epochs > 1
    inner_epochs: int = bounded(1, ge=1, le=100)
    # loss aggregation, clip-higher, GSPO ratios, entropy, dynamic sampling, truncation masking
    # (mlxcore.rl.policy.GrpoConfig; docs/rlaif.md says when to use each)
    grpo: GrpoConfig = GrpoConfig()
    # mx.compile the update step and the rollout's decode step. None (auto): yes, except on a
    # CUDA device, where each fused kernel costs seconds of NVRTC compilation on a fresh machine
    # and later steps gain little from it - there both run eagerly unless set true (the gpu and
    # full presets do)
    compile: bool | None = None
    rewards: RewardConfig = RewardConfig()
    teacher: TeacherConfig = TeacherConfig()
    sandbox: SandboxConfig = SandboxConfig()
    data: DataConfig = DataConfig()
    eval: EvalConfig = EvalConfig(max_new_tokens=256, batch=16)  # all held-out problems
    train: TrainConfig = TrainConfig()
    memory: MemoryConfig = MemoryConfig()
    shapes: ShapesConfig = ShapesConfig()
    # also report each record to: "tensorboard" (event files in out_dir/tensorboard), "wandb"
    # (Weights & Biases; offline unless WANDB_MODE is set); metrics.jsonl always
    report_to: tuple[str, ...] = ()
    out_dir: str = bounded("runs/rlaif_quick", nonempty=True)

    # old setting names, still read (with a warning) from flags, config files, worker clients
    # and the config recorded in older checkpoints (`--resume` says which were renamed)
    LEGACY_KEYS: ClassVar[dict[str, str | None]] = {
        "out": "out_dir", "accumulation": "train.accum",
        **{name: f"train.{name}" for name in ("steps", "accum", "log_every", "checkpoint_every", "keep_checkpoints",
                                              "max_consecutive_skips", "seed")},
        "eval_micro_batches": "memory.eval_micro_batches"}
    # settings that follow another unless given themselves: the schedule spans the run
    DERIVED: ClassVar[dict[str, str]] = {"optim.total_steps": "train.steps"}


PRESETS = presets.load("rlaif_qwen", Config)  # recipes/presets/rlaif_qwen_*.py


def load_policy(cfg: Config) -> llm.Policy:
    """The policy `cfg` trains: `mlxio.rl.grpo.load_model` with its model, LoRA, seed, the
    frozen base's dtype and the generation lengths to check against the model."""
    return grpo.load_model(cfg.model, cfg.lora, cfg.lora_layers, cfg.train.seed, dequantize=cfg.dequantize,
                           compute_dtype=cfg.memory.compute_dtype,
                           lengths={"max_new_tokens": cfg.max_new_tokens, "eval.max_new_tokens": cfg.eval.max_new_tokens})


def open_session(cfg: Config, world: distributed.World = distributed.SINGLE) -> session.Session:
    """The policy `cfg` trains, once its step's memory is known to fit (`memory_bounds.check_rlaif`,
    before any rollout), with its compiled step over this rank's loss, LoRA tree, optimizer
    state and run identity (`mlxio.rl.session.build`): the recipe's and the worker's one builder."""
    policy = load_policy(cfg)
    memory_bounds.check_rlaif(policy.config, prompts_per_step=cfg.prompts_per_step, group_size=cfg.group_size,
                       max_new_tokens=cfg.max_new_tokens, accum=cfg.train.accum, ev=cfg.eval, world_size=world.size,
                       where=str(policy.source or cfg.model))
    loss = distributed.data_parallel_loss(loss_fn(policy.model, cfg, world), world)
    return session.build(policy, loss, cfg.optim, seed=cfg.train.seed, jit=kernel_cache.use_compile(cfg.compile),
                         run_id=grpo.run_identity(to_dict(cfg), policy), reduce_grads=distributed.grad_reducer(world),
                         eval_micro_batches=cfg.memory.eval_micro_batches)


def loss_fn(model, cfg: Config, world: distributed.World = distributed.SINGLE):
    """The update's loss under `cfg` (`mlxio.rl.grpo.make_loss`; `world`: the ranks it spans)."""
    return grpo.make_loss(model, cfg.beta, cfg.clip_eps, cfg.grpo, cfg.memory, world)


def batch_settings(cfg: Config) -> dict:
    """`mlxio.rl.grpo.build_batch`'s settings under `cfg` (keyword arguments)."""
    return {"accum": cfg.train.accum, "max_new_tokens": cfg.max_new_tokens, "beta": cfg.beta,
            "clip_eps": cfg.clip_eps, "grpo": cfg.grpo, "logprob_chunk": cfg.memory.logprob_chunk}


def shape_plan(cfg: Config, prompt_lengths, prompts: int, rows: int) -> ShapePlan:
    """Every array shape of a step under `cfg` (`mlxio.rl.shapes.plan`) for training prompts of
    `prompt_lengths` tokens, `prompts` prompts and `rows` completions per step on this rank."""
    return shapes.plan(cfg.shapes, prompt_lengths=prompt_lengths, prompts=prompts, rows=rows,
                       max_new_tokens=cfg.max_new_tokens, accum=cfg.train.accum,
                       logprob_chunk=cfg.memory.logprob_chunk, one_graph=not cfg.memory.eval_micro_batches)


def reward_fns(cfg: Config) -> list:
    """[(reward, weight)] of `cfg`'s rewards, teacher and sandbox (`mlxio.rl.rewards.from_config`)."""
    judge = VerdictJudgeReward(cfg.teacher.judge) if cfg.teacher.judge else None  # --teacher.judge: batched, in process
    return rewards.from_config(cfg.rewards, cfg.teacher, cfg.sandbox, cfg.dequantize, verdict_judge=judge)


def validate_grpo(cfg: Config) -> None:
    """The GRPO controls that need another option (ConfigError names the field)."""
    g = cfg.grpo
    if cfg.clip_eps is None and g.clip_eps_high is not None:
        raise ConfigError("grpo.clip_eps_high: the upper clipping bound needs the lower one",
                          fix="set --clip_eps too (e.g. 0.2 with --grpo.clip_eps_high 0.28)")
    if cfg.clip_eps is None and g.importance_ratio == "sequence":
        raise ConfigError("grpo.importance_ratio: 'sequence' (GSPO) clips sequence ratios",
                          fix="set --clip_eps and --grpo.clip_eps_high (GSPO used 3e-4 and 4e-4)")
    if g.entropy_target is not None and not g.entropy_coef:
        raise ConfigError("grpo.entropy_target: the penalty has no weight",
                          fix="set --grpo.entropy_coef > 0 too (e.g. 0.01)")


def validate(cfg: Config, source: str = "config") -> None:
    """Every field against its declared range (`mlxio.run.checks.check`), then the cross-field
    checks the field types cannot express (ConfigError names the field, and `source` where
    the error names no place of its own)."""
    try:
        _validate(cfg)
    except ConfigError as err:
        if err.where is None:
            err.where = source
        raise


def _validate(cfg: Config) -> None:
    check(cfg)
    validate_data(cfg.data)
    if cfg.advantage == "grpo" and cfg.group_size < 2:
        raise ConfigError(f"group_size: {cfg.group_size} completion per prompt gives every GRPO advantage 0 "
                          "(nothing to learn)", fix="set --group_size 2 or more, or --advantage baseline")
    if cfg.clip_eps is None and cfg.inner_epochs > 1:
        raise ConfigError("inner_epochs > 1 reuses a batch: set --clip_eps (e.g. 0.2)")
    validate_grpo(cfg)
    if cfg.lora.dropout:
        raise ConfigError("lora.dropout: not supported by the RLAIF policy (its forward takes no PRNG key); set 0")
    if (cfg.prompts_per_step * cfg.group_size) % cfg.train.accum:
        raise ConfigError(f"train.accum={cfg.train.accum} must divide prompts_per_step * "
                          f"group_size = {cfg.prompts_per_step * cfg.group_size}")
    if cfg.teacher.scoring not in ("text", "verdict"):
        raise ConfigError(f"teacher.scoring: must be 'text' or 'verdict', got "
                          f"{cfg.teacher.scoring!r}")
    if cfg.teacher.url is not None:
        check_url("teacher.url", cfg.teacher.url)
    if not cfg.lora.targets:
        raise ConfigError("lora.targets: empty: no layer would train", fix="set --lora.targets, e.g. q_proj,v_proj")
    for part in cfg.memory.recompute:
        if part not in RECOMPUTABLE:
            raise ConfigError(f"memory.recompute: unknown part {part!r}", fix="choose from " + ", ".join(RECOMPUTABLE)
                              + " (or give none)")
    if cfg.model is not None and cfg.model.startswith(TINY_PREFIX) and \
            cfg.model[len(TINY_PREFIX):].removesuffix("-q4") not in TINY_KINDS:
        raise ConfigError(f"model: {cfg.model!r} names no tiny model", fix="set --model to "
                          + ", ".join(f"{TINY_PREFIX}{k}[-q4]" for k in TINY_KINDS) + ", a model folder, .gguf or hub id")
    check_schedule(cfg.optim, cfg.train.steps)
