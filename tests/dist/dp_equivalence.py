"""Data-parallel equivalence worker: 5 optimizer steps of a recipe's real loss and step, on a
tiny model, over fixed global batches of 12 examples.

    mlx.launch -n 2 --backend ring -- python tests/dist/dp_equivalence.py OUT_DIR xtr rlaif
    python tests/dist/dp_equivalence.py OUT_DIR xtr        # one rank, the whole batch

Each rank keeps its share of every global batch (2 ranks x 6 rows, or 1 rank x 12) and rank 0
writes the final trainable weights (and per-step losses and metrics) to OUT_DIR/MODE.npz;
tests/mlxio/run/test_distributed.py compares them with `run(mode, SINGLE)`. Modes:
  xtr          retriever step, MaxSim + InfoNCE/margin, document embeddings gathered
  xtr_topk     the same with XTR in-batch token retrieval scores (top-k over all ranks' tokens)
  xtr_mlx_vjp  as xtr but gathering with MLX's own all_gather VJP (drops the other ranks'
               gradient terms): shows the comparison can fail
  rlaif        RLAIF policy loss (GRPO, PPO clipping, KL to LoRA-off reference); rewards
               gathered so group advantages are global, groups straddle the two ranks
  rlaif_dr_grpo, rlaif_dapo, rlaif_bnpo
               the same with each other loss type and the GRPO controls (`RLAIF_OPTIONS`):
               clip-higher, GSPO ratios, entropy bonus and target, equal-group skipping,
               truncation masking
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, for `python tests/dist/...`

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # first: MLX's CPU BLAS is chosen when mlx.core loads (mlxio.runtime)

import mlx.core as mx
import numpy as np

from mlxcore.models import bert
from mlxcore.train import lora
from mlxcore.retrieval.encoder import EncoderSpec
from mlxcore.train.optim import OptimConfig, make_optimizer
from mlxcore.train.step import init_state, make_train_step
from mlxcore.train.tree import combine, flatten, partition, unflatten
from mlxio.run import distributed

STEPS, GLOBAL_MICRO, ACCUM = 5, 12, 2
RANKS = 2  # the launched side of the comparison
# each RLAIF mode's GrpoConfig and inner epochs (the entropy target sits above the tiny model's
# ~5.4 nats: the penalty is on; a second epoch moves ratios off 1: some get clipped)
RLAIF_OPTIONS = {
    "rlaif": ({}, 1),
    "rlaif_dr_grpo": ({"loss_type": "dr_grpo", "entropy_coef": 0.01}, 1),
    "rlaif_dapo": ({"loss_type": "dapo", "clip_eps_high": 0.28, "entropy_coef": 0.01, "mask_truncated": True}, 2),
    "rlaif_bnpo": ({"loss_type": "bnpo", "importance_ratio": "sequence", "entropy_coef": 0.05,
                    "entropy_target": 8.0, "skip_equal_groups": True}, 1),
}
OPTIM = OptimConfig(name="adamw", lr=1e-2, weight_decay=0.01, warmup_steps=1, total_steps=STEPS)


def xtr_run(world: distributed.World, mode: str) -> tuple[dict, list[float]]:
    """Final LoRA weights and per-step losses of the retriever recipe's loss and step."""
    from mlxcore.retrieval.objective import LossConfig, contrastive_loss_fn

    cfg = bert.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                          intermediate_size=64, max_position_embeddings=32)
    shapes = sorted(bert.param_shapes(cfg).items())
    keys = mx.random.split(mx.random.key(1), len(shapes))
    # BERT-like init (LayerNorm 1 / 0): random LayerNorm affines collapse every token to one vector
    base = unflatten({k: mx.ones(s) if k.endswith("LayerNorm.weight") else mx.zeros(s) if k.endswith("LayerNorm.bias")
                      else 0.05 * mx.random.normal(s, key=key) for (k, s), key in zip(shapes, keys, strict=True)})
    params = combine(base, lora.init(mx.random.key(2), lora.target_dims(base, ("query", "value")), 4))
    spec = EncoderSpec(kind="bert", model=cfg, lora_scale=2.0)
    loss_cfg = LossConfig(xtr_k_train=6 if mode == "xtr_topk" else 0)
    gather = distributed.gather_rows
    if mode == "xtr_mlx_vjp":  # the recipe's loss looks gather_rows up at trace time
        distributed.gather_rows = lambda x, w: x if w.size == 1 else mx.distributed.all_gather(x, group=w.group)
    try:
        return _xtr_steps(world, params, spec, loss_cfg, contrastive_loss_fn, cfg.vocab_size)
    finally:
        distributed.gather_rows = gather


