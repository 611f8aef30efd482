"""The RLAIF recipe as a worker for an external trainer: JSON-RPC 2.0 on stdin/stdout.

Run:  python -m recipes.rlaif_worker                   # serves until EOF or `shutdown`
      python -m recipes.rlaif_worker --max-line-bytes 1048576 --log-level WARNING

One process serves both roles of the seed's design (generator and trainer) with the recipe's
config (`initialize` takes a preset of recipes.rlaif_config and overrides), policy, loss, step
and checkpoints, built from the config as `recipes.rlaif_qwen` builds them, so a train_step
here equals the recipe's step on the same batch and a checkpoint either writes the other
resumes. stdout carries protocol lines only; logs go to stderr. Protocol, methods
and JSON Schemas: docs/worker-protocol.md; the methods: mlxio/rl/worker_methods.py; the wire
and the requests' checks: mlxio/rl/worker.py, mlxio/rpc.py.
"""

from __future__ import annotations

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # first: MLX's CPU BLAS is chosen when mlx.core loads (mlxio.runtime)

from mlxio import rpc
from mlxio.rl.worker import serve_stdio
from mlxio.rl.worker_methods import Worker
from recipes.rlaif_config import PRESETS, batch_settings, open_session, validate


def make_worker(max_line_bytes: int = rpc.DEFAULT_MAX_LINE_BYTES) -> Worker:
    """The worker's methods over this recipe's presets, checks and session (recipes.rlaif_config)."""
    return Worker(PRESETS, validate, open_session, batch_settings, max_line_bytes)


def main(argv: list[str] | None = None) -> int:
    return serve_stdio(argv, lambda max_line_bytes: make_worker(max_line_bytes).server(),
                       prog="python -m recipes.rlaif_worker", description=__doc__)


if __name__ == "__main__":
    raise SystemExit(main())
