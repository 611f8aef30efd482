"""No silent nothing: a run whose every optimizer update was skipped (non-finite loss or
gradient) has not trained anything, and must not end as if it had."""

from __future__ import annotations

import logging

from mlxio.errors import RunError

log = logging.getLogger(__name__)


def skips(opt_state: dict) -> int:
    """Updates skipped so far (the counter `mlxcore.train.step` keeps in the optimizer state)."""
    return int(opt_state["skips"])


def require_progress(opt_state: dict, skips_before: int, updates: int, where: str, empty: int = 0) -> None:
    """RunError unless at least one of this process's `updates` optimizer updates applied
    (`empty` of them had nothing to train on: a step without a row to learn from)."""
    if updates <= 0:
        return
    skipped = skips(opt_state) - skips_before
    if empty >= updates:
        raise RunError(f"no training step succeeded: none of the {updates} updates had a completion to train on "
                       "(said at each step in the log), so the weights are unchanged", where=where,
                       fix="raise max_new_tokens (with --grpo.mask_truncated), check the rewards, or drop "
                           "--grpo.skip_equal_groups; no export was written")
    if skipped + empty >= updates:
        why = (f"{skipped} of {updates} updates had a non-finite loss or gradient and were skipped, {empty} had "
               "nothing to train on" if empty else
               f"all {updates} updates had a non-finite loss or gradient and were skipped")
        raise RunError(f"no training step succeeded: {why}, so the weights are unchanged", where=where,
                       fix="lower --optim.lr, raise the loss temperature or check the data; no export was written")
    if (skipped + empty) * 2 > updates:
        log.warning("%d of %d updates were skipped (%d non-finite loss or gradient norm, %d with nothing to train "
                    "on): the run learned from few steps; lower --optim.lr or raise the loss temperature, or check "
                    "the rewards (%s)", skipped + empty, updates, skipped, empty, where)
