# headline: issue 16's headline in one call on a fresh GPU machine — the token2wav target (the
# default packages and VARIANTS beside them, benched with the eager port at 128, the sweet spot
# SWEET and the reference token2wav, as docs/PERFORMANCE.md's tables need them), then the calibrate
# target on the default directory as the worker runs it (cudnn_benchmark off). Each part stops at
# its own limit so the call returns its logs inside the device tool's 600 s: on an H200 the
# compiles took 187 s (2026-12-05), the benches and reference ≈ 2.5 minutes, the calibration 60 s
# plus loading.
# Carry: .whl .t2w (pack.sh).
# Env: VARIANTS (default "strided:LAYOUT=time-major-strided": the layout before the window copy,
# beside the default), SWEET (256), COMPILE_LIMIT (280), BENCH_LIMIT (seconds for the whole
# token2wav part, 470), CAL_SECONDS (45), and the token2wav target's, PY.
# Output: OUT/gpu.txt, the token2wav target's files, OUT/calibrate/ (the calibrate target's; the
# profile, if the fit is accepted: OUT/calibrate/calibration/*.json).
export OUT PY
SECONDS=0
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
STAGE=all COMPILE_LIMIT=${COMPILE_LIMIT:-280} EAGER=1 SWEET=${SWEET:-256} REFERENCE=1 \
  VARIANTS=${VARIANTS-strided:LAYOUT=time-major-strided} \
  timeout -k 10 "${BENCH_LIMIT:-470}" bash "$DEVICE_DIR/run.sh" token2wav 2>&1 | grep -v "^Looking" | cut -c1-250
log "token2wav done after $SECONDS s"
left=$((585 - SECONDS))
if [ "$left" -gt 60 ]; then
  OUT=$OUT/calibrate BENCHMARK_MODES=false CAL_SECONDS=$(( left - 25 < ${CAL_SECONDS:-45} ? left - 25 : ${CAL_SECONDS:-45} )) \
    timeout -k 5 "$((left - 5))" bash "$DEVICE_DIR/run.sh" calibrate 2>&1 | grep -v "^frame" | tail -16
else
  log "no time left for the calibration ($left s)"
fi
log "done after $SECONDS s"
