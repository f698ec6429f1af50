#!/usr/bin/env bash
# Issue 16's headline in one call on a fresh GPU machine: the compiled token2wav's default packages
# (and VARIANTS beside them), benched with the eager port at 128, the sweet spot (SWEET, 256) and
# the reference token2wav — compiled-variants.sh, as docs/PERFORMANCE.md's tables need them — then
# the memory calibration of the default directory as the worker runs it (compiled-calibrate.sh,
# cudnn_benchmark off). Each part stops at its own limit so the call returns its logs inside the
# device tool's 600 s: on an H200 the compiles took 187 s (session 19), the benches and reference
# ≈ 2.5 minutes, the calibration 60 s plus loading.
# Env: OUT, PY, VARIANTS (default "strided:LAYOUT=time-major-strided": session 19's layout beside
# the default's window copy), COMPILE_LIMIT (280), BENCH_LIMIT (seconds for the whole variants
# script, 470), CAL_SECONDS (45). Carry: .whl .t2w (pack-gpu.sh).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/headline-out}; mkdir -p "$OUT"; export OUT
PY=${PY:-python3}; export PY
log() { echo "[headline $(date -u +%T)] $*"; }
SECONDS=0
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
STAGE=all COMPILE_LIMIT=${COMPILE_LIMIT:-280} EAGER=1 SWEET=${SWEET:-256} REFERENCE=1 \
  VARIANTS=${VARIANTS-strided:LAYOUT=time-major-strided} \
  timeout -k 10 "${BENCH_LIMIT:-470}" bash scripts/device/compiled-variants.sh 2>&1 | grep -v "^Looking" | cut -c1-250
log "variants done after $SECONDS s"
left=$((585 - SECONDS))
if [ "$left" -gt 60 ]; then
  OUT=$OUT/calibrate BENCHMARK_MODES=false CAL_SECONDS=$(( left - 25 < ${CAL_SECONDS:-45} ? left - 25 : ${CAL_SECONDS:-45} )) \
    timeout -k 5 "$((left - 5))" bash scripts/device/compiled-calibrate.sh 2>&1 | grep -v "^frame" | tail -16
  # (The profile, if the fit is accepted: OUT/calibrate/calibration/*.json.)
else
  log "no time left for the calibration ($left s)"
fi
log "done after $SECONDS s"
