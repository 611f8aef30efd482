#!/usr/bin/env bash
# The multilingual retriever study on a lent GPU (benchmarks/search_multilingual.py): 3 arms x 3
# seeds of recipes.xtr_lora side by side, then every model per language on held-out packages.
# Staged by `bash dev/gpu/stage.sh xtr` (here); on the device, after the stage parts' calls:
#   carry [".gpu/xN"]  bash dev/gpu/stage_device.sh xtr && bash dev/gpu/xtr_multilingual.sh [JOBS]
# Results: $OUT/search_multilingual.json (-> benchmarks/results/h200/), the runs' logs as one tar.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
JOBS=${1:-9}
M=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -q H200 && echo h200 || echo h100)
out=${OUT:-runs/out}; mkdir -p "$out"
t0=$(date +%s)
python3 dev/gpu/premine.py multilingual --workers 14 --cache_dir runs/.cache | tail -3
echo "premined in $(( $(date +%s) - t0 )) s"
python3 -m benchmarks.search_multilingual --runs runs/multilingual --seeds 0,1,2 --jobs "$JOBS" --machine "$M" \
  --cache_dir runs/.cache --out "$out/search_multilingual.json"
rc=$?
echo "study rc $rc in $(( $(date +%s) - t0 )) s"
tar czf "$out/multilingual_logs.tar.gz" runs/multilingual/logs runs/multilingual/*/eval.json 2>/dev/null
exit $rc
