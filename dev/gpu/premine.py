"""Mine every library of a package list once, in parallel, into a cache folder, before several
retriever runs start side by side (each would otherwise mine them all itself). The packages'
sources must already lie unpacked in CACHE/pypi (dev/gpu/pack_pypi_cache.sh's tarball).

    python3 dev/gpu/premine.py DEFAULT_PACKAGES|WIDE_PACKAGES [--workers 8] [--cache_dir runs/.cache]
"""

from __future__ import annotations

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # first: MLX's CPU BLAS is chosen when mlx.core loads (mlxio.runtime)

import argparse
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path

from mlxio.data import pairs, pypi_sources


def mine(spec: str, cache_dir: str) -> tuple[str, int]:
    root = pypi_sources.fetch(spec, cache_dir).root  # the unpacked copy: the recipe's path
    return spec, len(pairs.mine_corpus([Path(root)], cache_dir=cache_dir, extras=True).pairs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("packages", choices=("DEFAULT_PACKAGES", "WIDE_PACKAGES"))
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--cache_dir", default="runs/.cache")
    args = ap.parse_args()
    with ProcessPoolExecutor(args.workers) as pool:
        for spec, n in pool.map(partial(mine, cache_dir=args.cache_dir), getattr(pypi_sources, args.packages)):
            print(f"{spec}: {n} pairs")


if __name__ == "__main__":
    main()
