#!/usr/bin/env bash
# The full preset (grad cache 256 x 200 steps) against four levers, 3 seeds each, side by side
# on one lent GPU (dev/gpu/bg.sh), after gpu_device.sh has installed MLX and MiniLM and the wide
# PyPI sources (PACKAGES=WIDE_PACKAGES dev/gpu/pack_pypi_cache.sh) lie at /tmp/pypi_wide.tar.xz:
#   base:    the preset as configured
#   wide:    16 more training libraries (pypi_sources.WIDE_PACKAGES, ~3x the pairs), 200 steps
#   wide400: the same for 400 steps
#   rank64:  LoRA rank 64 (alpha 128) instead of 16
#   doc512:  512 document tokens instead of 256
# Held-out packages are the same in every lever; held-out files grow with the wide corpus, so
# their candidates are capped at 15,000 there (the default corpus has 14,764).
#   bash dev/gpu/xtr_full_data_levers.sh [LEVER...]     # default: all five
# Results: benchmarks/results/<machine>/xtr_full_levers_<lever>.json; poll with
#   bash dev/gpu/bg.sh wait 540
set -euo pipefail
M=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -q H200 && echo h200 || echo h100)
mkdir -p runs/.cache
[ -d runs/.cache/pypi/xarray-2024.11.0 ] || tar xJf /tmp/pypi_wide.tar.xz -C runs/.cache
wide=$(python3 -c 'from mlxio.data import pypi_sources as p; print(",".join(p.WIDE_PACKAGES))')
# mine every library once (16 cores) before the runs start: they would each mine them otherwise
python3 - <<'PY'
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from mlxio.data import pairs, pypi_sources

def mine(spec):
    root = pypi_sources.fetch(spec, "runs/.cache").root  # the unpacked copy: the recipe's path
    return spec, len(pairs.mine_corpus([Path(root)], cache_dir="runs/.cache", extras=True).pairs)

with ProcessPoolExecutor(12) as pool:
    for spec, n in pool.map(mine, pypi_sources.WIDE_PACKAGES):
        print(f"{spec}: {n} pairs")
PY
declare -A flags=(
  [base]=""
  [wide]="--data.packages $wide --data.max_eval_candidates 15000"
  [wide400]="--data.packages $wide --data.max_eval_candidates 15000 --train.steps 400 --optim.total_steps 400"
  [rank64]="--lora.rank 64 --lora.alpha 128"
  [doc512]="--data.max_doc_len 512"
)
levers=("$@"); [ ${#levers[@]} -gt 0 ] || levers=(base wide wide400 rank64 doc512)
for lever in "${levers[@]}"; do
  # shellcheck disable=SC2086
  bash dev/gpu/bg.sh start "lever_$lever" python3 -m benchmarks.xtr_heldout_packages --presets full \
    --machine "$M" --variants inbatch --jobs 3 --cache_dir runs/.cache --min_start_s 0 \
    --runs "runs/lever_$lever" --results "benchmarks/results/$M/xtr_full_levers_$lever.json" \
    -- --train.compile false ${flags[$lever]}
done
