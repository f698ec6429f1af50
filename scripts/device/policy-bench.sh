#!/usr/bin/env bash
# Issue 3's GPU run, for the device tool's GPU machine (no cargo, no network there): export the
# reference model, calibrate it, and run `voxbatch bench policy`. Build here first and carry the
# stripped binary in .device/ (see docs/PERFORMANCE.md for the exact commands).
#
# Env: SIZE (large), DEVICE (cuda:0), PRECISION (bf16), JOBS (400), OUT (where results go).
# Locally (CPU smoke test): SIZE=tiny DEVICE=cpu JOBS=20 OUT=/tmp/x scripts/device/policy-bench.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
SIZE=${SIZE:-large}
DEVICE=${DEVICE:-cuda:0}
PRECISION=${PRECISION:-bf16}
JOBS=${JOBS:-400}
OUT=${OUT:-/tmp/voxbatch-out}
BIN=${BIN:-.device/voxbatch}
PY=${PY:-python3}
mkdir -p "$OUT"
source scripts/device/common.sh
export RUST_LOG=${RUST_LOG:-info}
# SKIP_CAL=1 uses the profiles committed under calibration/ instead of calibrating again.
if [ "${SKIP_CAL:-0}" = 1 ]; then
  export VOXBATCH_MEMORY__CALIBRATION_DIR="$PWD/calibration"
else
  export VOXBATCH_MEMORY__CALIBRATION_DIR="$OUT/calibration"
fi
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1 || echo "no nvidia-smi"
  $PY -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available())'
} > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
echo "== calibrate"
[ "${SKIP_CAL:-0}" = 1 ] || $BIN calibrate --model "$MODEL" --device "$DEVICE" --precision "$PRECISION" --no-db ${CAL_ARGS:-} 2>&1 | tee "$OUT/calibrate.log"
echo "== bench policy"
$BIN bench policy --model "$MODEL" --device "$DEVICE" --precision "$PRECISION" --jobs "$JOBS" --max-batch ${MAX_BATCH:-1024} --out "$OUT/bench" 2>&1 | tee "$OUT/bench-policy.log"
