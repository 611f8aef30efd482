"""Cold start: time to the first training step (and to the first N) of the quick retriever run
and the RLAIF quick run, with a fresh and then a warm on-disk kernel cache.

Each run is a fresh process (`--child`) that runs the recipe's own `main` with its quick preset
and stops once the N-th step's metrics record is written (no final evaluation or export). The
child times, from its own start (before MLX is imported): `setup_s` (to the start of the first
step: imports, weights, data, compilation of nothing yet), `first_step_s` (the first step alone:
mx.compile tracing and, on a GPU, NVRTC kernel compilation for its shapes) and `steps_s` (the end
of each of the first N steps); `recipe_imported_s` (the recipe module imported: MLX, mlx-lm,
transformers) and, in `compile_log`, the setup's phases as the recipe logs them (mlxio.phases).
The kernel cache (`MLXIO_KERNEL_CACHE`, see mlxio.gpu.kernel_cache)
is a new empty folder for the "fresh" run and the same folder again for the "warm" run; a
"prime" run with its own throw-away kernel cache fills the data caches first (mined pairs,
token cache, the retriever's untrained baseline), so fresh and warm differ only in kernels.
The RLAIF runs skip the evaluation before training (`--eval.before false`); without bwrap the
execution reward is switched off (recorded). A run that fails or times out keeps its error.

    python -m benchmarks.cold_start --machine cpu --small-data
    PYTHONPATH=. python3 -m benchmarks.cold_start --machine h100 --out $OUT/cold_start.json

On a machine other than the CPU the retriever accepts 4,000 evaluation candidates (Python 3.12's
stdlib yields 4,071, under the quick preset's 5,000). `--budget` (default 560 s) bounds the whole
command (a device call allows 600 s): each run's timeout is cut to what is left, and the JSON is
rewritten after every run.
"""

from __future__ import annotations

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # first: MLX's CPU BLAS is chosen when mlx.core loads (mlxio.runtime)

import time

T0 = time.perf_counter()  # the child's clock starts after MLX loads (setup) and before the recipe's modules do

# isort: off
import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402
# isort: on

RECIPES = ("retriever", "rlaif")


class _Stop(Exception):
    """Raised from the metrics writer once N steps are recorded: the run ends there."""


def small_data() -> list[str]:
    """Retriever overrides for a slow CPU: the smoke preset's corpus (stdlib email/, no PyPI
    packages, no held-out packages) and its small evaluation (the quick run's untrained baseline
    embeds 5,000+ candidates before step 1); the model, micro-batch (32, grad cache) and lengths
    stay the quick run's, its steps of 32 x 2 (the email corpus has ~130 training pairs, fewer
    than quick's 256 a step)."""
    from mlxio.data import pairs

    return ["--data.source", str(pairs.stdlib_root() / "email"), "--data.packages", "", "--data.heldout_packages", "",
            "--data.eval_fraction", "0.3",
            "--data.eval_queries", "40", "--data.min_eval_queries", "10", "--data.min_eval_candidates", "40",
            "--train.accum", "2"]


def _recipe_argv(recipe: str, work: Path, steps: int, extra: list[str]) -> list[str]:
    # --overwrite: the prime, fresh and warm runs share one out_dir (each stops after N steps)
    if recipe == "retriever":
        return ["--preset", "quick", "--out_dir", str(work / "run"), "--overwrite", "--cache_dir", str(work / "cache"),
                "--train.log_every", "1", "--train.eval_interval", "1", *extra]
    argv = ["--preset", "quick", "--out_dir", str(work / "run"), "--overwrite", "--eval.before", "false",
            "--train.log_every", "1", *extra]
    from mlxio.sandbox.backend import bwrap_path

    try:
        bwrap_path()
    except Exception:  # noqa: BLE001 (no sandbox on this machine: rewards without execution)
        argv += ["--rewards.execution", "0"]
    return argv


