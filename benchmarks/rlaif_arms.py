"""Does RLAIF teach, and does AI feedback? Reward arms x seeds of `recipes.rlaif_qwen`, side by
side on one GPU, with held-out pass@1 before and after (95% intervals, paired differences).

Arms (the same prompts, steps, seeds and evaluation; ARMS below holds their flags):
  execution        the sandbox's pass/fail (+ format 0.2), with the GRPO controls docs/rlaif.md
                   recommends against the entropy collapse of the first GPU run (CONTROLS: an
                   entropy floor and equal-group skipping; every arm has them)
  trained_judge    a verdict judge (`recipes.rlaif_judge`, its own training seed = the arm's seed)
                   as the only reward: no test runs during training; the judge trains on the
                   procedural training split, disjoint from every evaluation set (checked)
  untrained_judge  the same judge's base (LoRA off) as the only reward: what the judge's training adds

Every process is started here as a child: the judges first (they share the GPU with the arms
that need no judge), then each trained-judge arm as soon as its judge is done. "Before" is the
base model (LoRA off) with fixed evaluation seeds, the same for every arm and seed, so it is
evaluated once, by a process of its own, and each run's after - before is paired against it.
Everything resumes: run the same command again (a later device call) and finished parts are kept,
runs continue from their last checkpoint. `--deadline_s` stops the children in time for the call.

    python -m benchmarks.rlaif_arms --work /tmp/arms --deadline_s 540 -- --preset gpu     # a device call
    python -m benchmarks.rlaif_arms --work DIR --summarize --machine h200                 # JSON + PNG
    python -m benchmarks.rlaif_arms --work /tmp/arms --rehearse                           # CPU, smoke size

Writes benchmarks/results/<machine>/rlaif_arms.json and rlaif_arms.png (`--summarize`).
"""

from __future__ import annotations

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # first: MLX's CPU BLAS is chosen when mlx.core loads (mlxio.runtime)

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

# docs/rlaif.md's controls for the first GPU run's entropy collapse (0.28 -> 0.08, the held-out
# family's greedy pass@1 down 0.17): an entropy floor at the base's own level, and equal-reward
# groups left out. Clip-higher is not among them: with one update per batch (inner_epochs 1)
# every ratio is 1 and no clipping acts.
CONTROLS = ["--grpo.entropy_coef", "0.01", "--grpo.entropy_target", "0.3", "--grpo.skip_equal_groups", "true"]
JUDGE_ONLY = ["--rewards.execution", "0", "--rewards.format", "0", "--rewards.ai_feedback", "1"]
ARMS = {
    "execution": ["--rewards.execution", "1", "--rewards.format", "0.2", *CONTROLS],
    "trained_judge": [*JUDGE_ONLY, *CONTROLS],
    "untrained_judge": [*JUDGE_ONLY, "--teacher.judge", "untrained", *CONTROLS],
}
# the experiment's evaluation: n = 8 sampled + greedy on the procedural sets, 128 rows a decode
# step; HumanEval's 164 with n = 4 + greedy (measured cost: docs/rlaif.md)
EVAL = ["--eval.samples", "8", "--eval.batch", "16", "--eval.transfer_samples", "4", "--data.transfer",
        "humaneval_all", "--eval.workers", "4", "--sandbox.workers", "4", "--train.checkpoint_every", "5"]
SMOKE = ["--train.steps", "2", "--prompts_per_step", "2", "--group_size", "4",
         "--max_new_tokens", "24", "--eval.max_new_tokens", "24", "--eval.problems", "3", "--eval.samples", "2",
         "--eval.transfer_samples", "1", "--compile", "false", "--train.log_every", "1",
         "--eval.workers", "2", "--sandbox.workers", "2", "--train.checkpoint_every", "1", "--eval.batch", "4"]
JUDGE_SMOKE = ["--preset", "smoke"]


def run_dir(work: Path, arm: str, seed: int) -> Path:
    return work / f"{arm}_s{seed}"


def done(path: Path) -> bool:
    return (path / "eval.json").is_file()


def recipe_argv(work: Path, arm: str, seed: int, recipe: list[str]) -> list[str]:
    """The recipe's flags for one run (`recipe`: the experiment's shared flags)."""
    judge = ["--teacher.judge", str(work / f"judge_s{seed}" / "adapters")] if arm == "trained_judge" else []
    return [*recipe, *ARMS[arm], *judge, "--train.seed", str(seed), "--out_dir", str(run_dir(work, arm, seed)),
            "--eval.before", "false"]


