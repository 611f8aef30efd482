"""The RLAIF recipe as a worker for an external trainer: JSON-RPC 2.0 on stdin/stdout.

Run:  python -m recipes.rlaif_worker                   # serves until EOF or `shutdown`
      python -m recipes.rlaif_worker --max-line-bytes 1048576 --log-level WARNING

One process serves both roles of the seed's design (generator and trainer) with the recipe's
config (`initialize` takes a preset of recipes.rlaif_config and overrides), loss, step and
checkpoints. stdout carries protocol lines only; logs go to stderr. Protocol, methods and
JSON Schemas: docs/worker-protocol.md; code: mlxio/rl/worker.py, mlxio/rpc.py.
"""

from __future__ import annotations

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # first: MLX's CPU BLAS is chosen when mlx.core loads (mlxio.runtime)

from mlxio.rl.worker import serve_stdio
from recipes.rlaif_config import PRESETS, validate


def main(argv: list[str] | None = None) -> int:
    return serve_stdio(argv, PRESETS, validate, prog="python -m recipes.rlaif_worker")


if __name__ == "__main__":
    raise SystemExit(main())
