#!/usr/bin/env bash
# Single-query latency on the whole standard library, the current re-rank against the legacy one
# interleaved in one pinned child (benchmarks.search_scale --corpus stdlib: 52,892 functions of
# this box's Python 3.11 stdlib, carried in .gpu/c/search/stdlib_corpus.json.xz), on the lent GPU
# after gpu_device.sh (carry [".gpu/c"]): embedding and exact scores on the GPU, the index
# written on the CPU, latency on 2 pinned cores with OpenBLAS on one thread (query encoding on
# the CPU). ~3-4 minutes. Writes benchmarks/results/<machine>/search_scale_stdlib.json (and $OUT).
set -euo pipefail
M=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -q H200 && echo h200 || echo h100)
export PYTHONPATH=$PWD MLX_ENABLE_TF32=0
SYS=/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0
if [ -f $SYS ]; then export MLXIO_BLAS=$SYS
else  # the CUDA wheel's reference BLAS takes ~250 ms per query encoding: the carried OpenBLAS
  mkdir -p /tmp/search_blas
  for f in .gpu/search/blas/*.xz; do
    python3 -c "import lzma, sys; open(sys.argv[2], 'wb').write(lzma.decompress(open(sys.argv[1], 'rb').read()))" \
      "$f" "/tmp/search_blas/$(basename "$f" .xz)"
  done
  export MLXIO_BLAS=/tmp/search_blas/libopenblas.so.0 LD_LIBRARY_PATH=/tmp/search_blas:${LD_LIBRARY_PATH:-}
fi
python3 -c "from mlxio.runtime import setup; setup(); from mlxio import blas; print('BLAS:', blas.status)"
python3 -m benchmarks.search_scale --corpus stdlib --machine "$M" --corpus-file .gpu/search/stdlib_corpus.json.xz \
  --work /tmp/search_stdlib --batch-size 128 --blas-threads 1 --out "benchmarks/results/$M/search_scale_stdlib.json"
[ -n "${OUT:-}" ] && cp "benchmarks/results/$M/search_scale_stdlib.json" "$OUT/"
