# calibrate: issue 16's memory calibration of the compiled token2wav — the full-size random model's
# default packages (the token2wav target's compile stage, a process per stage, into
# COMPILED_DIR, unless it already holds packages on a warm machine), then `voxbatch calibrate` of that
# directory with each BENCHMARK_MODES value — as the worker runs it by default (profile
# `bf16+compiled`) and with `[model] cudnn_benchmark = true` (`bf16+compiled+cudnn-benchmark`:
# cuDNN's workspaces raise the peak, 7.3 GiB at batch 256 on an H200, 2026-12-05). The profiles land in
# OUT/calibration; their model is the random `cosyvoice2-full-random`, so they show the fit's
# quality and the peaks, not a profile any user's model loads (a user calibrates their own
# directory the same way: README).
# Carry: .whl .t2w (pack.sh).
# Env: COMPILED_DIR (/tmp/cv2full-compiled: or another compiled directory already on the machine,
# e.g. a variant the token2wav target benched), BENCHMARK_MODES ("false true": the cudnn_benchmark
# values to calibrate with), COMPILE_LIMIT (330 s for the compile stage), CAL_SECONDS (100: each
# sweep's budget), MAX_BATCH_ITEMS (256: the packages take 512 rows and classifier-free guidance
# doubles a batch), MAX_TOKENS (512: the packages take 1,500 mel frames = 750 tokens; longer
# batches would run eager and calibrate the eager port), PY.
# Output: OUT/gpu.txt, calibrate-cudnn-benchmark-<mode>.log, calibration/ (and compile/, when it compiled).
export PY
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
C=${COMPILED_DIR:-/tmp/cv2full-compiled}
if ! ls "$C"/compiled/*/estimator.pt2 > /dev/null 2>&1; then
  log "compiling the default packages (estimator and vocoder body at once: the token2wav target)"
  OUT=$OUT/compile STAGE=compile COMPILED_DIR=$C COMPILE_LIMIT=${COMPILE_LIMIT:-330} bash "$DEVICE_DIR/run.sh" token2wav 2>&1 | tail -6
fi
ls "$C"/compiled/*/ || { log "no packages: nothing to calibrate"; exit 1; }
use_libtorch
unpack_voxbatch
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
