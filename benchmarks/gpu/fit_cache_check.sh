#!/usr/bin/env bash
# Does recording change a compiled run's peak, and does the inductor cache? gqa_lm at 4x its base batch:
# (a) recorded by hand with its own cold cache, (b) unrecorded with its own cold cache, (c) recorded in a cache
# the same shape warmed first, (d) unrecorded in a cache warmed by another shape of as many tokens (8 x 1024).
# On one H100: a = b (5,133,828,096 bytes reserved), c = d within 0.1% and 19.6% above. Writes
# OUT/cachetest.txt and the two recordings.
#   bash benchmarks/gpu/fit_cache_check.sh OUT
set -uo pipefail
out=${1:?usage: fit_cache_check.sh OUT}; here="$(cd "$(dirname "$0")" && pwd)"; w=/tmp/ct; mkdir -p $w
export PYTHONUNBUFFERED=1
# (a) recorded by hand, its own cold cache
TORCHINDUCTOR_CACHE_DIR=$w/cache-a python3 $here/fit_fresh.py job gqa_lm --batch 32 --size 256 --record hand --hand-out $w/a.pickle.gz --result $w/a.json > $w/a.log 2>&1 &
# (b) unrecorded, its own cold cache
TORCHINDUCTOR_CACHE_DIR=$w/cache-b python3 $here/fit_fresh.py job gqa_lm --batch 32 --size 256 --result $w/b.json > $w/b.log 2>&1 &
# (c) a cache warmed by the same shape first, then the shape again (recorded by hand)
( TORCHINDUCTOR_CACHE_DIR=$w/cache-c python3 $here/fit_fresh.py job gqa_lm --batch 32 --size 256 --result $w/c0.json > $w/c0.log 2>&1;
  TORCHINDUCTOR_CACHE_DIR=$w/cache-c python3 $here/fit_fresh.py job gqa_lm --batch 32 --size 256 --record hand --hand-out $w/c.pickle.gz --result $w/c.json > $w/c.log 2>&1 ) &
# (d) a cache warmed by 8 x 1024 first, then 32 x 256 (unrecorded)
( TORCHINDUCTOR_CACHE_DIR=$w/cache-d python3 $here/fit_fresh.py job gqa_lm --batch 8 --size 1024 --result $w/d0.json > $w/d0.log 2>&1;
  TORCHINDUCTOR_CACHE_DIR=$w/cache-d python3 $here/fit_fresh.py job gqa_lm --batch 32 --size 256 --result $w/d.json > $w/d.log 2>&1 ) &
wait
for f in a b c0 c d0 d; do python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[2], r['outcome'], r['max_reserved'], r['max_allocated'])" $w/$f.json $f; done | tee $out/cachetest.txt
cp $w/a.pickle.gz $w/c.pickle.gz $out/ 2>/dev/null; ls -la $out
