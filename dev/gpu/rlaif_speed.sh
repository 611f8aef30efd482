#!/usr/bin/env bash
# RLAIF speed on a lent GPU, one device call (<= 9 minutes): the update step against
# torch.compile with the agreement check (0.5B, then the 3B shape), the 0.5B step split into
# phases, the decode benchmark's engine figure and `--preset gpu`'s tokens/s in the same call,
# and a cold start with an empty kernel cache. Each phase has its own time limit and writes
# its JSON under $OUT at once, so a phase cut off still leaves the others.
#
#   device: bash dev/gpu/gpu_device.sh && bash dev/gpu/rlaif_speed.sh     (after the staging:
#           MLX, SmolLM2, bubblewrap; peft among the staged wheels; optional .gpu/k/kernels-*.tar.gz)
#   here:   SMALL=1 PY=.venv/bin/python OUT=/tmp/rs bash dev/gpu/rlaif_speed.sh   (tiny shapes on the CPU)
#   ONLY="recipe_gpu cold_start" runs only those phases; BUDGET=540 (s) bounds the whole script;
#   LIMITS="250 100 90 130 150 90" sets the phase limits (step, generation, recipe, cold, 3B, profile).
#
# $OUT gets (<= 8 files): rlaif_step.json, rlaif_step_3b.json, generation.json,
# rlaif_recipe_speed.json, cold_start_rlaif.json, log.txt. Copy the JSON to
# benchmarks/results/<machine>/ (merge rlaif_step_3b.json into rlaif_step.json with
# `python -m benchmarks.rlaif_step --merge ... --out ...`).
set -uo pipefail
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/rlaif_speed}
PY=${PY:-python3}
M=${MACHINE:-h200}
mkdir -p "$OUT"
LOG=$OUT/log.txt
T0=$(date +%s)
say() { echo "[$(date -u +%H:%M:%S) +$(( $(date +%s) - T0 ))s] $*" | tee -a "$LOG"; }
BUDGET=${BUDGET:-540}  # seconds for the whole script: no phase runs past it
phase() {  # phase NAME LIMIT_S CMD...: run CMD under a time limit, its output appended to the log
  local name=$1 limit=$2; shift 2
  local left=$(( T0 + BUDGET - $(date +%s) ))
  [ "$limit" -gt "$left" ] && limit=$left
  if [ "$limit" -lt 20 ]; then say "skip $name: ${left}s of the budget left"; return; fi
  case " ${ONLY:-$name} " in *" $name "*) ;; *) say "skip $name (ONLY=$ONLY)"; return;; esac
  say "start $name (limit ${limit}s): $*"
  timeout "$limit" "$@" >> "$LOG" 2>&1
  say "end $name: rc=$?"
}
if [ -n "${SMALL:-}" ]; then  # the CPU rehearsal: every command at tiny shapes
  M=cpu
  STEP=(--shape llama-tiny --rows 4 --micro 2 --prompt-len 8 --completion-len 8 --dtype float32 --chunk 8
        --steps 1 --warmup 0 --check-steps 1)
  STEP3=("${STEP[@]}")
  GEN=(--shapes llama-tiny --new-tokens 8 --prompt-len 8 --dtype float32 --repeats 1 --torch-repeats 0)
  RECIPE=(--preset smoke --train.steps 3)
  LIMIT=(900 300 300 300 600 900)  # step, generation, recipe, cold start, step 3B, profile
  PROFILE=()
  BUDGET=3600
else
  STEP=(--shape qwen2.5-0.5b --completion-len 256)
  STEP3=(--shape qwen2.5-coder-3b --completion-len 384 --steps 3 --warmup 1)
  GEN=(--shapes smollm2-135m --new-tokens 256 --repeats 2 --torch-repeats 0 --engines static --bandwidth 4.8e12)
  RECIPE=(--preset gpu --train.steps 12)
  LIMIT=(220 100 90 130 150 90)
  PROFILE=(--steps 2 --warmup 1 --check-steps 1)
