#!/usr/bin/env bash
# Pack the pinned PyPI sources the retriever mines - only their .py files and *.dist-info
# metadata (name, version, licence texts) - into one tarball for a machine without internet
# (the lent GPU). Fetches any listed package the cache lacks first (pip, once).
#
#   [PACKAGES=WIDE_PACKAGES] dev/gpu/pack_pypi_cache.sh [CACHE_DIR] [OUT]     # defaults: runs/.cache runs/pypi_sources.tar.xz
#
# On the other machine, `benchmarks/xtr_heldout_packages.py --pypi_tarball OUT` unpacks it into
# its --cache_dir (or by hand: python3 -m tarfile -e OUT CACHE_DIR); mlxio.data.pypi_sources
# then mines the unpacked sources offline (no wheel needed).
set -euo pipefail
cache=${1:-runs/.cache}
out=${2:-runs/pypi_sources.tar.xz}
packages=${PACKAGES:-DEFAULT_PACKAGES}  # or WIDE_PACKAGES: the wider corpus (mlxio/data/pypi_sources.py)
root=$(cd "$(dirname "$0")/../.." && pwd)
python=${PYTHON:-}
if [ -z "$python" ]; then
  if [ -x "$root/.venv/bin/python" ]; then python=$root/.venv/bin/python; else python=python3; fi
fi
PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" "$python" -c '
import sys
from mlxio.data import pypi_sources
for src in pypi_sources.fetch_all(getattr(pypi_sources, sys.argv[2]), sys.argv[1]):
    print(f"{src.name}=={src.version} ({src.licence})", file=sys.stderr)
' "$cache" "$packages"
mkdir -p "$(dirname "$out")"
out=$(cd "$(dirname "$out")" && pwd)/$(basename "$out")
list=$(mktemp)
trap 'rm -f "$list"' EXIT
# only the listed packages' unpacked sources (another version left in the cache is not packed)
dirs=$(PYTHONPATH="$root" "$python" -c '
from mlxio.data import pypi_sources
import sys
print(" ".join("pypi/%s-%s/src" % pypi_sources.parse_spec(s) for s in getattr(pypi_sources, sys.argv[1])))' "$packages")
cd "$cache"
# shellcheck disable=SC2086
find $dirs -type f \( -name '*.py' -o -path '*.dist-info/*' \) ! -name RECORD | LC_ALL=C sort > "$list"
tar --no-recursion --owner=0 --group=0 --numeric-owner -T "$list" -cf - | xz -6 -T1 > "$out.tmp"
mv "$out.tmp" "$out"
echo "$out: $(wc -l < "$list") files, $(du -h "$out" | cut -f1)" >&2
