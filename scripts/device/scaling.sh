#!/usr/bin/env bash
# Issue 5's scaling benchmark, for a multi-GPU device kind (nvidia-h200-x2 / -x4): the same corpus
# drained by one worker on 1 GPU, then one worker per GPU on N GPUs, through real RabbitMQ and
# Postgres (as scripts/device/e2e.sh sets them up). Prints audio-seconds per second for each and
# the scaling efficiency N-GPU / (N × 1-GPU).
# Env: N (GPUs, default: all), JOBS (12000: ~135 s on one H200), PREFETCH (300), OUT.
# Each worker prefetches up to 3 batches of short jobs (3072 on an H200): on a corpus of a few
# thousand jobs the first consumer takes nearly all of it and the others idle (seen with two workers
# on one GPU, docs/PERFORMANCE.md). The scaling run therefore bounds the prefetch and uses a larger
# corpus, so that every worker has work until the end.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/scaling-out}; mkdir -p "$OUT"
N=${N:-$(nvidia-smi -L | wc -l)}
LIST=$(seq -s, 0 $((N - 1)))
export VOXBATCH_AMQP__PREFETCH=${PREFETCH:-300}
OUT="$OUT/1gpu" DEVICES=0 SKIP_MODEL_ONLY=1 JOBS=${JOBS:-12000} WORK_TIMEOUT=${WORK_TIMEOUT:-400} bash scripts/device/e2e.sh > "$OUT/1gpu.log" 2>&1
OUT="$OUT/${N}gpu" DEVICES=$LIST SKIP_MODEL_ONLY=1 JOBS=${JOBS:-12000} WORK_TIMEOUT=${WORK_TIMEOUT:-400} bash scripts/device/e2e.sh > "$OUT/${N}gpu.log" 2>&1
one=$(grep -o '[0-9.]* audio-s/s' "$OUT/1gpu/throughput.txt" | awk '{print $1}')
many=$(grep -o '[0-9.]* audio-s/s' "$OUT/${N}gpu/throughput.txt" | awk '{print $1}')
python3 -c "one=$one; many=$many; n=$N; print(f'1 GPU: {one:.1f} audio-s/s; {n} GPUs: {many:.1f} audio-s/s; efficiency {many/(n*one)*100:.1f}%')" | tee "$OUT/scaling.txt"
