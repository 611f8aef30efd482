"""Probe: peak MLX memory of the retriever's training step at one micro-batch size.

    python -m mlxio.run.batch_probe '{"micro_batch": 8, "query_len": 32, "doc_len": 128}'

Runs in a child process of the trainer (`mlxio.run.batch_sizer`): MLX aborts the whole process
when an allocation fails, so the limit is looked for here, where an abort costs only this
probe. Builds the encoder + LoRA as the recipe does, runs `steps` compiled training steps on a
full-length synthetic batch of `accum` micro-batches (every position real: the worst case at
these lengths) and prints one JSON line: {"micro_batch", "accum", "peak_bytes", "base_bytes",
"seconds_per_step"}.
"""

from __future__ import annotations

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # first: MLX's CPU BLAS is chosen when mlx.core loads (mlxio.runtime)

import json
import os
import sys
import time

import attrs
import mlx.core as mx
import numpy as np

from mlxcore.retrieval import objective
from mlxcore.train import lora
from mlxcore.train.optim import OptimConfig, make_optimizer
from mlxcore.train.precision import cast_frozen
from mlxcore.train.step import init_state, make_train_step
from mlxcore.train.tree import combine
from mlxio.errors import ConfigError, MlxioError
from mlxio.weights.encoders import default_encoder_path, load_encoder
from mlxio.weights.quantize import parse_rules


@attrs.frozen(kw_only=True)
class ProbeSpec:
    """What decides a training step's memory: model, adapter, lengths, options, micro-batch."""

    micro_batch: int
    accum: int = 1  # micro-batches per step: a compiled step holds more than one at a time
    model: str | None = None
    lora_rank: int = 16
    lora_alpha: float = 32.0
    targets: tuple[str, ...] = ()
    query_len: int = 32
    doc_len: int = 128
    gradient_checkpointing: bool = False
    compute_dtype: str = "float32"
    temperature: float = 0.07  # the recipe's loss config (cfg.loss; defaults as objective.LossConfig)
    margin: float = 0.2
    margin_weight: float = 0.1
    xtr_k_train: int = 0
    qat: tuple[str, ...] = ()  # quant rules fake-quantised in the step (QAT)
    steps: int = 2
    memory_limit_bytes: int = 0  # > 0: the probe may not allocate more (see `limit_memory`)


def parse_spec(text: str) -> ProbeSpec:
    """ProbeSpec from JSON text; ConfigError naming the bad key."""
    try:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise TypeError("not a JSON object")
        data["targets"] = tuple(data.get("targets", ()))
        data["qat"] = tuple(data.get("qat", ()))
        return ProbeSpec(**data)
    except (json.JSONDecodeError, TypeError, ValueError) as err:
        raise ConfigError(f"batch_probe spec: {err}") from None


def build(spec: ProbeSpec):
    """(encoder spec, params, trainable predicate) as the recipe builds them, options applied."""
    encoder = load_encoder(spec.model or default_encoder_path(),
                           lora_scale=lora.LoraConfig(rank=spec.lora_rank, alpha=spec.lora_alpha).scale)
    targets = spec.targets or objective.DEFAULT_TARGETS[encoder.spec.kind]
    adapters = lora.init(mx.random.key(0), lora.target_dims(encoder.params, targets), spec.lora_rank)
    params = cast_frozen(combine(encoder.params, adapters), lora.is_lora_path, spec.compute_dtype)
    return objective.with_checkpointing(encoder.spec, spec.gradient_checkpointing), params, lora.is_lora_path


def loss_of(spec: ProbeSpec, enc_spec):
    """The recipe's training loss at the spec's settings (`objective.training_loss`)."""
    cfg = objective.LossConfig(temperature=spec.temperature, margin=spec.margin, margin_weight=spec.margin_weight,
                               xtr_k_train=spec.xtr_k_train)
    scale = lora.LoraConfig(rank=spec.lora_rank, alpha=spec.lora_alpha).scale
    return objective.training_loss(enc_spec, cfg, parse_rules(spec.qat, "qat"), scale)


def synthetic_batch(vocab_size: int, micro_batch: int, accum: int, query_len: int, doc_len: int,
                    seed: int = 0) -> dict[str, mx.array]:
    """A full-length batch {query_ids, query_mask, doc_ids, doc_mask}, leaves [accum, micro, T]:
    every position real, the worst case for memory at these lengths."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, length in (("query", query_len), ("doc", doc_len)):
        out[f"{name}_ids"] = mx.array(rng.integers(1, vocab_size, (accum, micro_batch, length)).astype(np.int32))
        out[f"{name}_mask"] = mx.ones((accum, micro_batch, length), mx.int32)  # as token_cache gives
    return out


def enforce_limit(limit_bytes: int) -> None:
    """Die as an out-of-memory device would once MLX's peak passes `limit_bytes`.

    MLX's GPU allocators enforce `mx.set_memory_limit` (and abort the process past it); its CPU
    allocator is plain malloc and does not, and capping the data segment with setrlimit hung the
    CPU build here instead of failing. So on every device the probe also checks its own peak
    after each step and aborts (SIGABRT, as MLX does) when it is over the limit.
    """
    if mx.get_peak_memory() > limit_bytes:
        print(f"batch_probe: peak {mx.get_peak_memory()} B over the limit {limit_bytes} B", file=sys.stderr,
              flush=True)
        os.abort()


def measure(spec: ProbeSpec) -> dict:
    """Run the probe in this process; returns what `main` prints."""
    if spec.memory_limit_bytes > 0:
        mx.set_memory_limit(spec.memory_limit_bytes)
    enc_spec, params, trainable = build(spec)
    optimizer = make_optimizer(OptimConfig(lr=1e-4, warmup_steps=1, total_steps=10))
    step = make_train_step(loss_of(spec, enc_spec), optimizer, trainable=trainable)
    opt_state = init_state(optimizer, params, trainable)
    batch = synthetic_batch(enc_spec.model.vocab_size, spec.micro_batch, spec.accum,
                                           spec.query_len, spec.doc_len)
    mx.eval(params, opt_state, batch)
    base = mx.get_active_memory()
    mx.reset_peak_memory()
    times = []
    for i in range(spec.steps):
        tic = time.perf_counter()
        params, opt_state, metrics = step(params, opt_state, batch, mx.array(i))
        mx.eval(params, opt_state, metrics)
        times.append(time.perf_counter() - tic)
        if spec.memory_limit_bytes > 0:
            enforce_limit(spec.memory_limit_bytes)
    return {"micro_batch": spec.micro_batch, "accum": spec.accum, "peak_bytes": mx.get_peak_memory(),
            "base_bytes": base,
            "seconds_per_step": min(times)}


def main(argv: list[str]) -> None:
    if len(argv) != 1:
        raise SystemExit(__doc__)
    print(json.dumps(measure(parse_spec(argv[0]))), flush=True)


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except MlxioError as err:
        raise SystemExit(f"batch_probe: {err}") from None
