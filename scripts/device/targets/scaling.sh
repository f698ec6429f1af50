# scaling: issue 5's scaling measurement, for a device kind of several GPUs (nvidia-h200-x2 / -x4):
# the same corpus drained by one worker on 1 GPU, then one worker per GPU on N GPUs, each through
# the e2e target (real RabbitMQ and Postgres); prints audio-seconds per second for each and the
# scaling efficiency N-GPU / (N × 1-GPU). Not yet run (no such kind was lent).
# Each worker prefetches up to 3 batches of short jobs (3072 on an H200): on a corpus of a few
# thousand jobs the first consumer takes nearly all of it and the others idle (seen with two workers
# on one GPU, docs/PERFORMANCE.md). The run therefore bounds the prefetch and uses a larger corpus,
# so that every worker has work until the end.
# Carry: .t2w/voxbatch.xz .e2e/services.tar.xz (pack.sh binaries services).
# Env: N (GPUs, default: all), JOBS (12000: ~135 s on one H200), PREFETCH (300), WORK_TIMEOUT (400), PY.
# Output: OUT/1gpu.log, OUT/<N>gpu.log, OUT/1gpu/ and OUT/<N>gpu/ (the e2e target's), OUT/scaling.txt.
N=${N:-$(nvidia-smi -L | wc -l)}
LIST=$(seq -s, 0 $((N - 1)))
export VOXBATCH_AMQP__PREFETCH=${PREFETCH:-300}
OUT="$OUT/1gpu" DEVICES=0 SKIP_MODEL_ONLY=1 JOBS=${JOBS:-12000} WORK_TIMEOUT=${WORK_TIMEOUT:-400} bash "$DEVICE_DIR/run.sh" e2e > "$OUT/1gpu.log" 2>&1
OUT="$OUT/${N}gpu" DEVICES=$LIST SKIP_MODEL_ONLY=1 JOBS=${JOBS:-12000} WORK_TIMEOUT=${WORK_TIMEOUT:-400} bash "$DEVICE_DIR/run.sh" e2e > "$OUT/${N}gpu.log" 2>&1
one=$(grep -o '[0-9.]* audio-s/s' "$OUT/1gpu/throughput.txt" | awk '{print $1}')
many=$(grep -o '[0-9.]* audio-s/s' "$OUT/${N}gpu/throughput.txt" | awk '{print $1}')
$PY -c "one=$one; many=$many; n=$N; print(f'1 GPU: {one:.1f} audio-s/s; {n} GPUs: {many:.1f} audio-s/s; efficiency {many/(n*one)*100:.1f}%')" | tee "$OUT/scaling.txt"
