"""The cadence around a training recipe's own step loop, the same for both recipes: the
metrics reporter, the progress display, the memory profiler, the divergence guard,
checkpoints when due, and the end of the loop (no silent nothing, every
rank waits for the last checkpoint). A plain object the recipe calls between its own steps,
not a Trainer: the recipe owns the loop, the batches and the step.

    params, opt_state, resumed = context.resume_into(...)
    run = loop.TrainLoop.open(out_dir, world, ...)
    for step_no in range(run.start, run.end):
        ... the recipe's step ...
        run.write(record)                                   # rank 0: metrics.jsonl (+ TB / W&B)
        run.end_step(step_no + 1, opt_state, trainable_tree, data_position)
    if not run.finish(opt_state, updates, title):           # stopped early, or not rank 0
        return ...
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import attrs

from mlxcore.train.tree import Tree
from mlxio.redact import redact_config
from mlxio.run import distributed, memprof, outcome
from mlxio.run.context import check_divergence, checkpoint_due, save
from mlxio.run.reporting import HEARTBEAT_S, Reporter, progress

log = logging.getLogger(__name__)


@attrs.define
class TrainLoop:
    """One process's optimizer steps `start` .. `end` - 1 of a run of `steps` (1-based step
    numbers `start + 1` .. `end`): what happens around each of them (see the module doc)."""

    out_dir: Path
    world: distributed.World
    run_id: dict  # the checkpoint meta a resume must match (config_hash, base_model)
    config: dict  # the run's config as a dict: recorded in every checkpoint
    start: int
    end: int  # the last step of this process: `steps`, or earlier with --stop_after
    steps: int  # the run's length
    checkpoint_every: int
    max_consecutive_skips: int
    keep_last: int  # checkpoints kept
    hint: str  # what TrainingDiverged suggests
    skips_before: int  # updates skipped before this process (from the optimizer state)
    reporter: Reporter | None  # rank 0's (None on the others)
    profiler: memprof.MemoryProfiler | None  # --profile-memory
    bar: Any  # the progress display (`mlxio.run.reporting.progress`), silent off rank 0

    @classmethod
    def open(cls, out_dir: Path, world: distributed.World, *, run_id: dict, config: dict, train, start: int,
             end: int, resumed: bool, opt_state: Tree, project: str, desc: str, report_to: tuple[str, ...],
             headline: tuple[str, ...], hint: str, profile_memory: bool = False, keep_last: int = 3,
             every_s: float = HEARTBEAT_S, logger: logging.Logger | None = None) -> TrainLoop:
        """The loop of a run whose `train` settings (`train.steps`, `checkpoint_every`,
        `max_consecutive_skips`) are the recipe's; rank 0 opens the reporter (metrics.jsonl,
        continued after step `start` when `resumed`; TensorBoard / W&B per `report_to`; one log
        line per record off a terminal, naming the `headline` metrics). `config` is recorded
        (checkpoints, W&B) with its credentials masked (`mlxio.redact`)."""
        config = redact_config(config)
        reporter = None
        if world.is_main:
            reporter = Reporter(out_dir, report_to=report_to, config=config, project=project,
                                resume_step=start if resumed else None, total_steps=end, start_step=start,
                                headline=headline, logger=logger)
        # off a terminal each record is a log line (Reporter); the display adds one only after
        # `every_s` with none (a long step or compile), whatever the logging interval
        bar = progress(total=end, initial=start, desc=desc, unit="step", every_s=every_s,
                       disable=reporter is None)
        return cls(out_dir=out_dir, world=world, run_id=run_id, config=config, start=start, end=end,
                   steps=train.steps, checkpoint_every=train.checkpoint_every,
                   max_consecutive_skips=train.max_consecutive_skips, keep_last=keep_last, hint=hint,
                   skips_before=outcome.skips(opt_state), reporter=reporter,
                   profiler=memprof.MemoryProfiler() if profile_memory else None, bar=bar)

    def write(self, record: dict) -> None:
        """A metrics record (rank 0 writes it; the other ranks have none to write)."""
        if self.reporter is not None:
            self.reporter.write(record)
            if self.reporter.console:
                self.bar.printed_elsewhere()

    def checkpoint_due(self, step_no: int) -> bool:
        return checkpoint_due(step_no, self.checkpoint_every, self.end)

    def end_step(self, step_no: int, opt_state: Tree, trainable: Tree, data_position: dict, **profile) -> None:
        """After optimizer step `step_no` (1-based) is evaluated: the memory profiler's record
        (with `profile`), TrainingDiverged after too many skipped steps in a row, and a
        checkpoint of `trainable` + `opt_state` when one is due."""
        if self.profiler is not None:
            self.profiler.record(step_no, **profile)
        check_divergence(opt_state, self.max_consecutive_skips, step_no, self.hint)
        if self.checkpoint_due(step_no):
            save(self.out_dir, step_no, trainable, opt_state, self.run_id, self.world, keep_last=self.keep_last,
                 data_position=data_position, config=self.config)

    @property
    def stopped_early(self) -> bool:
        """Whether this process ends before the run's last step (--stop_after)."""
        return self.end < self.steps

    def finish(self, opt_state: Tree, updates: int, title: str, keep_reporter: bool = False,
               empty_updates: int = 0) -> bool:
        """After the loop: the display and reporter closed (the reporter left open with
        `keep_reporter`, for the run's results: `reporter.write_summary`, then `close`), the memory
        profile written (memory.json + memory.png titled `title`), RunError if none of this
        process's `updates` optimizer updates applied (non-finite, or `empty_updates` of them
        with nothing to train on), and every rank waits until the last
        checkpoint exists. True when the run is complete and this is rank 0: evaluation and
        export come next."""
        self.bar.close()
        if self.world.is_main:
            if not (keep_reporter and not self.stopped_early):
                self.reporter.close()
            if self.profiler is not None:
                self.profiler.write(self.out_dir, title=title)
        outcome.require_progress(opt_state, self.skips_before, updates, str(self.out_dir / "metrics.jsonl"),
                                 empty=empty_updates)
        distributed.barrier(self.world)
        if self.stopped_early:
            log.info("stopped after step %d as asked (--stop_after); resume with --resume", self.end)
        return not self.stopped_early and self.world.is_main
