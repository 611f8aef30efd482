"""Memory-driven micro-batch size, found without ever crashing the trainer.

MLX aborts the process when an allocation fails, so the trainer never tries a size to see if
it fits. Instead each candidate runs in a child process (`python -m mlxio.run.batch_probe`),
where an abort kills only the probe: a few short probes at small sizes measure peak memory,
a least-squares line `peak ~= fixed + per_sample * micro_batch` extrapolates, the largest
micro-batch that divides the effective batch and fits `safety * budget` is chosen (then
confirmed by one probe at that size, stepping down if it fails or overshoots). The effective
batch stays fixed: accumulation = effective / micro-batch.

During training `recheck` compares the measured peak of each step with the budget and shrinks
the micro-batch (to the next divisor down) before a longer batch can push it over.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs
import mlx.core as mx
import numpy as np

from mlxcore.retrieval.objective import LossConfig
from mlxcore.train.lora import LoraConfig
from mlxio.atomic import write_json_atomic
from mlxio.errors import ConfigError

log = logging.getLogger(__name__)
MB = 1024 * 1024


def device_memory_bytes() -> int:
    """Memory the device can use: the GPU's (MLX device_info) or, on CPU, the machine's RAM."""
    try:
        info = mx.device_info()
        if info.get("memory_size"):
            return int(info["memory_size"])
    except (AttributeError, RuntimeError):
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def memory_budget(budget_mb: float = 0.0, fraction: float = 0.5) -> int:
    """Bytes the trainer may use: `budget_mb` when > 0, else `fraction` of device memory."""
    if budget_mb > 0:
        return int(budget_mb * MB)
    if not 0.0 < fraction <= 1.0:
        raise ConfigError(f"memory fraction {fraction} must be in (0, 1]")
    return int(fraction * device_memory_bytes())


@attrs.frozen
class Probe:
    """One probe's outcome: peak bytes at `micro_batch`, or ok=False with the reason."""

    micro_batch: int
    ok: bool
    peak_bytes: int = 0
    seconds_per_step: float = 0.0
    error: str = ""


