"""No silent nothing: a run whose every optimizer update was skipped (non-finite loss or
gradient) has not trained anything, and must not end as if it had."""

from __future__ import annotations

import logging

from mlxio.errors import RunError

log = logging.getLogger(__name__)


def skips(opt_state: dict) -> int:
    """Updates skipped so far (the counter `mlxcore.step` keeps in the optimizer state)."""
    return int(opt_state["skips"])


def require_progress(opt_state: dict, skips_before: int, updates: int, where: str) -> None:
    """RunError unless at least one of this process's `updates` optimizer updates applied."""
    if updates <= 0:
        return
    skipped = skips(opt_state) - skips_before
    if skipped >= updates:
        raise RunError(f"no training step succeeded: all {updates} updates had a non-finite loss or gradient "
                       "and were skipped, so the weights are unchanged", where=where,
                       fix="lower --optim.lr, raise the loss temperature or check the data; no export was written")
    if skipped * 2 > updates:
        log.warning("%d of %d updates were skipped (non-finite loss or gradient norm): the run learned from few "
                    "steps; lower --optim.lr or raise the loss temperature (%s)", skipped, updates, where)