def child(recipe: str, work: Path, steps: int, extra: list[str]) -> dict:
    import logging

    from mlxio.gpu import kernel_cache
    from mlxio.run import reporting

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    marks: dict = {"imported_s": time.perf_counter() - T0}
    ends: list[float] = []
    notice = kernel_cache.compile_notice

    def timed_notice(what, shape, *a, **kw):  # the first step's start: its first compile_notice
        marks.setdefault("setup_s", time.perf_counter() - T0)
        marks.setdefault("first_shape", f"{what} {shape}")
        return notice(what, shape, *a, **kw)

    kernel_cache.compile_notice = timed_notice
    write = reporting.Reporter.write

    def timed_write(self, record):
        write(self, record)
        ends.append(time.perf_counter() - T0)
        if len(ends) >= steps:
            raise _Stop

    reporting.Reporter.write = timed_write
    argv = _recipe_argv(recipe, work, steps, extra)
    if recipe == "retriever":
        from recipes.xtr_lora import main
    else:
        from recipes.rlaif_qwen import main
    marks["recipe_imported_s"] = time.perf_counter() - T0  # MLX, mlx-lm, transformers (and torch)
    try:
        main(argv)
    except _Stop:
        pass
    import mlx.core as mx

    out = {"argv": argv, **marks, "steps_s": ends, "device": str(mx.default_device()),
           "kernel_cache": kernel_cache.cache_dir()}
    if ends and "setup_s" in marks:
        out["first_step_s"] = ends[0] - marks["setup_s"]
        out["to_first_step_s"] = ends[0]
        out["to_n_steps_s"] = ends[-1]
    return out


