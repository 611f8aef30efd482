"""Where the host's time goes while MLX queues the retriever's training step (GPU machines).

    python -m dev.host_profile --machine h100 [--model t5-base --batch 128]
    python -m dev.host_profile --machine h100 --summarize samples.txt   # JSON from a raw file

Builds the step exactly as `benchmarks.retriever` does (its MLX child, in this process), warms
it up, then queues steps back to back for `--seconds` (waiting for the GPU every 5, as the
retriever benchmark's timed repeats do) while py-spy samples this process with native frames
(`--rate` a second; py-spy pauses the process to sample, so steps run slower than unsampled).
The raw samples (py-spy's collapsed stacks) are written beside the JSON; the JSON gives each
sample's innermost MLX primitive (`<Primitive>::eval_gpu`) or else what the host was doing:
committing CUDA graphs, replaying the compiled function, waiting for the GPU (MLX's throttle on
queued work and the benchmark's waits) or Python. py-spy is not a dependency of the project:
`pip install py-spy` on the machine that runs this.
"""

from __future__ import annotations

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # first: MLX's CPU BLAS is chosen when mlx.core loads (mlxio.runtime)

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from benchmarks.common import machine, versions

WAITS = ("pthread_cond_wait", "synchronize", "cudaStreamSynchronize")


def _frames(stack: str) -> list[str]:
    return [re.sub(r" \(.*\)$", "", f) for f in stack.split(";")]


def classify(frames: list[str]) -> str:
    """What one sample's stack was doing (see the module docstring)."""
    for f in frames:
        m = re.match(r"mlx::core::(?:fast::)?(\w+)::eval_gpu", f)
        if m:
            return m.group(1)
    for f in reversed(frames):
        if any(w in f for w in WAITS):
            return "<waiting for the GPU>"
    for name, label in (("CommandEncoder::commit", "<committing CUDA graphs>"),
                        ("compile_replace", "<replaying the compiled graph>"),
                        ("eval_impl", "<MLX eval, other>")):
        if any(name in f for f in frames):
            return label
    return "<Python and other>"


def summarize(raw: str) -> dict:
    """py-spy raw output (one `frame;frame;... count` line per stack) -> shares of samples."""
    total, kinds, inclusive = 0, collections.Counter(), collections.Counter()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n, frames = int(count), _frames(stack)
        total += n
        kinds[classify(frames)] += n
        for f in set(frames):
            if f.startswith(("mlx::", "cublas", "cuda", "cudnn")):
                inclusive[f[:120]] += n
    if not total:
        raise ValueError("no samples in the py-spy output")
    share = lambda c: {k: round(v / total, 4) for k, v in c.most_common(40)}  # noqa: E731
    return {"samples": total, "by_kind": share(kinds), "inclusive_top": share(inclusive)}


def record(args) -> tuple[str, dict]:
    """Run the step under py-spy; returns (raw samples, loop figures)."""
    from benchmarks import retriever as rb

    loop: dict = {}
    raw_path = Path(tempfile.mkdtemp()) / "samples.txt"
    original = rb._timed

    def sampled(fn, sync, steps, repeats, warmup, host=None):
        if fn.__name__ != "one":  # the encode benchmark, if any
            return original(fn, sync, steps, repeats, warmup, host)
        for _ in range(5):
            fn()
        sync()
        spy = subprocess.Popen(["py-spy", "record", "--pid", str(os.getpid()), "--native", "-r", str(args.rate),
                                "-d", str(int(args.seconds) + 3), "--format", "raw", "-o", str(raw_path)])
        time.sleep(1.0)
        start, n = time.perf_counter(), 0
        while time.perf_counter() - start < args.seconds:
            fn()
            n += 1
            if n % 5 == 0:
                sync()
        sync()
        loop.update(steps=n, s_per_step_sampled=(time.perf_counter() - start) / n)
        spy.wait()
        return original(fn, sync, steps, 1, 0, host)

    rb._timed = sampled
    rb.main(["--machine", args.machine, "--no-encode", "--check-steps", "2", "--child", args.model, "mlx",
             str(args.batch)])
    return raw_path.read_text(), loop


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--machine", default="h100", help="results subfolder")
    ap.add_argument("--model", default="t5-base")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--seconds", type=float, default=22.0, help="seconds of sampled steps")
    ap.add_argument("--rate", type=int, default=40, help="samples a second")
    ap.add_argument("--summarize", type=Path, help="only summarize this py-spy raw file")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    out = args.out or Path(__file__).parent / "results" / args.machine / f"host_profile_{args.model}.json"
    if args.summarize:
        raw, meta = args.summarize.read_text(), {"summarized_from": str(args.summarize)}
    else:
        from benchmarks.gpu_common import gpu_name

        raw, loop = record(args)
        out.with_suffix(".samples.txt").write_text(raw)
        meta = {"machine": machine(), "versions": versions(), "gpu": gpu_name(), "loop": loop}
    result = {"benchmark": "host_profile", "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), **meta,
              "settings": {"model": args.model, "batch": args.batch, "seconds": args.seconds, "rate": args.rate,
                           "sampler": "py-spy record --native --format raw (pauses the process to sample)"},
              **summarize(raw)}
    out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: result[k] for k in ("samples", "by_kind")}, indent=1), file=sys.stderr)
    return result


if __name__ == "__main__":
    main()