fi
# PEFT for the PyTorch rows: from a carried wheel when the image lacks it (pure Python)
PEFT=$("$PY" -c 'import peft; print(peft.__version__)' 2>/dev/null)
if [ -z "$PEFT" ]; then
  for w in .gpu/*/peft-*.whl .gpu/*/wheels/peft-*.whl; do
    [ -f "$w" ] && "$PY" -m pip install -q --no-index --no-deps --target /tmp/site48 "$w" \
      && export PYTHONPATH=$PYTHONPATH:/tmp/site48 && PEFT="installed from $w" && break
  done
fi
[ -n "${LIMITS:-}" ] && read -r -a LIMIT <<< "$LIMITS"  # LIMITS="step gen recipe cold 3b profile" (s)
say "peft: ${PEFT:-missing: the PyTorch rows will fail}"
say "rlaif_speed on $M: $("$PY" -c 'import mlx.core as mx; print(mx.__version__, mx.default_device())' 2>&1)"
# warm kernels: the archive when carried (cold start below uses its own empty folder)
for k in .gpu/k/kernels-*.tar.gz; do
  [ -f "$k" ] && phase kernels_import 60 "$PY" -m mlxio.gpu.kernel_cache_cli import "$k"
done

# 1. update step, 0.5B: MLX vs torch.compile with logits_to_keep (TRL's way; FULL_LOGITS=1 adds
#    the full-logits peer), agreement-checked, then each row's step split into phases
phase step_0.5b "${LIMIT[0]}" "$PY" -m benchmarks.rlaif_step --machine "$M" "${STEP[@]}" \
  --frameworks mlx torch_compile_keep ${FULL_LOGITS:+torch_compile} --out "$OUT/rlaif_step.json"
# 2. the decode benchmark's engine figure, then --preset gpu in the same call, against it
phase generation "${LIMIT[1]}" "$PY" -m benchmarks.generation --machine "$M" "${GEN[@]}" --out "$OUT/generation.json"
ENGINE=$("$PY" -c "import json,sys; r=json.load(open(sys.argv[1]))['runs']; print(r[-1]['static_median'])" \
  "$OUT/generation.json" 2>/dev/null || echo "")
phase recipe_gpu "${LIMIT[2]}" "$PY" -m benchmarks.rlaif_recipe_speed --machine "$M" --label after48 \
  ${ENGINE:+--engine-tokens-per-s "$ENGINE"} --out "$OUT/rlaif_recipe_speed.json" -- "${RECIPE[@]}" \
  --out_dir /tmp/rlaif_speed_run
# the 0.5B step split into phases (forward / backward / optimizer, each row), after the
# ratio is on record; fewer timed steps (its kernels are compiled by now)
phase profile_0.5b "${LIMIT[5]}" "$PY" -m benchmarks.rlaif_step --machine "$M" "${STEP[@]}" "${PROFILE[@]}" \
  --frameworks mlx torch_compile_keep --profile --out "$OUT/rlaif_step_profile.json"
# 3. cold start: the same preset with an empty kernel cache (its own folder), to the third step
COLD=$(mktemp -d)
MLX_PTX_CACHE_DIR=$COLD/ptx MLXIO_KERNEL_PREWARM=1 phase cold_start "${LIMIT[3]}" \
  "$PY" -m benchmarks.rlaif_recipe_speed --machine "$M" --label cold48 --out "$OUT/cold_start_rlaif.json" \
  -- "${RECIPE[@]}" --train.steps 3 --out_dir /tmp/rlaif_speed_cold
rm -rf "$COLD"
# 4. if the budget allows: the same preset with the rewards checked after generation
#    (--sandbox.overlap false), to see what the overlap costs or saves the decode loop
phase recipe_sequential "${LIMIT[2]}" "$PY" -m benchmarks.rlaif_recipe_speed --machine "$M" --label sequential48 \
  ${ENGINE:+--engine-tokens-per-s "$ENGINE"} --out "$OUT/rlaif_recipe_speed.json" -- "${RECIPE[@]}" \
  --sandbox.overlap false --out_dir /tmp/rlaif_speed_seq
# 5. the 3B shape, last (the least needed): MLX vs torch.compile with logits_to_keep
phase step_3b "${LIMIT[4]}" "$PY" -m benchmarks.rlaif_step --machine "$M" "${STEP3[@]}" \
  --frameworks mlx torch_compile_keep --out "$OUT/rlaif_step_3b.json"
say "done in $(( $(date +%s) - T0 )) s; files: $(ls "$OUT" | tr '\n' ' ')"
