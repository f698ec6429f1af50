#!/usr/bin/env bash
# Issue 4's GPU run, for the device tool's GPU machine: the sweet-spot bench of the reference
# model. Carry the stripped binary in .device/ (see docs/PERFORMANCE.md).
# Env: SIZE (large), DEVICE (cuda:0), PRECISIONS (fp32,tf32,fp16,bf16), SOAK (minutes, 2),
#      REPEATS (3), OUT. Locally: SIZE=tiny DEVICE=cpu PRECISIONS=fp32,bf16 SOAK=0.1 OUT=/tmp/x PY=.venv/bin/python
set -uo pipefail
cd "$(dirname "$0")/../.."
SIZE=${SIZE:-large}
DEVICE=${DEVICE:-cuda:0}
OUT=${OUT:-/tmp/voxbatch-out}
BIN=${BIN:-.device/voxbatch}
PY=${PY:-python3}
mkdir -p "$OUT"
source scripts/device/common.sh
export RUST_LOG=${RUST_LOG:-warn}
$BIN bench --model "$MODEL" --device "$DEVICE" --precisions "${PRECISIONS:-fp32,tf32,fp16,bf16}" \
  --utterance-seconds "${UTTERANCE:-10}" --soak-minutes "${SOAK:-2}" --repeats "${REPEATS:-3}" \
  --max-batch "${MAX_BATCH:-1024}" --out "$OUT/bench" 2>&1 | tee "$OUT/sweetspot.log"