def _xtr_steps(world, params, spec, loss_cfg, contrastive_loss_fn, vocab_size):
    optimizer = make_optimizer(OPTIM)
    step = make_train_step(distributed.data_parallel_loss(contrastive_loss_fn(spec, loss_cfg, distributed.document_gather(world)), world),
                           optimizer, reduce_grads=distributed.grad_reducer(world), seed=0)
    state = init_state(optimizer, params)
    rng = np.random.default_rng(0)
    losses = []
    for i in range(STEPS):
        # each document repeats its query's tokens among random ones: a signal to learn
        q_ids = rng.integers(1, vocab_size, (ACCUM, GLOBAL_MICRO, 8))
        d_ids = np.concatenate([q_ids, rng.integers(1, vocab_size, q_ids.shape)], -1)
        batch = {"query_ids": q_ids, "doc_ids": rng.permuted(d_ids, axis=-1)}
        for field, length in (("query", 8), ("doc", 16)):
            lengths = rng.integers(length // 2, length + 1, (ACCUM, GLOBAL_MICRO))
            batch[f"{field}_mask"] = (np.arange(length) < lengths[..., None]).astype(np.int32)
        local = distributed.shard_rows(batch, world)
        params, state, metrics = step(params, state, {k: mx.array(v) for k, v in local.items()}, mx.array(i))
        mx.eval(params, state, metrics)
        losses.append(float(metrics["loss"]))
    return partition(params, lora.is_lora_path)[0], losses


def step_rows(world: distributed.World) -> np.ndarray:
    """The rows of each RLAIF step this process trains on, in order: on `RANKS` ranks rank r's
    contiguous share (as `grpo.rank_share` gives whole prompts); on one rank all of them,
    ordered as the ranks' micro-batches (rank 0's first, rank 1's first, then their second),
    so that one rank's micro-batch b holds every rank's b-th: bnpo's normaliser, the entropy
    target and the clip fraction are per micro-batch."""
    if world.size > 1:
        n = distributed.local_size(GLOBAL_MICRO, world, "completions")
        return np.arange(world.rank * n, (world.rank + 1) * n)
    return np.arange(GLOBAL_MICRO).reshape(RANKS, ACCUM, -1).transpose(1, 0, 2).reshape(-1)


def rlaif_run(world: distributed.World, mode: str = "rlaif") -> tuple[dict, list[dict]]:
    """Final LoRA weights and per-step metrics of the RLAIF recipe's loss, batch and step."""
    import attrs

    from mlxcore.rl import packing
    from mlxcore.train.lora import LoraConfig
    from mlxcore.rl.policy import GrpoConfig
    from mlxio.gpu import kernel_cache
    from mlxio.rl import grpo
    from mlxio.weights import llm, llm_lora
    from recipes import rlaif_qwen as rq
    from recipes.rlaif_config import TrainConfig, batch_settings, loss_fn, validate_grpo

    options, epochs = RLAIF_OPTIONS[mode]
    cfg = rq.Config(model="tiny:llama", train=TrainConfig(accum=ACCUM), beta=0.04, clip_eps=0.2,
                    lora=LoraConfig(rank=4, alpha=8.0, targets=("q_proj", "v_proj")),
                    optim=attrs.evolve(OPTIM, total_steps=STEPS * epochs), grpo=GrpoConfig(**options),
                    inner_epochs=epochs)
    validate_grpo(cfg)
    policy = llm.tiny_policy("llama", seed=0)
    model = policy.model
    params = llm_lora.apply_lora(model, cfg.lora, None, mx.random.key(cfg.train.seed))
    optimizer = make_optimizer(cfg.optim)
    step = make_train_step(distributed.data_parallel_loss(loss_fn(model, cfg, world), world), optimizer,
                           clip_norm=cfg.optim.clip_norm, seed=cfg.train.seed, reduce_grads=distributed.grad_reducer(world),
                           jit=kernel_cache.use_compile(cfg.compile))
    state = init_state(optimizer, params)
    mine = step_rows(world)
    rng = np.random.default_rng(0)
    records = []
    for i in range(STEPS):
        # 3 prompts x 4 completions, prompt-major: prompt 1's group straddles the two ranks
        prompts = [rng.integers(0, 256, rng.integers(3, 8)).tolist() for _ in range(3)]
        completions = [rng.integers(0, 256, rng.integers(1, 12)).tolist() for _ in range(GLOBAL_MICRO)]
        prompt_index = np.repeat(np.arange(3), 4)
        rewards = rng.random(GLOBAL_MICRO).astype(np.float32)
        if cfg.grpo.skip_equal_groups:
            rewards[8:] = 0.5  # prompt 2's group carries no signal: left out
        missing = np.zeros(GLOBAL_MICRO, bool)
        missing[5] = True  # a completion whose reward failed: masked out, its own group
        finished = np.array([len(c) < 10 for c in completions])  # the longest ones "hit max_new_tokens"
        # each rank scores only its completions; the group statistics see all of them
        adv = grpo.shared_advantages(rewards[mine], missing[mine], prompt_index[mine], cfg.advantage, world)
        rows, _ = grpo.update_rows(rewards[mine], missing[mine], prompt_index[mine], finished[mine], cfg.grpo, world)
        packed = packing.pack_tokens([prompts[p] for p in prompt_index[mine]], [completions[j] for j in mine])
        batch = grpo.build_batch(model, params, packed, adv, rows, **batch_settings(cfg), world=world)
        for epoch in range(cfg.inner_epochs):
            params, state, metrics = step(params, state, batch, mx.array(i * cfg.inner_epochs + epoch))
            mx.eval(params, state, metrics)
        records.append({k: float(v) for k, v in metrics.items()})
    return params, records


def run(mode: str, world: distributed.World) -> dict[str, np.ndarray]:
    """{dotted LoRA key: final weight} plus "losses" [STEPS] (and RLAIF's other metrics,
    "metric/NAME" [STEPS])."""
    if mode in RLAIF_OPTIONS:
        lora_tree, records = rlaif_run(world, mode)
        metrics = {f"metric/{k}": np.array([r[k] for r in records]) for k in records[0]}
        losses = [r["loss"] for r in records]
    else:
        (lora_tree, losses), metrics = xtr_run(world, mode), {}
    out = {k: np.array(v) for k, v in flatten(lora_tree).items()}
    out["losses"] = np.array(losses)
    return {**out, **metrics}


if __name__ == "__main__":
    world = distributed.init()
    out_dir = Path(sys.argv[1])
    for mode in sys.argv[2:]:
        result = run(mode, world)
        if world.is_main:
            np.savez(out_dir / f"{mode}.npz", world_size=world.size, **result)
    distributed.barrier(world)
