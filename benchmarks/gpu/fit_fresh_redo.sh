#!/usr/bin/env bash
# Runs again, on the GPU machine, the parts of a fit_fresh.py capture that a capture-script bug lost:
# the step-1 dumps (their job was not given every argument) and t5_relpos's length ladder (its bias
# table overflowed past 128). Writes OUT/results/TAG.json (with TAG.log, the job's output) and
# OUT/dumps/FAM-dump.{forward,backward}.pickle.gz as `fit_fresh.py all` does, and each job's exit status in
# OUT/redo_log.txt; `fit_fresh_import.py CAPTURE --merge OUT` folds them into a capture.
#   bash benchmarks/gpu/fit_fresh_redo.sh OUT
set -uo pipefail
out=${1:?usage: fit_fresh_redo.sh OUT}
mkdir -p "$out/results" "$out/dumps"
ff="$(cd "$(dirname "$0")" && pwd)/fit_fresh.py"
run() {  # tag, job arguments...
  local tag=$1; shift
  timeout 240 python3 "$ff" job "$@" --result "$out/results/$tag.json" > "$out/results/$tag.log" 2>&1
  echo "[$tag] rc=$?" | tee -a "$out/redo_log.txt"
}
for spec in "effnet_se 32 128" "swin_bf16 16 224" "vit_ckpt_bf16 32 224" "t5_relpos 8 128" \
            "gqa_lm 8 256" "gnn_rec 4 1024" "whisper_enc 16 800"; do
  set -- $spec
  run "$1-b$2-s$3-dump" "$1" --batch "$2" --size "$3" --record dump --dump-out "$out/dumps/$1-dump" &
  while [ "$(jobs -rp | wc -l)" -ge 4 ]; do wait -n; done
done
for s in 256 512; do
  run "t5_relpos-b8-s$s" t5_relpos --batch 8 --size "$s" &
done
wait
