# Issue 20's GPU records (whole stdlib of THIS box's Python + the 1M synthetic corpus, pq64).
# Prepare here (git-ignored .gpu/search, ~9.3 MB): the corpus and an OpenBLAS for MLX's CPU stream:
#   python -m benchmarks.search_scale --export-corpus .gpu/search/stdlib_corpus.json.xz
#   mkdir -p .gpu/search/blas; for f in /usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0 \
#     /lib/x86_64-linux-gnu/libgfortran.so.5 /lib/x86_64-linux-gnu/libquadmath.so.0; do
#     xz -c $f > .gpu/search/blas/$(basename $f).xz; done
# Run on the device (repo root, carry [".gpu/search"], after MLX's CUDA setup, .gpu/run2):
#   bash dev/gpu/search_scale_gpu.sh 540   - 2-3 times (resumable; stdlib ~4-7 min, 1M build ~3-5 min,
#   search ~3 min, edit ~1 min, estimates); $OUT gets <= 7 files, search_scale.json once all are done
# Record here: python -m benchmarks.search_scale_synth --record FILES_AT --machine h100
# Usage: bash dev/gpu/search_scale_gpu.sh [BUDGET_S] [SYNTHETIC]
# Resumable: each call runs the phases not yet done (markers in $W) while BUDGET_S (default
# 540) lasts, copies every finished phase's JSON + the log to $OUT after each phase.
#   1 stdlib  : this box's Python 3.11 stdlib (52,892 functions, carried in stdlib_corpus.json.xz):
#               MiniLM f16 embedding + exact MaxSim + pq64 codes on the GPU, index written on the CPU,
#               latency in a child pinned to 2 cores (query encoding on the CPU, OpenBLAS 1 thread)
#   2 synth_build : 1,000,000-function synthetic corpus from the stdlib index's codes (CPU workers),
#               exact MaxSim of every query over every function on the GPU
#   3 synth_search: latency + MRR on the 1M index, child pinned to 2 cores
#   4 synth_edit  : one file edited twice + one deleted in the 1M index (embedding on the GPU)
set -o pipefail
if [ -z "$SEARCH_NO_SETUP" ] && [ -f .gpu/run2/env.sh ]; then  # this session's device set-up (a local dry run sets SEARCH_NO_SETUP)
  source .gpu/run2/env.sh
  bash .gpu/run2/setup.sh > /dev/null 2>&1
fi
export PYTHONPATH=${PYTHONPATH:-$PWD}
S=.gpu/search
W=${SEARCH_WORK:-/tmp/search_h100}
OUT=${OUT:-/tmp/search_out}
BUDGET=${1:-540}
N=${2:-1000000}
END=$(( $(date +%s) + BUDGET ))
mkdir -p $W $OUT
touch $W/run.log
say() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a $W/run.log; }
# OpenBLAS for MLX's CPU stream: the CUDA wheel bundles the reference BLAS (MiniLM query ~250 ms)
if [ -z "$MLXIO_BLAS" ]; then
  SYS=/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0
  if [ -f $SYS ]; then export MLXIO_BLAS=$SYS
  else
    mkdir -p /tmp/search_blas
    for f in $S/blas/*.xz; do
      t=/tmp/search_blas/$(basename $f .xz)
      [ -f $t ] || python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.decompress(open(sys.argv[1],'rb').read()))" $f $t
    done
    export MLXIO_BLAS=/tmp/search_blas/libopenblas.so.0 LD_LIBRARY_PATH=/tmp/search_blas:$LD_LIBRARY_PATH
  fi
fi
export MLX_ENABLE_TF32=0  # exact MaxSim, centroids and codes in full float32 on the GPU (MLX's default is TF32)
BLAS_STATUS=$(python3 -c "import mlxio; print(mlxio.blas.status)" 2>&1 | tail -1)
if [ "${BLAS_STATUS#openblas:}" = "$BLAS_STATUS" ] && [ -z "$SEARCH_ALLOW_REFERENCE_BLAS" ]; then
  echo "MLX's CPU stream has no OpenBLAS ($BLAS_STATUS): CPU query latency would be meaningless; stopping" >&2; exit 2
fi
say "start: budget ${BUDGET}s, work $W, MLX CPU BLAS $BLAS_STATUS, $(nproc) cores, $(python3 -c 'import mlx.core as mx; print(mx.default_device())' 2>&1 | tail -1)"
# $OUT gets at most 7 files (the device returns 8): run.log, phase.log (the running phase's full log),
# stdlib_entry.json, synth_build.json, synth_search.json, synth_edit.json, search_scale.json
copy() { cp $W/stdlib_entry.json $W/synth_build.json $W/synth_search.json $W/synth_edit.json $OUT/ 2>/dev/null
         cp $W/run.log $OUT/run.log; cp -L $W/current.log $OUT/phase.log 2>/dev/null; }
( while sleep 15; do cp $W/run.log $OUT/run.log; cp -L $W/current.log $OUT/phase.log 2>/dev/null; done ) &  # logs come back even if the call is cut off
COPIER=$!
trap 'kill $COPIER 2>/dev/null' EXIT
# phase NAME MARKER EXPECTED_MAX_S COMMAND...
phase() {
  local name=$1 marker=$2 need=$3; shift 3
  if [ -f $W/$marker ]; then say "$name: done already"; return 0; fi
  local left=$(( END - $(date +%s) ))
  if [ $left -lt $need ]; then say "$name: needs up to ${need}s, ${left}s left: run again"; copy; exit 0; fi
  say "$name: start (${left}s left)"
  local t0=$(date +%s)
  ln -sfn $W/$name.log $W/current.log
  timeout -s INT -k 15 $left "$@" > $W/$name.log 2>&1
  local rc=$?
  if [ $rc -eq 0 ]; then grep -E "^\[" $W/$name.log | grep -vE "embedded [0-9]+/" | tail -12 | tee -a $W/run.log
  else tail -40 $W/$name.log | tee -a $W/run.log; fi
  say "$name: rc $rc in $(( $(date +%s) - t0 ))s"
  copy
  if [ $rc -ne 0 ] || [ ! -f $W/$marker ]; then say "$name FAILED (rc $rc)"; exit 1; fi
}
phase stdlib stdlib_entry.json 420 python3 -m benchmarks.search_scale --corpus stdlib --machine h100 \
  --corpus-file $S/stdlib_corpus.json.xz --work $W --out $W/stdlib_out.json --resume --batch-size 128 \
  ${SEARCH_LIMIT:+--limit $SEARCH_LIMIT}
phase synth_build synth_build.json 420 python3 -m benchmarks.search_scale_synth --work $W --phase build \
  --synthetic $N --workers ${SEARCH_WORKERS:-12}
phase synth_search synth_search.json 260 python3 -m benchmarks.search_scale_synth --work $W --phase search \
  --search-budget 150
phase synth_edit synth_edit.json 90 python3 -m benchmarks.search_scale_synth --work $W --phase edit \
  --corpus-file $S/stdlib_corpus.json.xz
python3 -m benchmarks.search_scale_synth --record $W --machine h100 --out $OUT/search_scale.json > /dev/null \
  && say "all phases done: $OUT/search_scale.json"
copy
ls -la $OUT
