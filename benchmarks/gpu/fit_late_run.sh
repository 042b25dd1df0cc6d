#!/usr/bin/env bash
# One device run after a change to the agent's first-forward reading (agent/scores.py): the late fit set
# (fit_fresh.py --set late: every part, ladders and capped bisection) and, beside it, the agent's
# recording of each fresh family again (tests/fixtures/fit_fresh's spools were made by the agent before it).
# Writes OUT/fitlate.tgz.part* (the late capture: summary.json results spools hand dumps) and
# OUT/freshagent.tgz (spools/FAM/defaults and results/FAM.json per fresh family), with the logs.
#   bash benchmarks/gpu/fit_late_run.sh OUT
set -uo pipefail
out=${1:?usage: fit_late_run.sh OUT}
export PYTHONUNBUFFERED=1
ff="$(cd "$(dirname "$0")" && pwd)/fit_fresh.py"
mkdir -p /tmp/fitlate /tmp/freshagent/results
python3 "$ff" all --set late --out /tmp/fitlate --budget "${LATE_BUDGET:-400}" --parallel 8 > /tmp/fitlate_log.txt 2>&1 &
late=$!
for spec in "effnet_se 32 128" "swin_bf16 16 224" "vit_ckpt_bf16 32 224" "t5_relpos 8 128" \
            "gqa_lm 8 256" "gnn_rec 4 1024" "whisper_enc 16 800"; do
  set -- $spec
  timeout 240 python3 "$ff" job "$1" --batch "$2" --size "$3" --record defaults \
    --spool "/tmp/freshagent/spools/$1/defaults" --result "/tmp/freshagent/results/$1.json" \
    > "/tmp/freshagent/results/$1.log" 2>&1 &
  while [ "$(jobs -rp | wc -l)" -ge 5 ]; do wait -n; done  # the late capture is one of them
done
while [ "$(jobs -rp | wc -l)" -gt 1 ]; do wait -n; done
tar czf "$out/freshagent.tgz" -C /tmp/freshagent spools results  # back even if the late capture runs out of time
wait $late
tail -5 /tmp/fitlate_log.txt
tar czf /tmp/fitlate.tgz -C /tmp/fitlate summary.json results spools hand dumps
split -b 15m -d /tmp/fitlate.tgz "$out/fitlate.tgz.part"
gzip -c /tmp/fitlate_log.txt > "$out/fitlate_log.txt.gz"
ls -la "$out"
