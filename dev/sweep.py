"""The seed's sweep on the retriever step (MLX): per batch size, N compiled steps over distinct
real batches (stdlib pairs, query 32 / document 256 tokens), with throughput, peak memory
(`--profile-memory`: mx.get_peak_memory around each batch size) and the loss after N steps.

    python -m dev.sweep --machine h100 --model t5-base --batch-sizes 16 32 64 --num-steps 100 --profile-memory
"""

from __future__ import annotations

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # first: MLX's CPU BLAS is chosen when mlx.core loads (mlxio.runtime)

import argparse
import statistics
import time

import mlx.core as mx

from benchmarks import retriever_models as rm
from dev import RESULTS


def run(model, projection, name: str, batch: int, steps: int, dtype, doc_len: int, profile: bool) -> dict:
    from mlxcore.retrieval.objective import LossConfig, contrastive_loss_fn
    from mlxcore.train import lora
    from mlxcore.train.optim import OptimConfig, make_optimizer
    from mlxcore.train.step import init_state, make_train_step
    from mlxcore.train.tree import combine, map_leaves

    base = rm.mlx_params(model, projection)
    adapters = lora.init(mx.random.key(0), lora.target_dims(base, rm.TARGETS[name]), rm.LORA_RANK)
    params = map_leaves(lambda x: x.astype(dtype), combine(base, adapters))
    opt = make_optimizer(OptimConfig(lr=2e-4, warmup_steps=10, total_steps=steps, weight_decay=0.0))
    step = make_train_step(contrastive_loss_fn(rm.encoder_spec(model), LossConfig()), opt)
    state = init_state(opt, params)
    data = rm.pair_batches(batch * steps)
    data["doc_ids"], data["doc_mask"] = data["doc_ids"][:, :doc_len], data["doc_mask"][:, :doc_len]
    mx.clear_cache()
    if profile:
        mx.reset_peak_memory()
    times, losses = [], []
    for n in range(steps):
        b = {k: mx.array(v[n * batch:(n + 1) * batch][None]) for k, v in data.items()}
        start = time.perf_counter()
        params, state, metrics = step(params, state, b, mx.array(n))
        mx.eval(params, state, metrics)
        times.append(time.perf_counter() - start)
        losses.append(metrics["loss"].item())
    steady = times[2:] if steps > 4 else times
    sec = statistics.median(steady)
    out = {"batch": batch, "steps": steps, "first_step_s": times[0], "median_step_s": sec,
           "samples_per_s": batch / sec, "tokens_per_s": batch * (rm.QUERY_LEN + doc_len) / sec,
           "total_s": sum(times), "loss_first": losses[0], "loss_after_n": losses[-1],
           "loss_mean_last10": statistics.fmean(losses[-10:]), "losses": losses}
    if profile:
        out["peak_memory_bytes"] = mx.get_peak_memory()
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--machine", default="cpu")
    ap.add_argument("--model", default="t5-base", choices=rm.MODELS)
    ap.add_argument("--batch-sizes", nargs="+", type=int, default=[16, 32, 64])
    ap.add_argument("--num-steps", type=int, default=100)
    ap.add_argument("--doc-len", type=int, default=rm.DOC_LEN)
    ap.add_argument("--profile-memory", action="store_true")
    args = ap.parse_args(argv)
    dtype = mx.float32 if args.machine == "cpu" else mx.bfloat16
    model, projection, real = rm.torch_model(args.model)
    rows = []
    for batch in args.batch_sizes:
        rows.append(run(model, projection, args.model, batch, args.num_steps, dtype, args.doc_len,
                        args.profile_memory))
        print({k: v for k, v in rows[-1].items() if k != "losses"}, flush=True)
        payload = save(args, real, dtype, rows)  # after each batch size: a killed run keeps what it did
    return payload


def save(args, real, dtype, rows) -> dict:
    from benchmarks.gpu_common import write

    payload = {"settings": {"model": args.model, "real_weights": real, "dtype": str(dtype),
                            "query_len": rm.QUERY_LEN, "doc_len": args.doc_len,
                            "num_steps": args.num_steps, "device": str(mx.default_device())},
               "runs": rows}
    write(f"sweep_{args.model}", payload, args.machine, root=RESULTS)
    return payload


if __name__ == "__main__":
    main()
