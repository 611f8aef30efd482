"""Mine every library of a package list once, in parallel, into a cache folder, before several
retriever runs start side by side (each would otherwise mine them all itself). The packages'
sources must already lie unpacked in the cache (dev/gpu/pack_pypi_cache.sh's or
dev/gpu/pack_sources.py's tarball).

    python3 dev/gpu/premine.py DEFAULT_PACKAGES|WIDE_PACKAGES|PRESET [--workers 8] [--cache_dir runs/.cache]

PRESET: an xtr_lora preset (e.g. multilingual): its data.packages, npm and Debian ones too, and
the standard library, each mined as the recipe mines it (same cache keys).
"""

from __future__ import annotations

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # first: MLX's CPU BLAS is chosen when mlx.core loads (mlxio.runtime)

import argparse
from concurrent.futures import ProcessPoolExecutor
from functools import partial

from mlxio.data import pairs, pypi_sources, xtr_data


def mine(spec: str, cache_dir: str) -> tuple[str, int]:
    """Mine one package list entry (or "stdlib") as recipes.xtr_lora does; (spec, pairs)."""
    if spec == "stdlib":
        return spec, len(pairs.mine_corpus([pairs.stdlib_root()], cache_dir=cache_dir).pairs)
    _, root, registry = xtr_data.fetch_package(spec, cache_dir)
    return spec, len(xtr_data.mine_package(root, registry, cache_dir).pairs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("packages", help="DEFAULT_PACKAGES, WIDE_PACKAGES or an xtr_lora preset's name")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--cache_dir", default="runs/.cache")
    args = ap.parse_args()
    if args.packages in ("DEFAULT_PACKAGES", "WIDE_PACKAGES"):
        specs = list(getattr(pypi_sources, args.packages))
    else:
        from recipes.presets import load
        from recipes.xtr_lora_config import Config

        specs = ["stdlib", *load("xtr_lora", Config)[args.packages].data.packages]
    with ProcessPoolExecutor(args.workers) as pool:
        for spec, n in pool.map(partial(mine, cache_dir=args.cache_dir), specs):
            print(f"{spec}: {n} pairs")


if __name__ == "__main__":
    main()