def run_probe(spec: dict, micro_batch: int, timeout_s: float = 600.0,
              module: str = "mlxio.run.batch_probe") -> Probe:
    """Run the probe module in a child process; its abort, kill or timeout is a failed Probe."""
    payload = json.dumps({**spec, "micro_batch": micro_batch})  # spec carries "accum" when it matters
    try:
        done = subprocess.run([sys.executable, "-m", module, payload], capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return Probe(micro_batch, False, error=f"timed out after {timeout_s:.0f} s")
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return Probe(micro_batch, False, error=f"exit {done.returncode}: {' | '.join(tail)}")
    try:
        result = json.loads(done.stdout.strip().splitlines()[-1])
        return Probe(micro_batch, True, int(result["peak_bytes"]), float(result["seconds_per_step"]))
    except (IndexError, KeyError, ValueError) as err:
        return Probe(micro_batch, False, error=f"unreadable probe output ({err})")


def fit_line(sizes, peaks) -> tuple[float, float]:
    """(fixed, per_sample) bytes of the least-squares line peak = fixed + per_sample * size.

    One distinct size: all of it is counted per sample (fixed 0) - pessimistic, never optimistic.
    """
    x, y = np.asarray(sizes, np.float64), np.asarray(peaks, np.float64)
    if x.size == 0:
        raise ValueError("fit_line needs at least one probe")
    if np.unique(x).size < 2:
        return 0.0, float(np.max(y / x))
    per_sample, fixed = np.polyfit(x, y, 1)
    return float(fixed), float(max(per_sample, 0.0))


def divisors(n: int) -> list[int]:
    """Positive divisors of n, ascending."""
    return [d for d in range(1, n + 1) if n % d == 0]


def choose_micro_batch(effective: int, fixed: float, per_sample: float, budget: int,
                       max_micro: int = 64, safety: float = 0.9, min_micro: int = 1) -> int | None:
    """Largest divisor of `effective` in [min_micro, max_micro] whose predicted peak fits
    safety * budget; None when none does (an in-batch-negatives loss needs min_micro 2)."""
    fits = [d for d in divisors(effective)
            if min_micro <= d <= max_micro and fixed + per_sample * d <= safety * budget]
    return max(fits) if fits else None


@attrs.frozen(kw_only=True)
class Plan:
    """The chosen split of the effective batch and the evidence for it."""

    micro_batch: int
    accum: int
    budget_bytes: int
    fixed_bytes: float
    per_sample_bytes: float
    probes: tuple[Probe, ...]

    def predicted_peak(self, micro_batch: int | None = None) -> float:
        return self.fixed_bytes + self.per_sample_bytes * (micro_batch or self.micro_batch)

    def as_dict(self) -> dict:
        return {**attrs.asdict(self, recurse=True), "predicted_peak_bytes": self.predicted_peak()}


def plan_micro_batch(spec: dict, effective: int, budget: int, *, max_micro: int = 64, safety: float = 0.9,
                     min_micro: int = 1, probe_sizes: tuple[int, ...] | None = None,
                     probe: Callable[[dict, int], Probe] = run_probe) -> Plan:
    """Probe, fit, choose and confirm a micro-batch for `effective` samples per step.

    ConfigError when even a micro-batch of 1 does not fit the budget (the message gives the
    measured per-sample and fixed costs, so the user can see how far off it is).
    """
    allowed = [d for d in divisors(effective) if min_micro <= d <= max_micro]
    sizes = allowed[:3] if probe_sizes is None else [d for d in probe_sizes if d in allowed]

    def probe_at(size: int) -> Probe:  # the real split: a compiled step holds several micro-batches
        return probe({**spec, "accum": effective // size}, size)

    probes = [probe_at(size) for size in sizes]
    good = [p for p in probes if p.ok]
    if not good:
        raise ConfigError(f"batch probes failed: {[p.error for p in probes]}")
    fixed, per_sample = fit_line([p.micro_batch for p in good], [p.peak_bytes for p in good])
    candidate = choose_micro_batch(effective, fixed, per_sample, budget, max_micro, safety, min_micro)
    while candidate is not None:
        known = next((p for p in good if p.micro_batch == candidate), None)
        check = known or probe_at(candidate)
        if check not in probes:
            probes.append(check)
        if check.ok and check.peak_bytes <= safety * budget:
            return Plan(micro_batch=candidate, accum=effective // candidate, budget_bytes=budget,
                        fixed_bytes=fixed, per_sample_bytes=per_sample, probes=tuple(probes))
        log.info("micro-batch %d: %s; trying smaller", candidate,
                 check.error or f"peak {check.peak_bytes / MB:.0f} MB over {safety * budget / MB:.0f} MB")
        smaller = [d for d in divisors(effective) if min_micro <= d < candidate]
        candidate = smaller[-1] if smaller else None
    raise ConfigError(f"no micro-batch fits the memory budget {budget / MB:.0f} MB (x{safety} safety): "
                      f"fixed {fixed / MB:.0f} MB + {per_sample / MB:.1f} MB per sample")


def recheck(plan: Plan, micro_batch: int, effective: int, observed_peak: int, safety: float = 0.95,
            min_micro: int = 1) -> int:
    """The micro-batch to use next, given a step of `micro_batch` that peaked at `observed_peak`.

    Over `safety * budget`: scale the per-sample cost by what was observed and take the largest
    divisor below the current size that would fit; otherwise keep the current size.
    """
    if observed_peak <= safety * plan.budget_bytes:
        return micro_batch
    per_sample = max(plan.per_sample_bytes, (observed_peak - plan.fixed_bytes) / micro_batch)
    smaller = [d for d in divisors(effective) if min_micro <= d < micro_batch]
    fits = [d for d in smaller if plan.fixed_bytes + per_sample * d <= safety * plan.budget_bytes]
    return max(fits) if fits else (smaller[0] if smaller else micro_batch)


def split_batch(batch: dict, micro_batch: int) -> dict:
    """Leaves [accum, micro, ...] regrouped as [accum * micro / m, m, ...]: the same samples in
    the same order, so the step's data is unchanged and only its split differs."""
    out = {}
    for name, leaf in batch.items():
        total = leaf.shape[0] * leaf.shape[1]
        if total % micro_batch:
            raise ValueError(f"batch of {total} does not split into micro-batches of {micro_batch}")
        out[name] = leaf.reshape(total // micro_batch, micro_batch, *leaf.shape[2:])
    return out


def probe_spec(model_path: str, targets: tuple[str, ...], lora: LoraConfig, loss: LossConfig,
               qat: Sequence[str], *, query_len: int, doc_len: int, gradient_checkpointing: bool,
               compute_dtype: str) -> dict:
    """The `mlxio.run.batch_probe` spec of a retriever run: its model, adapter, loss and options
    at full-length batches (`query_len`, `doc_len`: the padded longest; the worst case for memory)."""
    return {"model": model_path, "lora_rank": lora.rank, "lora_alpha": lora.alpha, "targets": list(targets),
            "query_len": query_len, "doc_len": doc_len,
            "gradient_checkpointing": gradient_checkpointing, "compute_dtype": compute_dtype,
            **attrs.asdict(loss), "qat": list(qat)}


def plan_for_run(spec: dict, samples: int, *, budget_mb: float, budget_fraction: float, max_micro_batch: int,
                 world_size: int = 1, record: Path | None = None) -> Plan:
    """A retriever run's memory-driven split of its `samples` per step (micro_batch x accum):
    the budget (`budget_mb`, else `budget_fraction` of the device's memory), probes of the run's
    `probe_spec`, micro-batches of at least 2 (an in-batch-negatives loss needs a negative) and
    at most `max_micro_batch`; written as JSON to `record` when given."""
    if world_size > 1:
        raise ConfigError("memory.auto_batch: single-process runs only (size each rank's share by hand)")
    budget = memory_budget(budget_mb, budget_fraction)
    plan = plan_micro_batch(spec, samples, budget, max_micro=max_micro_batch, min_micro=2)
    log.info("auto batch: micro-batch %d x accum %d (budget %.0f MB; predicted peak %.0f MB; %d probes)",
             plan.micro_batch, plan.accum, budget / 2**20, plan.predicted_peak() / 2**20, len(plan.probes))
    if record is not None:
        write_json_atomic(record, plan.as_dict())
    return plan
