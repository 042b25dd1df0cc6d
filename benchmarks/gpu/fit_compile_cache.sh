#!/usr/bin/env bash
# The two compiled families' ladder, each shape recorded by hand twice in its own inductor cache: first with
# the cache cold (torch.compile autotunes: its benchmark allocations are in the first step), then again in the
# same, now warm cache (no autotuning), as a job's first run at a shape and its restart. Six at a time.
# Writes OUT/compile_cache.tgz (hand/FAM-bB-sS-{cold,warm}.pickle.gz, results/*.json) and OUT/compile_cache.txt.
#   bash benchmarks/gpu/fit_compile_cache.sh OUT [judge|judge2]
# `judge`: three eager families compiled whole (FITFAM_COMPILE=1: bert_mlm, t5_relpos, alibi_lm), a set that
# judges FIT_MARGIN_COMPILE once (written before its capture); OUT/compile_judge.tgz and compile_judge.txt.
# `judge2`: moe_lm, seq2seq and lora_gpt compiled whole, a second such set; OUT/compile_judge2.tgz.
# `judge3`: relbias_enc_bf16, whisper_enc and gpt_ckpt_bf16 compiled whole, a third, written after the first
# compile's kept blocks were freed and FIT_MARGIN_COMPILE went back to 5%, before its own capture.
set -uo pipefail
out=${1:?usage: fit_compile_cache.sh OUT [judge|judge2|judge3]}
set_name=${2:-}
export PYTHONUNBUFFERED=1
here="$(cd "$(dirname "$0")" && pwd)"
work=/tmp/compile_cache
mkdir -p "$work/hand" "$work/results"
pair() {  # script family batch size: cold, then warm, in one cache
  local tag="$2-b$3-s$4"
  for state in cold warm; do
    TORCHINDUCTOR_CACHE_DIR="$work/cache-$tag" timeout 280 python3 "$here/$1" job "$2" --batch "$3" --size "$4" \
      --record hand --hand-out "$work/hand/$tag-$state.pickle.gz" --result "$work/results/$tag-$state.json" \
      > "$work/results/$tag-$state.log" 2>&1
  done
}
specs=("fit_fresh.py gqa_lm 8 256" "fit_families.py gpt_compile 8 256")
name=compile_cache
case "$set_name" in
  judge) specs=("fit_families.py bert_mlm 16 128" "fit_fresh.py t5_relpos 8 128" "fit_fresh.py alibi_lm 8 256") ;;
  # a second judging set, written after the first was judged and before its own capture
  judge2) specs=("fit_families.py moe_lm 8 256" "fit_families.py seq2seq 16 128" "fit_families.py lora_gpt 4 256") ;;
  # a third, written after the second was judged and read, before its own capture
  judge3) specs=("fit_fresh.py relbias_enc_bf16 8 256" "fit_fresh.py whisper_enc 16 800"
                 "fit_fresh.py gpt_ckpt_bf16 8 256") ;;
  "") ;;
  *) echo "unknown set: $set_name (judge, judge2 or judge3)" >&2; exit 2 ;;
esac
if [ -n "$set_name" ]; then  # the judging sets: eager families compiled whole
  export FITFAM_COMPILE=1
  name=compile_$set_name
  work=/tmp/$name
  mkdir -p "$work/hand" "$work/results"
fi
for spec in "${specs[@]}"; do
  set -- $spec
  for bs in "$3 $4" "$(($3 * 2)) $4" "$(($3 * 4)) $4" "$(($3 * 8)) $4" "$3 $(($4 * 2))" "$3 $(($4 * 4))"; do
    pair "$1" "$2" $bs &
    while [ "$(jobs -rp | wc -l)" -ge 6 ]; do wait -n; done
  done
done
wait
for f in "$work"/results/*.json; do
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[1].rsplit('/',1)[1][:-5], r['outcome'], r['max_reserved'], r['max_allocated'])" "$f"
done | sort | tee "$out/$name.txt"
tar czf "$out/$name.tgz" -C "$work" hand results
ls -la "$out"
