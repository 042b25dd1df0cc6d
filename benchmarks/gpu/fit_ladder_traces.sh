#!/usr/bin/env bash
# Hand recordings (torch's defaults, stacks="all") of every rung of the ladder of the families whose
# peak reserved `memq fit` missed by more than 5% (benchmarks/RESULTS.md, "memq fit"): the base shape and
# 2x, 4x, 8x the batch (2x, 4x the length of the sequence families), each its own process, so that the
# scaled replay of the base recording can be read against the real program of each larger shape.
# Writes OUT/ladder.tgz (hand/FAM-bB-sS.pickle.gz, results/FAM-bB-sS.json) and OUT/ladder_log.txt.
#   bash benchmarks/gpu/fit_ladder_traces.sh OUT [PARALLEL]
set -uo pipefail
out=${1:?usage: fit_ladder_traces.sh OUT [PARALLEL]}
par=${2:-6}
export PYTHONUNBUFFERED=1
here="$(cd "$(dirname "$0")" && pwd)"
work=/tmp/ladder
mkdir -p "$work/hand" "$work/results"
# script family base-batch base-size seq(1/0)
specs=("fit_families.py lstm_lm 16 128 1" "fit_families.py vit_ckpt 16 224 0" "fit_families.py vit_bf16 8 224 0"
       "fit_families.py gpt_compile 8 256 1" "fit_fresh.py vit_ckpt_bf16 32 224 0" "fit_fresh.py gqa_lm 8 256 1")
jobs_list=()
for spec in "${specs[@]}"; do
  set -- $spec
  for k in 1 2 4 8; do jobs_list+=("$1 $2 $(($3 * k)) $4"); done
  if [ "$5" = 1 ]; then for k in 2 4; do jobs_list+=("$1 $2 $3 $(($4 * k))"); done; fi
done
for j in "${jobs_list[@]}"; do
  set -- $j
  tag="$2-b$3-s$4"
  timeout 300 python3 "$here/$1" job "$2" --batch "$3" --size "$4" --record hand \
    --hand-out "$work/hand/$tag.pickle.gz" --result "$work/results/$tag.json" > "$work/results/$tag.log" 2>&1 &
  while [ "$(jobs -rp | wc -l)" -ge "$par" ]; do wait -n; done
done
wait
for f in "$work"/results/*.json; do
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[1].rsplit('/',1)[1], r['outcome'], r['max_allocated'], r['max_reserved'], r.get('hand_entries'), r['device'])" "$f"
done | tee "$out/ladder_log.txt"
tar czf "$out/ladder.tgz" -C "$work" hand results
ls -la "$out"
