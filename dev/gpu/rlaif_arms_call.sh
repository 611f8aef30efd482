#!/usr/bin/env bash
# One device call of the RLAIF arms experiment (dev/gpu/rlaif_calls.md), from the checkout's root:
# install what dev/gpu/stage.sh staged (if this machine has not yet), run or resume every
# arm x seed (benchmarks.rlaif_arms) until DEADLINE seconds, then put the results in $OUT:
# rlaif_arms.json (+ .png), arms.tar.xz (every run's metrics, evaluations and logs: `--summarize`
# re-makes the JSON from it anywhere), rollouts.tar.xz (every judged rollout) and judges.tar (the
# judges' adapters).
#   bash dev/gpu/rlaif_arms_call.sh 530 [recipe flags, e.g. --train.steps 80: the same in every call]
set -uo pipefail
deadline=${1:-530}
shift || true
bash dev/gpu/stage_device.sh rlaif || exit 3
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
W=${ARMS_WORK:-/tmp/arms}  # ARMS_WORK, ARMS_FLAGS (e.g. "--rehearse --seeds 0"): a rehearsal elsewhere
nvidia-smi --query-gpu=name,memory.used,utilization.gpu --format=csv,noheader 2>/dev/null
mkdir -p $W && (while sleep 15; do nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used \
  --format=csv,noheader >> $W/gpu_util.log 2>/dev/null || break; done) &
mon=$!
python3 -m benchmarks.rlaif_arms --work $W ${ARMS_FLAGS:-} --deadline_s "$deadline" --judge "--sandbox.workers 8 --sample.batch 32 --eval.batch 32" -- "$@"
kill $mon 2>/dev/null
(cd $W && find . \( -name '*.json' -o -name '*.jsonl' -o -name '*.log' \) -not -path '*/checkpoints/*' \
   -not -path '*/reward_cache/*' -not -path '*/adapters/*' -not -path '*/fused/*' -not -name rollouts.jsonl -print0 \
   | tar cf - --null -T - | xz -T0 -6 > "$OUT/arms.tar.xz")
(cd $W && find . -name rollouts.jsonl -print0 | tar cf - --null -T - | xz -T0 -6 > "$OUT/rollouts.tar.xz")
(cd $W && tar cf "$OUT/judges.tar" judge_s*/adapters 2>/dev/null)
# last, at most 100 s (the judge arms' pass rates are judged in the sandbox here): the archives above
# make the same JSON anywhere (python -m benchmarks.rlaif_arms --work DIR --summarize)
timeout 100 python3 -m benchmarks.rlaif_arms --work $W ${ARMS_FLAGS:-} --summarize --results "$OUT/rlaif_arms.json" 2>&1 | tail -3
ls -la "$OUT"
for f in $W/*.log; do echo "== $f"; tail -n 2 "$f"; done