def run_one(recipe: str, work: Path, kcache: Path, args, label: str, timeout: int) -> dict:
    env = {**os.environ, "MLXIO_KERNEL_CACHE": str(kcache), "PYTHONPATH": os.environ.get("PYTHONPATH", ".")}
    env.pop("MLX_PTX_CACHE_DIR", None)  # the run's own folder, not the user's
    extra = args.retriever_args if recipe == "retriever" else args.rlaif_args
    cmd = [sys.executable, "-m", "benchmarks.cold_start", "--child", recipe, "--work", str(work),
           "--steps", str(args.steps), "--", *extra]
    from mlxio.gpu.kernel_cache import contents

    before = contents(kcache)
    start = time.time()
    row = {"recipe": recipe, "cache": label, "kernel_cache_before": before}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
        if proc.returncode or not lines:
            row["error"] = (proc.stderr or proc.stdout)[-2000:]
        else:
            row.update(json.loads(lines[-1][7:]))
            row["compile_log"] = [x[-300:] for x in proc.stderr.splitlines()
                                  if ("first " in x and "shape" in x) or "kernel prewarm" in x
                                  or "mlxio.phases" in x][:30]
    except subprocess.TimeoutExpired as err:
        row["error"] = f"timeout {timeout}s"
        row["stderr_tail"] = (err.stderr or b"")[-1500:].decode(errors="replace") if isinstance(
            err.stderr, bytes) else str(err.stderr or "")[-1500:]
    row["wall_s"] = time.time() - start
    row["kernel_cache_after"] = contents(kcache)
    print(json.dumps({k: v for k, v in row.items() if k not in ("argv", "compile_log")}), flush=True)
    return row


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--machine", default="cpu", help="results subfolder (cpu, h100, ...)")
    ap.add_argument("--recipes", nargs="+", default=list(RECIPES), choices=RECIPES)
    ap.add_argument("--steps", type=int, default=3, help="N: steps timed per run")
    ap.add_argument("--timeout", type=int, default=280, help="seconds per run")
    ap.add_argument("--budget", type=int, default=560, help="seconds for the whole command")
    ap.add_argument("--no-prime", dest="prime", action="store_false",
                    help="skip the run that fills the data caches (then 'fresh' pays for them too)")
    ap.add_argument("--work", default=None, help="work folder (default: a temporary one, removed)")
    ap.add_argument("--out", default=None, help="JSON path (default benchmarks/results/<machine>/cold_start.json)")
    ap.add_argument("--small-data", action="store_true",
                    help="retriever on a small corpus and evaluation (see small_data); for a slow CPU")
    ap.add_argument("--offline", action="store_true",
                    help="no network (the lent GPU machine): the retriever mines the stdlib alone, "
                         "without the pinned PyPI packages")
    ap.add_argument("--retriever-args", nargs="*", default=[], help="extra recipe overrides")
    ap.add_argument("--rlaif-args", nargs="*", default=[], help="extra recipe overrides")
    ap.add_argument("--child", default=None, choices=RECIPES, help=argparse.SUPPRESS)
    ap.add_argument("extra", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        res = child(args.child, Path(args.work), args.steps, args.extra)
        print("RESULT " + json.dumps(res), flush=True)
        sys.stdout.flush()
        os._exit(0)  # sandbox / prefetch threads of the stopped run must not keep the process

    from benchmarks.gpu_common import gpu_name, write

    if args.offline:
        args.retriever_args = ["--data.packages=", "--data.heldout_packages=", *args.retriever_args]
    if args.small_data:
        args.retriever_args = small_data() + args.retriever_args
    elif args.machine != "cpu":
        args.retriever_args = ["--data.min_eval_candidates", "4000", *args.retriever_args]
    deadline = time.time() + args.budget

    root = Path(args.work or tempfile.mkdtemp(prefix="cold_start_"))
    rows = []
    payload = {"settings": {"steps": args.steps, "timeout_s": args.timeout, "prime": args.prime,
                            "small_data": args.small_data, "offline": args.offline,
                            "retriever": "recipes.xtr_lora --preset quick (stopped after N steps)",
                            "rlaif": "recipes.rlaif_qwen --preset quick --eval.before false (stopped after N steps)"},
               "gpu": gpu_name() if args.machine != "cpu" else None, "runs": rows}
    try:
        for recipe in args.recipes:
            work = root / recipe
            conditions = ([("prime", root / "kernels_prime")] if args.prime else []) + [
                ("fresh", root / f"kernels_{recipe}"), ("warm", root / f"kernels_{recipe}")]
            for label, kcache in conditions:
                left = int(deadline - time.time())
                if left < 20:
                    rows.append({"recipe": recipe, "cache": label, "error": f"not run: --budget {args.budget}s spent"})
                    continue
                rows.append(run_one(recipe, work, kcache, args, label, min(args.timeout, left)))
                payload["summary"] = summary(rows)
                write("cold_start", payload, args.machine, args.out)  # after every run
    finally:
        if args.work is None:
            shutil.rmtree(root, ignore_errors=True)
    return payload


def summary(rows: list[dict]) -> dict:
    """{recipe: {cache: {to_first_step_s, first_step_s, to_n_steps_s, setup_s, wall_s}}}."""
    out: dict = {}
    for r in rows:
        keys = ("setup_s", "first_step_s", "to_first_step_s", "to_n_steps_s", "wall_s")
        out.setdefault(r["recipe"], {})[r["cache"]] = (
            {k: round(r[k], 2) for k in keys if k in r} if "error" not in r else {"error": r["error"][-200:]})
    return out


def table(payload: dict) -> str:
    """Markdown rows of a cold_start.json (seconds)."""
    lines = ["| recipe | kernel cache | setup s | first step s | to first step s | N | to step N s | run wall s |",
             "|---|---|---|---|---|---|---|---|"]
    for r in payload["runs"]:
        if "error" in r:
            lines.append(f"| {r['recipe']} | {r['cache']} | error: {r['error'][-80:].strip()} | | | | | |")
            continue
        cells = [f"{r[k]:.1f}" if k in r else "-" for k in ("setup_s", "first_step_s", "to_first_step_s")]
        cells += [str(len(r.get("steps_s", [])))]
        cells += [f"{r[k]:.1f}" if k in r else "-" for k in ("to_n_steps_s", "wall_s")]
        lines.append(f"| {r['recipe']} | {r['cache']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def results_section() -> list[str]:
    """Time to the first step of each recipe's quick run, fresh (empty kernel cache) and warm."""
    from benchmarks.common import fmt, load  # here: the child's timed imports stay the recipe's

    rows = []
    for machine, name in (("h100", "cold_start_retriever"), ("h100", "cold_start_rlaif"), ("cpu", "cold_start")):
        c = load(machine, name)
        if not c:
            continue
        for recipe, by_cache in c.get("summary", {}).items():
            for cache in ("fresh", "warm"):
                v = by_cache.get(cache)
                if v:
                    rows.append(f"| {machine} | {recipe} | {cache} | {fmt(v['setup_s'], 1)} | {fmt(v['first_step_s'], 1)} "
                                f"| {fmt(v['to_first_step_s'], 1)} |")
    if not rows:
        return []
    return ["### Cold start: a recipe's quick run to its first training step (benchmarks/cold_start.py)", "",
            "| machine | recipe | kernel cache | setup s | first step s | to first step s |", "|---|---|---|---|---|---|",
            *rows, "", "fresh: an empty kernel cache (a new machine), the data caches filled; warm: the same "
            "run again. The CPU compiles no kernels, so there fresh and warm differ by noise (a shared, "
            "loaded 2-core box).", ""]


if __name__ == "__main__":
    main()
