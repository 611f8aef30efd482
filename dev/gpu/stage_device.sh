#!/usr/bin/env bash
# The device side of dev/gpu/stage.sh, run at the start of every call from the checkout's root:
# stashes the stage parts this call carried in /tmp/<profile>-stage and, once all are there,
# installs MLX (CUDA), mlx-lm, cattrs and the profile's models and wheels, imports the kernel
# archive, and (rlaif) puts bwrap in /usr/bin or (xtr) unpacks the packed sources into
# runs/.cache. Idempotent: a warm machine skips what is done. Exit 3: a part is missing or broken.
#   bash dev/gpu/stage_device.sh rlaif|xtr
# STAGE_DIR / STAGE_PY / STAGE_REHEARSE=1 (no GPU checks): a rehearsal elsewhere (dev/gpu/rlaif_calls.md).
set -uo pipefail
profile=${1:?usage: stage_device.sh rlaif|xtr}
case $profile in rlaif) letter=r ;; xtr) letter=x ;; *) echo "stage_device: profile rlaif or xtr" >&2; exit 2 ;; esac
S=${STAGE_DIR:-/tmp/$profile-stage}
PY=${STAGE_PY:-python3}
mkdir -p "$S"
for d in .gpu/$letter?; do
  [ -d "$d" ] && cp -n "$d"/stage.* "$S"/ 2>/dev/null
done
say() { echo "stage_device ($profile): $*"; }
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
if [ -f "$S/installed" ]; then
  [ "$profile" = xtr ] && { mkdir -p runs/.cache; [ -d runs/.cache/pypi ] || tar xJf "$S/x/sources.tar.xz" -C runs/.cache; }
  say "installed already"; exit 0
fi
want=$(cat "$S/stage.count" 2>/dev/null || echo 99)
have=$(ls "$S"/stage.part? 2>/dev/null | wc -l)
if [ "$have" -lt "$want" ]; then say "$have of $want parts here"; exit 0; fi
t0=$(date +%s)
if [ "$(cat "$S"/stage.part? | sha256sum | cut -d' ' -f1)" != "$(cat "$S/stage.sha256")" ]; then
  say "stage parts do not match their checksum"; exit 3
fi
mkdir -p "$S/x" && cat "$S"/stage.part? | xz -d | tar x -C "$S/x" || exit 3
sp=$($PY -c 'import site; print(site.getsitepackages()[0])')
tar xf "$S/x/mlxcuda.tar" -C "$sp" || exit 3
for w in "$S"/x/wheels/*.whl; do $PY -m zipfile -e "$w" "$sp"; done
$PY -m pip install -q --no-index --no-deps --no-compile "$S"/x/models/*.whl || exit 3
if [ "$profile" = rlaif ]; then
  dpkg -x "$S"/x/bubblewrap_*.deb "$S/bw" || exit 3
  command -v bwrap >/dev/null || cp "$S/bw/usr/bin/bwrap" /usr/bin/ || exit 3  # the sandbox looks in /usr/bin
else
  mkdir -p runs/.cache && tar xJf "$S/x/sources.tar.xz" -C runs/.cache || exit 3
fi
if [ -z "${STAGE_REHEARSE:-}" ]; then
  $PY -c 'import mlx.core as mx; print("mlx", mx.__version__, "on", mx.default_device())' || exit 3
  $PY -m mlxio.gpu.kernel_cache_cli import "$S"/x/kernels-sm90-mlx0.32.4.tar.gz || say "kernel archive not imported"
fi
touch "$S/installed"
say "installed in $(( $(date +%s) - t0 )) s"
exit 0
