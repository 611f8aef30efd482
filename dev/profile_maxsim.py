"""Where the MLX retriever step's time goes at batch 128: MaxSim's broadcast matmul.

`mlxcore.retrieval.late_interaction.token_similarities` computes q[:, None] @ d[None]^T, a broadcast batched
matmul [Bq, 1, Tq, D] @ [1, Bd, D, Td]; PyTorch's einsum turns the same product into ONE GEMM
[Bq*Tq, D] @ [D, Bd*Td]. This times forward+backward of MaxSim both ways (and the encoder's
share of the step) on the benchmark's shapes, to show whether the broadcast form is the gap.

    python -m dev.profile_maxsim --machine h100
"""

from __future__ import annotations

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # first: MLX's CPU BLAS is chosen when mlx.core loads (mlxio.runtime)

import argparse
import statistics
import time

import mlx.core as mx

from mlxcore.retrieval import late_interaction


def gemm_similarities(q, d):
    """Same values as token_similarities through one 2-D GEMM: [Bq, Bd, Tq, Td]."""
    bq, tq, dim = q.shape
    bd, td, _ = d.shape
    return (q.reshape(-1, dim) @ d.reshape(-1, dim).T).reshape(bq, tq, bd, td).transpose(0, 2, 1, 3)


def timed(fn, *args, repeats=10) -> float:
    for _ in range(3):
        mx.eval(fn(*args))
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        mx.eval(fn(*args))
        out.append(time.perf_counter() - start)
    return statistics.median(out)


def main(argv=None) -> dict:
    from benchmarks.gpu_common import write
    from dev import RESULTS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--machine", default="h100")
    ap.add_argument("--batch", type=int, default=128)
    args = ap.parse_args(argv)
    dtype = mx.float32 if args.machine == "cpu" else mx.bfloat16
    rows = []
    for name, dim in (("minilm", 384), ("t5-base (xtr projection)", 128)):
        q = late_interaction.l2_normalize(mx.random.normal((args.batch, 32, dim))).astype(dtype)
        d = late_interaction.l2_normalize(mx.random.normal((args.batch, 256, dim))).astype(dtype)
        qm, dm = mx.ones((args.batch, 32)), mx.ones((args.batch, 256))

        def loss(q, d, sims_fn, qm=qm, dm=dm):
            s = sims_fn(q, d)
            s = mx.where(dm.astype(mx.bool_)[None, :, None, :], s, late_interaction.NEG)
            scores = late_interaction._mean_over_query(s.max(-1), qm[:, None, :])
            return late_interaction.contrastive_loss(scores)[0]

        row = {"model": name, "batch": args.batch, "dim": dim}
        for label, fn in (("broadcast (current)", late_interaction.token_similarities), ("one GEMM", gemm_similarities)):
            grad = mx.compile(mx.value_and_grad(lambda q, d, fn=fn: loss(q, d, fn), argnums=(0, 1)))
            mx.reset_peak_memory()
            row[f"{label} fwd+bwd s"] = timed(grad, q, d)
            row[f"{label} peak bytes"] = mx.get_peak_memory()
        print(row, flush=True)
        rows.append(row)
    write("profile_maxsim", {"settings": {"dtype": str(dtype), "query_len": 32, "doc_len": 256},
                             "runs": rows}, args.machine, root=RESULTS)
    return {"runs": rows}


if __name__ == "__main__":
    main()
