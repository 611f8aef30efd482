"""The scaffolding both training recipes share, as a few plain functions (not a Trainer class):
start (ranks, logging, run dir, config.json, seeds), resume (rank 0 reads, every rank
receives, RNG restored; `resume_into` puts the trees back into the run's params), the divergence
guard, the checkpoint cadence and the command-line flags and errors. What happens around each
step (reporter, progress, memory profiler, checkpoints when due, the end of the loop) is
`mlxio.run.loop.TrainLoop`; a recipe's `main` calls them in order and keeps its own step loop.

One vocabulary for both recipes: the run directory is `out_dir`; a checkpoint holds the trees
`trainable` (what the optimizer updates) and `opt_state`, plus meta {config_hash, base_model,
step, rng, ...}; too many non-finite steps in a row raise `TrainingDiverged`; progress is
logged through `logging`; `stop_after` is a command-line flag (the last step to run in this
process), never part of the config.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import mlx.core as mx
import numpy as np

from mlxcore.train.tree import Tree, combine, partition
from mlxio import atomic
from mlxio.atomic import sweep_stale, write_json_atomic
from mlxio.errors import CheckpointError, TrainingDiverged
from mlxio.redact import install_log_redaction, redact_config, redact_text
from mlxio.run import checkpoint, distributed, memprof

log = logging.getLogger(__name__)

TRAINABLE, OPT_STATE = "trainable", "opt_state"
# tree names of checkpoints written before the shared vocabulary: old name -> current name
LEGACY_TREES = {"lora": TRAINABLE}


def start(out_dir: Path, config: dict, seed: int, resume: bool = False, overwrite: bool = False) -> distributed.World:
    """Join the ranks (one unless started by `mlx.launch`), log at INFO on rank 0 only, create
    `out_dir` (every rank: per-rank caches may live there), claim it (rank 0: `claim_out_dir`),
    write config.json (rank 0; when resuming, `resume` writes it once the checkpoint is
    accepted, so a refused resume can still say what changed) and seed every global PRNG a
    checkpoint snapshots (Python's, NumPy's, MLX's)."""
    world = distributed.init()
    logging.basicConfig(level=logging.INFO if world.is_main else logging.WARNING,
                        format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    install_log_redaction()  # no credential (a teacher URL's user:pass@) reaches a log line
    out_dir.mkdir(parents=True, exist_ok=True)
    if world.is_main:
        claim_out_dir(out_dir, resume, overwrite)
    if world.is_main and not resume:
        write_json_atomic(out_dir / "config.json", redact_config(config), "run config")
    random.seed(seed)
    np.random.seed(seed)
    mx.random.seed(seed)
    return world


LOCK_NAME = ".lock"
_HELD: dict[str, int] = {}  # out_dir (real path) -> the lock file descriptor this process holds


def claim_out_dir(out_dir: Path, resume: bool, overwrite: bool = False) -> bool:
    """Take `out_dir` for this run: an exclusive lock (`out_dir/.lock`, `flock`, held until the
    process exits or `release_out_dir`; re-entrant within one process) - a second writer into
    the same folder (a recipe run, the RLAIF worker's save / load) is refused, naming the
    folder and the process that holds it (the holder writes who it is into the lock file), not
    interleaved into its metrics and checkpoints -, and, for a fresh run (not `resume`), refuse
    a folder holding another run's results (checkpoints, metrics, eval.json) unless `overwrite`,
    which removes them first. RunError / ConfigError (one line) otherwise. Returns whether this
    call took the lock (False: this process held it already)."""
    import fcntl
    import os

    from mlxio.errors import ConfigError, RunError

    key = os.path.realpath(out_dir)
    taken = key not in _HELD
    if taken:
        fd = atomic.open_in_place(out_dir / LOCK_NAME, "run's lock file", read=True)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _lock_holder(fd)
            os.close(fd)
            raise RunError(f"another run is writing this folder ({holder})", where=str(out_dir),
                           fix="wait for it to finish, or pick another --out_dir") from None
        except OSError as err:  # a file system without locks (some network mounts): go on unlocked
            log.warning("%s: cannot lock (%s); two runs into this folder would not be stopped", out_dir, err.strerror)
        else:  # who holds it, for the run it refuses (a refused run changes no byte of the folder)
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
                os.pwrite(fd, _this_process().encode("utf-8", "replace"), 0)
        _HELD[key] = fd
        for left in sweep_stale(out_dir):  # temp exports / files of a run killed mid-write
            log.info("removed %s (left by a killed writer)", left)
    if resume:
        return taken
    found = previous_run(out_dir)
    if found and not overwrite:
        raise ConfigError(f"out_dir holds another run's results ({', '.join(found)})", where=str(out_dir),
                          fix="pass --resume to continue it, --overwrite to replace it, or pick another --out_dir")
    if found:
        import shutil

        log.warning("%s: --overwrite: removing the previous run's %s", out_dir, ", ".join(found))
        shutil.rmtree(out_dir / checkpoint.CHECKPOINTS, ignore_errors=True)
        for name in ("metrics.jsonl", "eval.json"):
            (out_dir / name).unlink(missing_ok=True)
    return taken


def _this_process() -> str:
    """'pid N on HOST since TIME: COMMAND' (one line, no '; '), for the lock file."""
    import os
    import socket
    import time

    command = redact_text(" ".join(sys.argv))[:200] or "python"
    text = f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}: {command}"
    return " ".join(text.split()).replace("; ", ", ")


def _lock_holder(fd: int) -> str:
    """What the lock file says of its holder (`_this_process`), or that it says nothing."""
    import os

    try:
        text = os.pread(fd, 1024, 0).decode("utf-8", "replace")
    except OSError:
        text = ""
    text = " ".join(text.split()).replace("; ", ", ")
    return f"held by {text}" if text else f"it holds {LOCK_NAME}"


def release_out_dir(out_dir: Path | str) -> None:
    """Give back `out_dir`'s lock (`claim_out_dir`) if this process holds it, emptying the
    holder line first (a lock file names a holder only while one holds it, so a run that
    was refused, or ended, leaves the folder's bytes as it found them)."""
    import os

    fd = _HELD.pop(os.path.realpath(out_dir), None)
    if fd is not None:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        os.close(fd)


def releases_out_dirs(fn: Callable) -> Callable:
    """A recipe's entry point that gives back the `out_dir` locks it took (`claim_out_dir`)
    when it returns or raises: a process that runs one recipe after another (tests, a
    notebook, the probe), or launches ranks into a folder it finished with, is not refused by
    its own earlier run."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        before = set(_HELD)
        try:
            return fn(*args, **kwargs)
        finally:
            for key in set(_HELD) - before:
                release_out_dir(key)
    return wrapper


def previous_run(out_dir: Path) -> list[str]:
    """What of a run's results `out_dir` holds: its checkpoints, a non-empty metrics.jsonl,
    eval.json (a config.json alone is a run that stopped before training: not counted)."""
    found = []
    steps = checkpoint.step_numbers(out_dir)
    if steps:
        found.append(f"checkpoints up to step {max(steps)}")
    metrics = out_dir / "metrics.jsonl"
    if metrics.is_file() and metrics.stat().st_size > 0:
        found.append("metrics.jsonl")
    if (out_dir / "eval.json").exists():
        found.append("eval.json")
    return found


@attrs.frozen
class Resumed:
    """A checkpoint this run continues from: its trees by name, meta and step."""

    path: Path | None  # None on ranks other than 0 (they received it over the wire)
    trees: dict[str, Tree]
    meta: dict

    @property
    def step(self) -> int:
        return int(self.meta["step"])


def resume(out_dir: Path, run_id: dict, template: dict[str, Tree], world: distributed.World,
           config: dict, legacy_keys: dict[str, str | None] | None = None,
           config_hash: Callable[[dict], str] | None = None,
           defaults: dict[str, Any] | None = None) -> Resumed | None:
    """The newest good checkpoint in `out_dir` whose meta matches `run_id`, read on rank 0 and
    broadcast to the others (`template`: the trees' structure, e.g. the fresh trainable weights
    and optimizer state); RNG state restored; config.json (`config`) written. None when there
    is nothing to resume.

    A checkpoint of another config is refused with a CheckpointError listing the settings that
    differ and that the config hash covers (not `out_dir` or where metrics go; from the
    checkpoint's meta["config"], else the run's old config.json), old setting
    names (`legacy_keys`, see `mlxio.run.config.migrate`) read as the current ones, and a
    setting its recorded config lacks (written before the setting existed) read as this run's
    value where that is the setting's default (`defaults`: {dotted key: default},
    `mlxio.run.config.default_values`): the old run ran as with the default. One whose recorded
    config differs only by such renames and absent defaults (`config_hash` of it, so read, is
    this run's) is resumed, with one warning naming them; an absent setting this run sets to
    another value is a change (`check_config`, the rule the RLAIF worker's `load` applies too).
    Trees saved under an older name (`lora`) are renamed to the current one, with a log line
    saying so."""
    found = None
    if world.is_main:
        found = checkpoint.load_latest(out_dir, expect={k: v for k, v in run_id.items() if k != "config_hash"})
        if found is not None:
            check_config(found[0], found[2], run_id, config, legacy_keys, config_hash, defaults)
            found = (found[0], current_tree_names(found[0], found[1]), found[2])
        write_json_atomic(out_dir / "config.json", redact_config(config), "run config")
    found = distributed.broadcast_checkpoint(found, template, world)
    if found is None:
        log.info("no checkpoint in %s: starting fresh", out_dir)
        return None
    resumed = Resumed(*found)
    checkpoint.rng_restore(resumed.meta["rng"])
    log.info("resumed from %s (step %d)", resumed.path, resumed.step)
    return resumed


def resume_into(enabled: bool, out_dir: Path, run_id: dict, params: Tree, opt_state: Tree,
                world: distributed.World, config: dict, legacy_keys: dict[str, str | None],
                config_hash: Callable[[dict], str],
                trainable: Callable[[str, Any], bool] | None = None,
                defaults: dict[str, Any] | None = None) -> tuple[Tree, Tree, Resumed | None]:
    """(params, opt_state, the checkpoint) where `--resume` (`enabled`) found one in `out_dir`
    (`mlxio.run.context.resume`, with `legacy_keys`, `config_hash` and `defaults`), else the
    fresh ones and None. `trainable` picks the leaves of `params` a checkpoint holds (the
    rest, the frozen base, stays as loaded); None: all of `params` is the trainable tree."""
    if not enabled:
        return params, opt_state, None
    train_part, frozen = partition(params, trainable) if trainable is not None else (params, None)
    found = resume(out_dir, run_id, {TRAINABLE: train_part, OPT_STATE: opt_state}, world, config,
                   legacy_keys, config_hash, defaults)
    if found is None:
        return params, opt_state, None
    restored = found.trees[TRAINABLE]
    return (combine(frozen, restored) if frozen is not None else restored), found.trees[OPT_STATE], found


_ABSENT = "<absent>"


def check_config(path: Path, meta: dict, run_id: dict, config: dict,
                 legacy_keys: dict[str, str | None] | None = None,
                 config_hash: Callable[[dict], str] | None = None,
                 defaults: dict[str, Any] | None = None) -> None:
    """Whether this run (`run_id["config_hash"]`, its `config`) may continue the checkpoint at
    `path` (its `meta`): the same config hash, or a recorded config (meta["config"]) that is
    this run's under old setting names (`legacy_keys`) and without settings added since that
    this run leaves at their defaults (`defaults`), with one warning naming them. Else a
    CheckpointError listing the settings that make the hash differ (from meta["config"], else
    the run's config.json). The one rule of `--resume` (`resume`) and the RLAIF worker's `load`;
    the other identity fields (base model) must match exactly (`checkpoint.load_latest(expect=)`)."""
    if meta.get("config_hash") == run_id.get("config_hash"):
        return
    legacy_keys, defaults = legacy_keys or {}, defaults or {}
    if not _same_settings(path, meta, run_id, config, legacy_keys, config_hash, defaults):
        raise CheckpointError(_refusal(path, meta, config, legacy_keys, defaults, config_hash))


def _as_recorded(old: dict, config: dict, legacy_keys: dict, defaults: dict) -> tuple[dict, list[str], list[str]]:
    """(the checkpoint's recorded config `old` read as this run would write it, the renames
    applied, the settings it lacks that take this run's value, their default). Old names move
    to the current ones (`migrate`); a setting `old` lacks is filled in only where this run's
    value is the setting's default."""
    from mlxio.run.config import flat_dict, migrate, set_path

    old, renamed = migrate(old, legacy_keys)
    before = flat_dict(old)
    absent = []
    for key, value in sorted(flat_dict(config).items()):
        if key not in before and key in defaults and value == defaults[key]:
            try:
                set_path(old, key, value, create=True)
            except (AttributeError, TypeError):  # a section recorded as a plain value
                continue
            absent.append(key)
    return old, renamed, absent


def _same_settings(path: Path, meta: dict, run_id: dict, config: dict, legacy_keys: dict,
                   config_hash: Callable[[dict], str] | None, defaults: dict) -> bool:
    """Whether the checkpoint's recorded config is this run's under old setting names and
    without settings added since at their defaults (then one warning says which)."""
    old = meta.get("config")
    if config_hash is None or not isinstance(old, dict):
        return False
    recorded, renamed, absent = _as_recorded(old, config, legacy_keys, defaults)
    try:
        same = bool(renamed or absent) and config_hash(recorded) == run_id.get("config_hash")
    except (KeyError, TypeError, ValueError):  # a recorded config of another shape
        return False
    if same:
        why = [f"under old setting names ({', '.join(renamed)})"] if renamed else []
        if absent:
            why.append(f"before {', '.join(absent)} existed (read as this run's values, their defaults)")
        log.warning("%s: written %s; the same settings as this run's: resuming it", path, " and ".join(why))
    return same


def _refusal(path: Path, meta: dict, config: dict, legacy_keys: dict, defaults: dict,
             config_hash: Callable[[dict], str] | None) -> str:
    """Why a checkpoint of another config is refused: the settings that differ and that the
    hash covers (`_moves_hash`: not out_dir or the logging), by name."""
    from mlxio.run.config import flat_dict

    old = meta.get("config")
    run_config = path.parent.parent / "config.json"  # <out_dir>/checkpoints/step-N
    if old is None and run_config.is_file():
        with contextlib.suppress(ValueError, OSError):
            old = json.loads(run_config.read_text())
    head = f"{path}: written by a run with another config (config_hash differs); refusing to resume it"
    if not isinstance(old, dict):
        return head + " (its config is not recorded)"
    old, renamed, _ = _as_recorded(old, config, legacy_keys, defaults)
    before, now = flat_dict(old), flat_dict(config)

    def change(k: str) -> str:
        text = f"{k}: {before.get(k, _ABSENT)!r} -> {now.get(k, _ABSENT)!r}"
        if k not in before and k in defaults:  # set to another value than the old run's default
            text += f" (not in the checkpoint's config; it resumes with the default {defaults[k]!r})"
        return text

    changed = [change(k) for k in sorted(before.keys() | now.keys())
               if before.get(k, _ABSENT) != now.get(k, _ABSENT) and _moves_hash(old, k, now, config_hash)]
    notes = [f"renamed since: {', '.join(renamed)}"] if renamed else []
    return head + "; changed: " + ("; ".join(changed) or "no setting (the hashed fields changed meaning)") + (
        "; " + "; ".join(notes) if notes else "")


def _moves_hash(old: dict, key: str, now: dict, config_hash: Callable[[dict], str] | None) -> bool:
    """Whether the recorded config `old` with setting `key` as this run has it (`now`: flat;
    removed where this run lacks it) hashes otherwise (`config_hash`): a setting the hash leaves
    out (the run directory, where metrics go) is no reason to refuse. True without a hash, or
    where `old` does not hash (a recorded config of another shape)."""
    import copy

    from mlxio.run.config import set_path

    if config_hash is None:
        return True
    probe = copy.deepcopy(old)
    try:
        if key in now:
            set_path(probe, key, now[key], create=True)
        else:
            *parents, last = key.split(".")
            section = probe
            for part in parents:
                section = section[part]
            del section[last]
        return config_hash(probe) != config_hash(old)
    except (AttributeError, KeyError, TypeError, ValueError):
        return True


def current_tree_names(path: Path, trees: dict[str, Tree]) -> dict[str, Tree]:
    """`trees` of the checkpoint at `path` keyed by the current names (`LEGACY_TREES`)."""
    out = {}
    for name, tree in trees.items():
        new = LEGACY_TREES.get(name, name)
        if new != name:
            log.warning("%s: written before the shared checkpoint vocabulary; its tree %r is read as %r "
                        "(same arrays, new name)", path, name, new)
        out[new] = tree
    return out


def region(prof: memprof.MemoryProfiler | None, name: str):
    """`prof.region(name)`, or a no-op context without a profiler."""
    return prof.region(name) if prof is not None else contextlib.nullcontext()


def last_step(steps: int, stop_after: int | None, start: int = 0, more_steps: int | None = None) -> int:
    """The step this process stops after: `steps`, or the `--stop_after` step when earlier, or
    `start + more_steps` when that is earlier still."""
    end = steps if not stop_after else min(steps, stop_after)
    return end if more_steps is None else min(end, start + more_steps)


def checkpoint_due(step_no: int, every: int, last: int) -> bool:
    """After optimizer step `step_no` (1-based): every `every` steps and at the last step."""
    return step_no % every == 0 or step_no == last


def save(out_dir: Path, step_no: int, trainable: Tree, opt_state: Tree, run_id: dict, world: distributed.World,
         keep_last: int = 3, **meta) -> None:
    """Checkpoint {trainable, opt_state} with meta {run_id, step, rng, **meta} (rank 0 only)."""
    if world.is_main:
        checkpoint.save(out_dir, step_no, {TRAINABLE: trainable, OPT_STATE: opt_state},
                        {**run_id, "step": step_no, "rng": checkpoint.rng_snapshot(), **meta}, keep_last=keep_last)


def check_divergence(opt_state: Tree, max_consecutive: int, step_no: int, hint: str) -> None:
    """TrainingDiverged once `max_consecutive` optimizer steps in a row were skipped as
    non-finite (the last good checkpoint stays the newest)."""
    consecutive = int(opt_state["consecutive_skips"])
    if consecutive >= max_consecutive:
        raise TrainingDiverged(f"step {step_no}: {consecutive} non-finite steps in a row (skipped, "
                               f"{int(opt_state['skips'])} in all); stopping. {hint}")
