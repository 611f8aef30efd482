"""Pack the sources a retriever run mines - PyPI, npm and Debian packages, fetched here first -
into one tar.xz for a machine without internet (the lent GPU), keeping only what mining and the
licence records read: the mined files (`polyglot.SUFFIXES`), PyPI's *.dist-info, npm's
package.json and Debian's copyright files.

    python dev/gpu/pack_sources.py OUT.tar.xz [--preset multilingual] [--heldout] [--cache_dir runs/.cache]

--preset: the xtr_lora preset whose data.packages are packed; --heldout: also every language's
held-out packages (package_sources.HELDOUT, for benchmarks.search_languages). On the other
machine: `python3 -m tarfile -e OUT.tar.xz CACHE_DIR`; mlxio.data then mines the unpacked copies
offline (an unpacked copy alone will do).
"""

from __future__ import annotations

from mlxio.runtime import setup

if __name__ == "__main__":
    setup()  # first: MLX's CPU BLAS is chosen when mlx.core loads (mlxio.runtime)

import argparse
import tarfile
from pathlib import Path

from mlxio.data import package_sources, polyglot, xtr_data


def needed_files(entries: list[str], cache_dir: Path) -> set[Path]:
    """The files mining and licence records read, of every entry (PyPI "name==version", or
    "pypi:"/"npm:"/"deb:" entries with an optional folder to mine), fetched into cache_dir
    when not there yet: the mined folder's source files, and the package's metadata files."""
    files = set()
    for entry in entries:
        source, mined, _ = xtr_data.fetch_package(entry, cache_dir)
        root = Path(source.root)
        files |= {f for f in mined.rglob("*") if f.suffix in polyglot.SUFFIXES and f.is_file() and not f.is_symlink()}
        for pattern in ("*.dist-info/*", "*/package.json", "usr/share/doc/*/copyright"):
            files |= {f for f in root.glob(pattern) if f.is_file() and not f.is_symlink() and f.name != "RECORD"}
    return files


def main() -> None:
    from recipes.presets import load
    from recipes.xtr_lora_config import Config

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--preset", default="multilingual")
    parser.add_argument("--heldout", action="store_true")
    parser.add_argument("--cache_dir", type=Path, default=Path("runs/.cache"))
    args = parser.parse_args()
    entries = list(load("xtr_lora", Config)[args.preset].data.packages)
    if args.heldout:
        entries += [e for group in package_sources.HELDOUT.values() for e in group]
    cache = args.cache_dir.resolve()
    files = sorted(needed_files(entries, cache))
    tmp = args.out.with_suffix(".tmp")
    with tarfile.open(tmp, "w:xz") as tar:
        for f in files:
            tar.add(f, arcname=str(f.relative_to(cache)), recursive=False)
    tmp.rename(args.out)
    print(f"{args.out}: {len(files)} files of {len(entries)} packages, {args.out.stat().st_size / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
