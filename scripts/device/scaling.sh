#!/usr/bin/env bash
# Issue 5's scaling benchmark, for a multi-GPU device kind (nvidia-h200-x2 / -x4): the same corpus
# drained by one worker on 1 GPU, then one worker per GPU on N GPUs, through real RabbitMQ and
# Postgres (as scripts/device/e2e.sh sets them up). Prints audio-seconds per second for each and
# the scaling efficiency N-GPU / (N × 1-GPU).
# Env: N (GPUs, default: all), JOBS (4000), OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/scaling-out}; mkdir -p "$OUT"
N=${N:-$(nvidia-smi -L | wc -l)}
LIST=$(seq -s, 0 $((N - 1)))
OUT="$OUT/1gpu" DEVICES=0 SKIP_MODEL_ONLY=1 JOBS=${JOBS:-4000} bash scripts/device/e2e.sh > "$OUT/1gpu.log" 2>&1
OUT="$OUT/${N}gpu" DEVICES=$LIST SKIP_MODEL_ONLY=1 JOBS=${JOBS:-4000} bash scripts/device/e2e.sh > "$OUT/${N}gpu.log" 2>&1
one=$(grep -o '[0-9.]* audio-s/s' "$OUT/1gpu/throughput.txt" | awk '{print $1}')
many=$(grep -o '[0-9.]* audio-s/s' "$OUT/${N}gpu/throughput.txt" | awk '{print $1}')
python3 -c "one=$one; many=$many; n=$N; print(f'1 GPU: {one:.1f} audio-s/s; {n} GPUs: {many:.1f} audio-s/s; efficiency {many/(n*one)*100:.1f}%')" | tee "$OUT/scaling.txt"
