#!/usr/bin/env bash
# The quick preset's batch study (benchmarks/results/<machine>/xtr_quick_levers.json), 3 seeds a
# lever, side by side on one lent GPU (dev/gpu/bg.sh), after gpu_device.sh has installed MLX and
# MiniLM and the default PyPI sources (dev/gpu/pack_pypi_cache.sh) lie at /tmp/pypi_sources.tar.xz.
# quick trains on a 2-core CPU, where its cost is the pairs it encodes: 80 steps x 48 = 3,840
# pairs in the preset the study began from, and a grad-cache step (one contrastive batch of
# micro x accum pairs) costs ~1.3x a plain one per pair. Every lever names its settings (quick's
# own for the rest: in-batch negatives, 128 document tokens, no dev evaluation, the last step kept):
#   base:        quick as it was (12 x 4 = 48 pairs a step, 80 steps, lr 2e-4, 10 warm-up steps)
#   gc256x15:    one batch of 256 (32 x 8, grad cache), 15 steps, lr 2e-4   (3,840 pairs)
#   gc256x15lr4: the same at lr 4e-4 (the quick preset since)
#   gc256x20lr4: 20 steps at lr 4e-4                                         (5,120 pairs)
#   gc256x30:    30 steps at lr 2e-4                                         (7,680 pairs)
#   gc256x30lr4: 30 steps at lr 4e-4
#   gc128x30lr4: one batch of 128 (16 x 8), 30 steps at lr 4e-4             (3,840 pairs)
#   gc256x15lr6, gc256x15lr8: 15 steps at lr 6e-4, 8e-4; gc256x20lr6: 20 steps at 6e-4
#   gc512x8lr8:  one batch of 512 (64 x 8), 8 steps at lr 8e-4, warmup 1    (4,096 pairs)
#   gc256x15lr4t02, gc256x15lr4t05: gc256x15lr4 at temperature 0.02, 0.05 (quick: 0.03)
# Then, on top of the quick preset (gc256x15lr4), the levers that need no new code:
#   q_mw0, q_mw03:   margin-loss weight 0 (InfoNCE alone), 0.3 (quick: 0.1)
#   q_minlr2:        cosine decay to 0.2 x lr instead of 0
#   q_r8, q_r32:     LoRA rank 8 / 32 (alpha 2 x rank, as quick's 16 / 32)
#   q_a64:           rank 16 at alpha 64 (the LoRA update scaled 4, not 2)
#   q_wu0, q_clip0:  no warm-up; no gradient clipping
#   q_t025, q_lr5:   temperature 0.025; lr 5e-4
# And how the pairs form a step (--train.batch_order; quick: "length", similar lengths together):
#   q_rand:          a uniform sample per step ("random")
#   q_nb:            consecutive pairs by source file ("neighbours": in-batch negatives of the same code)
#   q_nb_t05:        q_nb at temperature 0.05; q_nb_lr2: q_nb at lr 2e-4
#   bash dev/gpu/xtr_quick_levers.sh [LEVER...]     # default: all of them
# Each lever records into benchmarks/results/<machine>/xtr_quick_levers_<lever>.json; the
# committed xtr_quick_levers.json is those files' entries, concatenated. To record finished runs
# again, run this script again: it passes each lever's flags (a run folder refuses a command with
# other settings). Poll with: bash dev/gpu/bg.sh wait 540
set -euo pipefail
M=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -q H200 && echo h200 || echo h100)
mkdir -p runs/.cache
[ -d runs/.cache/pypi/sympy-1.13.3 ] || tar xJf /tmp/pypi_sources.tar.xz -C runs/.cache
# mine every library once before the runs start: they would each mine them otherwise
python3 dev/gpu/premine.py DEFAULT_PACKAGES --workers 8
# every lever names its settings: the preset changed under the study (gc256x15lr4 is quick now)
gc="--train.grad_cache true --train.accum 8 --optim.warmup_steps 2"
declare -A flags=(
  [base]="--train.grad_cache false --train.micro_batch 12 --train.accum 4 --train.steps 80 --optim.lr 2e-4 --optim.warmup_steps 10"
  [gc256x15]="$gc --train.micro_batch 32 --train.steps 15 --optim.lr 2e-4"
  [gc256x15lr4]="$gc --train.micro_batch 32 --train.steps 15 --optim.lr 4e-4"
  [gc256x20lr4]="$gc --train.micro_batch 32 --train.steps 20 --optim.lr 4e-4"
  [gc256x30]="$gc --train.micro_batch 32 --train.steps 30 --optim.lr 2e-4"
  [gc256x30lr4]="$gc --train.micro_batch 32 --train.steps 30 --optim.lr 4e-4"
  [gc128x30lr4]="$gc --train.micro_batch 16 --train.steps 30 --optim.lr 4e-4"
  [gc256x15lr6]="$gc --train.micro_batch 32 --train.steps 15 --optim.lr 6e-4"
  [gc256x15lr8]="$gc --train.micro_batch 32 --train.steps 15 --optim.lr 8e-4"
  [gc256x20lr6]="$gc --train.micro_batch 32 --train.steps 20 --optim.lr 6e-4"
  [gc512x8lr8]="--train.grad_cache true --train.accum 8 --optim.warmup_steps 1 --train.micro_batch 64 --train.steps 8 --optim.lr 8e-4"
  [gc256x15lr4t02]="$gc --train.micro_batch 32 --train.steps 15 --optim.lr 4e-4 --loss.temperature 0.02"
  [gc256x15lr4t05]="$gc --train.micro_batch 32 --train.steps 15 --optim.lr 4e-4 --loss.temperature 0.05"
)
q="$gc --train.micro_batch 32 --train.steps 15 --optim.lr 4e-4"  # the quick preset
flags+=(
  [q_mw0]="$q --loss.margin_weight 0"
  [q_mw03]="$q --loss.margin_weight 0.3"
  [q_minlr2]="$q --optim.min_lr_ratio 0.2"
  [q_r8]="$q --lora.rank 8 --lora.alpha 16"
  [q_r32]="$q --lora.rank 32 --lora.alpha 64"
  [q_a64]="$q --lora.alpha 64"
  [q_wu0]="${q/--optim.warmup_steps 2/--optim.warmup_steps 0}"
  [q_clip0]="$q --optim.clip_norm 0"
  [q_t025]="$q --loss.temperature 0.025"
  [q_lr5]="${q/--optim.lr 4e-4/--optim.lr 5e-4}"
  [q_rand]="$q --train.batch_order random"
  [q_nb]="$q --train.batch_order neighbours"
  [q_nb_t05]="$q --train.batch_order neighbours --loss.temperature 0.05"
  [q_nb_lr2]="${q/--optim.lr 4e-4/--optim.lr 2e-4} --train.batch_order neighbours"
)
levers=("$@"); [ ${#levers[@]} -gt 0 ] || levers=("${!flags[@]}")
for lever in "${levers[@]}"; do
  # shellcheck disable=SC2086
  bash dev/gpu/bg.sh start "qlever_$lever" python3 -m benchmarks.xtr_heldout_packages --presets quick \
    --machine "$M" --variants inbatch --jobs 3 --cache_dir runs/.cache --min_start_s 0 \
    --runs "runs/qlever_$lever" --results "benchmarks/results/$M/xtr_quick_levers_$lever.json" \
    -- --train.compile false ${flags[$lever]}
done
