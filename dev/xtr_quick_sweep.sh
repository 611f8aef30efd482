#!/usr/bin/env bash
# Sweep of the retriever's quick preset over variants x seeds (in-batch negatives): each variant is
# one `benchmarks/xtr_heldout_packages.py` call with extra recipe flags, in runs/sw/<name>
# (resumable); then one row per run -> ${OUT:-dev/results/$MACHINE}/xtr_quick_sweep.json.
#
#   MACHINE=h100 bash dev/xtr_quick_sweep.sh BUDGET_S "name|seeds|recipe flags" ...
#   e.g. bash dev/xtr_quick_sweep.sh 550 "base|0,1,2|" "t03|0,1,2|--loss.temperature 0.03"
#
# dev/results/h100/xtr_quick_sweep.json was written by this script on the lent H100 in
# two calls (550 s each; PYPI_TARBALL=.gpu/x/pypi_sources.tar.xz), under its first output name
# sweep_rows.json; its `command` fields are relative to the preset of then: LoRA q/v,
# temperature 0.05 (today's quick = "lint03": --lora.targets query,key,value,dense
# --loss.temperature 0.03).
MACHINE=${MACHINE:-cpu}
END=$(( $(date +%s) + $1 )); shift
mkdir -p runs/sw
for spec in "$@"; do
  name=${spec%%|*}; rest=${spec#*|}; seeds=${rest%%|*}; flags=${rest#*|}
  left=$(( END - $(date +%s) ))
  [ $left -lt 45 ] && break
  echo "== $name seeds $seeds flags [$flags] left $left s"
  # shellcheck disable=SC2086  # flags are words
  python3 benchmarks/xtr_heldout_packages.py --machine "$MACHINE" --variants inbatch --seeds "$seeds" \
    --runs "runs/sw/$name" --results "runs/sw/$name.json" ${PYPI_TARBALL:+--pypi_tarball "$PYPI_TARBALL"} \
    --budget_s $left --min_start_s 40 -- $flags 2>&1 | grep -E "^(quick|all|stopped)|Error|error" | cut -c1-300
done
OUT_DIR=${OUT:-dev/results/$MACHINE} python3 - <<'PY'
import glob
import json
import os

rows = []
for f in sorted(glob.glob("runs/sw/*.json")):
    name = os.path.basename(f)[:-5]
    for r in json.load(open(f)):
        p, h = r, r["heldout_files"]
        rows.append({"name": name, "seed": r["seed"], "train_s": round(r["train_s"], 1), "wall_s": r["wall_s"],
                     "pk_untrained": round(p["untrained"]["semantic"]["mrr@10"], 4),
                     "pk_sem": round(p["fine_tuned"]["semantic"]["mrr@10"], 4),
                     "pk_hyb": round(p["fine_tuned"]["hybrid"]["mrr@10"], 4),
                     "f_untrained": round(h["untrained"]["semantic"]["mrr@10"], 4),
                     "f_sem": round(h["fine_tuned"]["semantic"]["mrr@10"], 4),
                     "f_hyb": round(h["fine_tuned"]["hybrid"]["mrr@10"], 4), "command": r["command"]})
out = os.path.join(os.environ["OUT_DIR"], "xtr_quick_sweep.json")
json.dump(rows, open(out, "w"), indent=1)
for r in rows:
    print(f"{r['name']:12s} s{r['seed']} pk {r['pk_untrained']:.4f}->{r['pk_sem']:.4f} "
          f"({r['pk_sem'] - r['pk_untrained']:+.4f}) hyb {r['pk_hyb']:.4f} | files {r['f_untrained']:.4f}->"
          f"{r['f_sem']:.4f} ({r['f_sem'] - r['f_untrained']:+.4f}) hyb {r['f_hyb']:.4f} train {r['train_s']}s")
PY
