#!/usr/bin/env bash
# The full preset's data study (benchmarks/results/h100/xtr_full_levers.json), 3 seeds a lever,
# side by side on one lent GPU (dev/gpu/bg.sh), after gpu_device.sh has installed MLX and
# MiniLM and the wide PyPI sources (PACKAGES=WIDE_PACKAGES dev/gpu/pack_pypi_cache.sh) lie at
# /tmp/pypi_wide.tar.xz. Every lever names its settings, the preset's as they were before the
# study (7 libraries, grad cache 256 x 200 steps, every held-out file a candidate):
#   base:    that setting
#   rank64:  the same with LoRA rank 64 (alpha 128) instead of 16
#   doc512:  the same at 512 document tokens instead of 256 (not run)
#   wide:    16 more training libraries (pypi_sources.WIDE_PACKAGES, ~2.2x the pairs), 200 steps
#   wide400: the same for 400 steps (the full preset since)
# Held-out packages are the same in every lever; held-out files grow with the wide corpus, so
# their candidates are capped at 15,000 there (the default corpus has ~14,800).
#   bash dev/gpu/xtr_full_data_levers.sh [LEVER...]     # default: base rank64 wide wide400
# On an 80 GB H100 twelve runs started together ran out of GPU memory in evaluation: start the
# wide levers once the others have trained (five at a time ran). Each lever records into
# benchmarks/results/<machine>/xtr_full_levers_<lever>.json (runs of one file never race); the
# committed xtr_full_levers.json gathers the finished runs' entries:
#   python -m benchmarks.xtr_heldout_packages --presets full --machine h100 --variants inbatch \
#     --runs runs/lever_LEVER --results benchmarks/results/h100/xtr_full_levers.json
# Poll with: bash dev/gpu/bg.sh wait 540
set -euo pipefail
M=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -q H200 && echo h200 || echo h100)
mkdir -p runs/.cache
[ -d runs/.cache/pypi/xarray-2024.11.0 ] || tar xJf /tmp/pypi_wide.tar.xz -C runs/.cache
default=$(python3 -c 'from mlxio.data import pypi_sources as p; print(",".join(p.DEFAULT_PACKAGES))')
wide=$(python3 -c 'from mlxio.data import pypi_sources as p; print(",".join(p.WIDE_PACKAGES))')
# mine every library once (16 cores) before the runs start: they would each mine them otherwise
python3 dev/gpu/premine.py WIDE_PACKAGES --workers 12
before="--data.packages $default --data.max_eval_candidates 0 --train.steps 200 --optim.total_steps 200"
declare -A flags=(
  [base]="$before"
  [rank64]="$before --lora.rank 64 --lora.alpha 128"
  [doc512]="$before --data.max_doc_len 512"
  [wide]="--data.packages $wide --data.max_eval_candidates 15000 --train.steps 200 --optim.total_steps 200"
  [wide400]="--data.packages $wide --data.max_eval_candidates 15000 --train.steps 400 --optim.total_steps 400"
)
levers=("$@"); [ ${#levers[@]} -gt 0 ] || levers=(base rank64 wide wide400)
for lever in "${levers[@]}"; do
  # shellcheck disable=SC2086
  bash dev/gpu/bg.sh start "lever_$lever" python3 -m benchmarks.xtr_heldout_packages --presets full \
    --machine "$M" --variants inbatch --jobs 3 --cache_dir runs/.cache --min_start_s 0 \
    --runs "runs/lever_$lever" --results "benchmarks/results/$M/xtr_full_levers_$lever.json" \
    -- --train.compile false ${flags[$lever]}
done
