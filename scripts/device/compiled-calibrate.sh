#!/usr/bin/env bash
# Issue 16's memory calibration of the compiled token2wav, on the GPU machine: the `full` random
# model's default packages (compiled-variants.sh's compile stage, two processes, into
# /tmp/cv2full-compiled, unless COMPILED_DIR already holds packages on a warm machine), then `voxbatch calibrate` of that
# directory twice — as the worker runs it by default (profile `bf16+compiled`) and with
# `[model] cudnn_benchmark = true` (`bf16+compiled+cudnn-benchmark`: cuDNN's workspaces raise the peak, 7.3 GiB at batch 256 in
# session 19). The profiles land in OUT/calibration; their model is the random
# `cosyvoice2-full-random`, so they show the fit's quality and the peaks, not a profile any user's
# model loads (a user calibrates their own directory the same way: README).
# Carry: .whl .t2w (pack-gpu.sh). Env: OUT, PY, COMPILED_DIR (/tmp/cv2full-compiled: another
# compiled directory already on the machine, e.g. a variant compiled-variants.sh benched),
# BENCHMARK_MODES ("false true": the cudnn_benchmark values to calibrate with), COMPILE_LIMIT (330 s for the compile stage),
# CAL_SECONDS (100: each sweep's budget), MAX_BATCH_ITEMS (256: the packages take 512 rows and
# classifier-free guidance doubles a batch), MAX_TOKENS (512: the packages take 1,500 mel frames =
# 750 tokens; longer batches would run eager and calibrate the eager port).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/calibrate-out}; mkdir -p "$OUT"
PY=${PY:-python3}; export PY
log() { echo "[calibrate $(date -u +%T)] $*"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
C=${COMPILED_DIR:-/tmp/cv2full-compiled}
if ! ls "$C"/compiled/*/estimator.pt2 > /dev/null 2>&1; then
  log "compiling the default packages (estimator and vocoder body at once: compiled-variants.sh)"
  OUT=$OUT/compile STAGE=compile COMPILE_LIMIT=${COMPILE_LIMIT:-330} bash scripts/device/compiled-variants.sh 2>&1 | tail -6
fi
ls "$C"/compiled/*/ || { log "no packages: nothing to calibrate"; exit 1; }
source scripts/device/libtorch.sh
source scripts/device/voxbatch-binary.sh
export VOXBATCH_MEMORY__CALIBRATION_DIR=$OUT/calibration RUST_LOG=voxbatch=info
for benchmark in ${BENCHMARK_MODES:-false true}; do
  log "calibrate $C (cudnn_benchmark = $benchmark)"
  VOXBATCH_MODEL__CUDNN_BENCHMARK=$benchmark $BIN calibrate --model "$C" --device cuda:0 --precision bf16 --no-db \
    --max-batch "${MAX_BATCH_ITEMS:-256}" --max-tokens "${MAX_TOKENS:-512}" --max-seconds "${CAL_SECONDS:-100}" \
    > "$OUT/calibrate-cudnn-benchmark-$benchmark.log" 2>&1
  log "exit $?"
  grep -v " INFO " "$OUT/calibrate-cudnn-benchmark-$benchmark.log" | tail -14
done
ls -la "$OUT/calibration"
log "done"