class Children:
    """Child processes by name, each logging to work/<name>.log."""

    def __init__(self, work: Path) -> None:
        self.work, self.procs = work, {}
        self.timing_path = work / "timing.json"  # every child's sittings: [start, end, exit code] (epoch s)
        self.timing = json.loads(self.timing_path.read_text()) if self.timing_path.is_file() else {}
        self.started: dict[str, float] = {}

    def _record(self, name: str, rc: int | None) -> None:
        self.timing.setdefault(name, []).append([round(self.started.pop(name), 1), round(time.time(), 1), rc])
        self.timing_path.write_text(json.dumps(self.timing, indent=1))

    def start(self, name: str, argv: list[str]) -> None:
        log = open(self.work / f"{name}.log", "ab")  # noqa: SIM115  (held by the child)
        # each child keeps at most 4 GB of freed buffers: a dozen of them share one GPU
        env = {"MLXIO_CACHE_LIMIT_MB": "4096", **os.environ, "PYTHONUNBUFFERED": "1"}
        self.procs[name] = subprocess.Popen([sys.executable, *argv], stdout=log, stderr=subprocess.STDOUT, env=env,
                                            start_new_session=True)
        self.started[name] = time.time()
        print(f"{time.strftime('%H:%M:%S')} start {name}", flush=True)

    def poll(self) -> dict[str, int]:
        """{name: exit code} of the children that ended since the last poll."""
        ended = {n: p.returncode for n, p in self.procs.items() if p.poll() is not None}
        for n, rc in ended.items():
            del self.procs[n]
            self._record(n, rc)
            print(f"{time.strftime('%H:%M:%S')} end {n} rc={rc}", flush=True)
        return ended

    def stop(self, grace_s: float = 10.0) -> None:
        for p in self.procs.values():
            os.killpg(p.pid, signal.SIGTERM)
        t = time.monotonic()
        while self.procs and time.monotonic() - t < grace_s:
            self.poll()
            time.sleep(0.5)
        for p in self.procs.values():
            os.killpg(p.pid, signal.SIGKILL)
        for n in list(self.procs):
            self._record(n, None)
            print(f"{time.strftime('%H:%M:%S')} stopped {n} (resumes next call)", flush=True)
        self.procs.clear()


def run_all(work: Path, seeds: list[int], arms: list[str], recipe: list[str], judge: list[str],
            deadline_s: float, max_parallel: int) -> None:
    """Start every unfinished part (judges, before, arms) and wait for them or the deadline."""
    t0 = time.monotonic()
    kids = Children(work)
    pending: list[tuple[str, list[str], str | None]] = []  # (name, argv, judge it waits for)
    for s in seeds:
        jd = work / f"judge_s{s}"
        if "trained_judge" in arms and not (jd / "eval.json").is_file():
            pending.append((f"judge_s{s}", ["-m", "recipes.rlaif_judge", *judge, "--train.seed", str(s),
                                            "--out_dir", str(jd), "--resume"], None))
    if not (work / "before" / "before.json").is_file():
        pending.append(("before", ["-m", "benchmarks.rlaif_arms_before", *recipe, *ARMS["execution"],
                                   "--out_dir", str(work / "before")], None))
    for arm in arms:
        for s in seeds:
            if not done(run_dir(work, arm, s)):
                wait = f"judge_s{s}" if arm == "trained_judge" else None
                pending.append((f"{arm}_s{s}", ["-m", "recipes.rlaif_qwen", *recipe_argv(work, arm, s, recipe),
                                                "--resume"], wait))
    failed: set[str] = set()
    while pending or kids.procs:
        ended = kids.poll()
        failed |= {n for n, rc in ended.items() if rc != 0}
        for item in list(pending):
            name, argv, wait = item
            if len(kids.procs) >= max_parallel:
                break
            if wait and wait in failed:
                pending.remove(item)
                print(f"skip {name}: {wait} failed", flush=True)
            elif wait is None or (work / wait / "eval.json").is_file():
                pending.remove(item)
                kids.start(name, argv)
        if time.monotonic() - t0 > deadline_s:
            print(f"deadline {deadline_s:.0f} s: stopping {len(kids.procs)} children, {len(pending)} not started",
                  flush=True)
            kids.stop()
            break
        time.sleep(1.0)
    state = {"elapsed_s": round(time.monotonic() - t0, 1), "failed": sorted(failed),
             "done": sorted(p.name for p in work.iterdir() if done(p))}
    print(json.dumps(state), flush=True)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    cut = argv.index("--") if "--" in argv else len(argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--work", type=Path, required=True, help="run folders (kept: a second call resumes)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    ap.add_argument("--deadline_s", type=float, default=540.0, help="stop every child after this long")
    # a default that fits one GPU: more children at once ran it out of memory (dev/LOG.md)
    ap.add_argument("--max_parallel", type=int, default=6, help="children at a time")
    ap.add_argument("--judge", default="", help="flags for recipes.rlaif_judge (one string)")
    ap.add_argument("--rehearse", action="store_true", help="CPU smoke sizes (the same code paths)")
    ap.add_argument("--summarize", action="store_true", help="no runs: write the JSON and PNG from --work")
    ap.add_argument("--machine", default="h200")
    ap.add_argument("--results", type=Path, default=None, help="JSON path (default results/<machine>/rlaif_arms.json)")
    args = ap.parse_args(argv[:cut])
    # the shared flags: the preset, the experiment's evaluation, then the caller's (later flags win)
    recipe = ["--preset", "gpu", *EVAL, *(SMOKE if args.rehearse else []), *argv[cut + 1:]]
    judge = [*(JUDGE_SMOKE if args.rehearse else []), *args.judge.split()]
    args.work.mkdir(parents=True, exist_ok=True)
    if args.summarize:
        from benchmarks import rlaif_arms_report as report

        path = report.write(args.work, args.seeds, args.arms, args.machine, args.results,
                            command="python -m benchmarks.rlaif_arms " + " ".join(argv))
        print(path)
        return
    (args.work / "command.json").write_text(json.dumps({"command": "python -m benchmarks.rlaif_arms " + " ".join(argv),
                                                        "recipe": recipe, "judge": judge, "seeds": args.seeds,
                                                        "arms": {a: ARMS[a] for a in args.arms}}))
    run_all(args.work, args.seeds, args.arms, recipe, judge, args.deadline_s, args.max_parallel)


if __name__ == "__main__":
    main()
