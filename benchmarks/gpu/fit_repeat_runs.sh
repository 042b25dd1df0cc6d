#!/usr/bin/env bash
# The same shape run again and again, each in its own process on one GPU: is a family's real peak reserved
# one number at a shape? (benchmarks/RESULTS.md, "What the libraries choose per shape".) The 4x rung of the
# two compiled families (where the H100 and the H200 differed by 17-19%) and an eager ViT's 8x, REPEATS
# times each, three at a time. Writes OUT/repeats.txt (one line per run: rung, run, peak reserved, allocated).
#   bash benchmarks/gpu/fit_repeat_runs.sh OUT [REPEATS]
set -uo pipefail
out=${1:?usage: fit_repeat_runs.sh OUT [REPEATS]}
n=${2:-4}
export PYTHONUNBUFFERED=1
here="$(cd "$(dirname "$0")" && pwd)"
work=/tmp/repeats
mkdir -p "$work"
for spec in "fit_fresh.py gqa_lm 32 256" "fit_families.py gpt_compile 32 256" "fit_fresh.py vit_ckpt_bf16 256 224"; do
  set -- $spec
  for r in $(seq 1 "$n"); do
    tag="$2-b$3-s$4-run$r"
    # each run its own inductor cache: a cached autotuning result would make the runs one
    TORCHINDUCTOR_CACHE_DIR="$work/cache-$tag" timeout 300 python3 "$here/$1" job "$2" --batch "$3" --size "$4" \
      --result "$work/$tag.json" > "$work/$tag.log" 2>&1 &
    while [ "$(jobs -rp | wc -l)" -ge 3 ]; do wait -n; done
  done
done
wait
for f in "$work"/*.json; do
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[1].rsplit('/',1)[1][:-5], r['outcome'], r['max_reserved'], r['max_allocated'], r['device'])" "$f"
done | sort | tee "$out/repeats.txt"
