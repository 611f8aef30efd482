"""The retriever's CPU training with glibc's malloc defaults against freed memory kept (in one run).

Each variant is the `quick` recipe in its own process (`python -m recipes.xtr_lora --preset
quick`, a few steps, the evaluation shrunk to 60 queries over 200 candidates):
`MLXIO_MALLOC=glibc` leaves glibc's defaults (large buffers mmap'd and unmapped, the heap
trimmed), the default keeps freed memory for reuse (`mlxio.host_memory`). A first run fills
the caches (mined corpus, untrained evaluation) so that both variants find them warm. Reported
per variant: the training phase's wall time and samples/s, the process's minor page faults,
user and system CPU time and peak resident set (`os.wait4`), and the losses, which must be the
same: the memory allocator changes no arithmetic. Writes benchmarks/results/<machine>/cpu_malloc.json.

    python -m benchmarks.cpu_malloc [--steps 3] [--repeats 1]
"""

from __future__ import annotations

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # (this process runs no MLX work; every entry point calls it first)

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import load

SHRUNK_EVAL = ["--export", "false", "--data.eval_queries", "60", "--data.dev_queries", "60",
               "--data.package_eval_queries", "60", "--data.package_dev_queries", "60",
               "--data.min_eval_queries", "50", "--data.max_eval_candidates", "200",
               "--data.package_eval_candidates", "200", "--data.min_eval_candidates", "100"]


def recipe_argv(steps: int, out_dir: Path, cache_dir: str) -> list[str]:
    """`recipes.xtr_lora`'s arguments: `quick` for `steps` steps, its evaluation shrunk."""
    return ["--preset", "quick", "--out_dir", str(out_dir), "--cache_dir", cache_dir, "--train.steps", str(steps),
            "--optim.total_steps", str(steps), "--optim.warmup_steps", "1", *SHRUNK_EVAL]


def run_recipe(malloc: str, steps: int, out_dir: Path, cache_dir: str) -> dict:
    """One `quick` run of `steps` steps with MLXIO_MALLOC=`malloc`; its training phase, losses
    and the child's resource usage."""
    cmd = [sys.executable, "-m", "recipes.xtr_lora", *recipe_argv(steps, out_dir, cache_dir)]
    log = out_dir.with_suffix(".log")
    with open(log, "w") as handle:
        proc = subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT,
                                env={**os.environ, "MLXIO_MALLOC": malloc})
        _, status, usage = os.wait4(proc.pid, 0)  # (Popen.wait would not give the child's rusage)
    if code := os.waitstatus_to_exitcode(status):
        raise SystemExit(f"cpu_malloc: {' '.join(cmd)} failed ({code}): {log.read_text()[-2000:]}")
    run = json.loads((out_dir / "eval.json").read_text())["run"]
    metrics = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return {"malloc": malloc, "train_s": run["phases"]["train"]["wall_s"], "samples_per_s": run["samples_per_s"],
            "total_s": run["phases"]["total"]["wall_s"],
            "losses": [m["loss"] for m in metrics if "loss" in m and "step" in m],
            "minor_faults": usage.ru_minflt, "user_s": usage.ru_utime, "system_s": usage.ru_stime,
            "max_rss_mb": usage.ru_maxrss / 1024}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--steps", type=int, default=3, help="training steps of 256 pairs per run")
    ap.add_argument("--repeats", type=int, default=1, help="runs of each variant, alternating")
    ap.add_argument("--machine", default="cpu")
    ap.add_argument("--cache_dir", default="runs/.cache", help="the recipe's cache (mined corpus, untrained evaluation)")
    ap.add_argument("--out", default=None, help="write the JSON here instead")
    args = ap.parse_args(argv)
    if not 2 <= args.steps <= 100 or not 1 <= args.repeats <= 10:
        ap.error(f"--steps {args.steps} / --repeats {args.repeats}: give 2 to 100 steps and 1 to 10 repeats")
    from benchmarks.gpu_common import write

    with tempfile.TemporaryDirectory(prefix="cpu_malloc_") as tmp:
        run_recipe("keep", 2, Path(tmp) / "prime", args.cache_dir)  # corpus and untrained evaluation cached
        runs = [run_recipe(malloc, args.steps, Path(tmp) / f"{malloc}_{i}", args.cache_dir)
                for i in range(args.repeats) for malloc in ("glibc", "keep")]
    for r in runs:
        print({k: (round(v, 2) if isinstance(v, float) else v) for k, v in r.items() if k != "losses"}, flush=True)
    same = all(r["losses"] == runs[0]["losses"] for r in runs)
    if not same:
        raise SystemExit(f"cpu_malloc: the variants' losses differ: {[r['losses'] for r in runs]}")

    def mean(malloc: str, key: str) -> float:
        values = [r[key] for r in runs if r["malloc"] == malloc]
        return sum(values) / len(values)

    payload = {"settings": {"preset": "quick", "steps": args.steps, "contrastive_batch": 256,
                            "repeats": args.repeats, "evaluation": "60 queries over 200 candidates",
                            "command": "python -m benchmarks.cpu_malloc " + " ".join(sys.argv[1:] if argv is None else argv)},
               "runs": runs, "same_losses": same,
               "keep_over_glibc": {"train_speedup": mean("glibc", "train_s") / mean("keep", "train_s"),
                                   "minor_faults": mean("keep", "minor_faults") / mean("glibc", "minor_faults"),
                                   "system_s": mean("keep", "system_s") / mean("glibc", "system_s"),
                                   "max_rss": mean("keep", "max_rss_mb") / mean("glibc", "max_rss_mb")}}
    print(json.dumps(payload["keep_over_glibc"], indent=1))
    write("cpu_malloc", payload, args.machine, args.out)
    return payload


def results_section() -> list[str]:
    """The retriever's CPU training with glibc's malloc defaults and with freed memory kept."""
    b = load("cpu", "cpu_malloc")
    if not b:
        return []
    s = b["settings"]
    rows = [f"| {r['malloc']} | {r['train_s']:.1f} | {r['samples_per_s']:.2f} | {r['minor_faults'] / 1e6:.2f} M "
            f"| {r['user_s']:.0f} | {r['system_s']:.0f} | {r['max_rss_mb']:,.0f} |" for r in b["runs"]]
    k = b["keep_over_glibc"]
    return [f"### Linux CPU: glibc's malloc defaults vs freed memory kept (cpu, {b['machine']['cpu_count']} cores; "
            "benchmarks/cpu_malloc.py)", "",
            f"`{s['command']}`: the `quick` recipe, {s['steps']} steps of {s['contrastive_batch']} pairs, each run "
            "in its own process, variants alternating; the same losses in every run "
            f"({'yes' if b['same_losses'] else 'NO'}).", "",
            "| malloc | training s | samples/s | minor page faults | user CPU s | system CPU s | peak RSS MB |",
            "|---|---|---|---|---|---|---|", *rows, "",
            f"Kept over glibc's defaults: training {k['train_speedup']:.2f}x as fast, {k['minor_faults']:.2f}x the page "
            f"faults, {k['system_s']:.2f}x the system CPU time, {k['max_rss']:.2f}x the peak resident set.", ""]


if __name__ == "__main__":
    main()
