# e2e: issue 4's end-to-end run of the reference model (tools/export_reference_model.py, a CNN
# TTS-shaped network with random weights, exported there with the machine's torch at SIZE): the
# services (lib/services.sh) started, a corpus (`voxbatch bench corpus`) enqueued and drained by a
# worker on the GPU (storage file://), then the model-only policy bench on the same corpus and the
# two compared (e2e-summary.json). The scaling target runs it per GPU count.
# Carry: .t2w/voxbatch.xz .e2e/services.tar.xz (pack.sh binaries services).
# Env: JOBS (2000), SEED (7), DEVICE (cuda:0), PRECISION (bf16), SIZE (large), DEVICES (0,1 or all:
# one worker per GPU in this process), WORKERS_PER_DEVICE (2: two workers sharing each GPU),
# WORK_TIMEOUT (300 s for the drain), SKIP_MODEL_ONLY (1: no policy bench; OUT/throughput.txt says the
# drain's rate), E (/tmp/voxbatch-e2e), PGPORT, AMQP_PORT, NODENAME (lib/services.sh), PY.
# Output: OUT/worker.log, report-campaign.json, and e2e-summary.json with bench/ (or throughput.txt).
E=${E:-/tmp/voxbatch-e2e}; mkdir -p "$E"
source "$DEVICE_DIR/lib/services.sh"
trap 'stop_worker; stop_services' EXIT
start_services || exit 1

use_libtorch
SIZE=${SIZE:-large}
MODEL=/tmp/voxbatch-models/reference-$SIZE
[ -f "$MODEL/model.pt" ] || $PY tools/export_reference_model.py --size "$SIZE" --out "$MODEL"
BIN=$E/voxbatch; unpack_voxbatch
export AMQP_URL="amqp://guest:guest@127.0.0.1:$AMQP_PORT/%2f" DATABASE_URL="postgres://postgres@127.0.0.1:$PGPORT/voxbatch"
export VOXBATCH_STORAGE__URL="file://$E/audio" VOXBATCH_MEMORY__CALIBRATION_DIR="$PWD/calibration" VOXBATCH_MODEL__DIR="$MODEL"
export VOXBATCH_MODEL__DEVICE="${DEVICE:-cuda:0}" VOXBATCH_MODEL__PRECISION="${PRECISION:-bf16}" VOXBATCH_BATCHING__MAX_BATCH=1024
export RUST_LOG=${RUST_LOG:-warn,voxbatch::worker=info}
JOBS=${JOBS:-2000}; SEED=${SEED:-7}

log "migrate, enqueue $JOBS jobs"
$BIN migrate || exit 1
$BIN bench corpus --jobs "$JOBS" --seed "$SEED" > "$E/corpus.jsonl"
CAMPAIGN=e2e-$(date +%s)
$BIN enqueue "$E/corpus.jsonl" --campaign "$CAMPAIGN" || exit 1
log "worker: drain"
# Timed to the worker's exit: without /metrics' 20-s linger after the drain (text-e2e.sh says why).
export VOXBATCH_METRICS__LINGER=${VOXBATCH_METRICS__LINGER:-0s}
t0=$(date +%s.%N)
run_worker "${WORK_TIMEOUT:-300}" "$OUT/worker.log" ${DEVICES:+--devices "$DEVICES"} ${WORKERS_PER_DEVICE:+--workers-per-device "$WORKERS_PER_DEVICE"}
t1=$(date +%s.%N)
log "worker exited $rc after $($PY -c "print(round($t1 - $t0, 2))") s (model load included)"
tail -3 "$OUT/worker.log"
$BIN status
$BIN report --by campaign --campaign "$CAMPAIGN" --format json > "$OUT/report-campaign.json"
$BIN report --by batch_size
$BIN report --by campaign
if [ "${SKIP_MODEL_ONLY:-0}" = 1 ]; then
  $PY -c "import json; r=json.load(open('$OUT/report-campaign.json')); t=r['total']; print(f\"{t['jobs']} jobs, {t['audio_hours']*3600:.0f} s audio, span {r['batch_span_seconds']:.2f} s: {t['audio_hours']*3600/r['batch_span_seconds']:.1f} audio-s/s\")" | tee "$OUT/throughput.txt"
  exit 0
fi
log "model only, same corpus (policy bench)"
$BIN bench policy --model "$MODEL" --device "${DEVICE:-cuda:0}" --precision "${PRECISION:-bf16}" --jobs "$JOBS" --seed "$SEED" \
  --max-batch 1024 --policy-only --out "$OUT/bench" 2>&1 | grep -v INFO | tail -8
$PY - "$OUT" <<'PYEOF'
import json, sys, glob
out = sys.argv[1]
r = json.load(open(f"{out}/report-campaign.json"))
t = r["total"]; w = r["workers"]
b = json.load(open(glob.glob(f"{out}/bench/policy-*/policy.json")[0]))
model_only = b["runs"][-1]["audio_seconds_per_second"]
audio_s = t["audio_hours"] * 3600
span = r["batch_span_seconds"]
lifetime = (w["busy_hours"] + w["idle_hours"]) * 3600
e2e = audio_s / span
print(f"E2E: {t['jobs']} jobs, {audio_s:.0f} s of audio; batches span {span:.2f} s, worker alive {lifetime:.2f} s")
print(f"GPU busy fraction: {w['busy_hours']*3600/span:.3f} of the batch span, {w['utilisation']:.3f} of the worker's life")
print(f"audio-s/s end to end: {e2e:.1f} (span), {audio_s/lifetime:.1f} (worker life); model only: {model_only:.1f}")
print(f"end to end / model only: {e2e/model_only*100:.1f}% (span), {audio_s/lifetime/model_only*100:.1f}% (worker life)")
json.dump({"jobs": t["jobs"], "audio_seconds": audio_s, "batch_span_seconds": span, "worker_alive_seconds": lifetime,
           "busy_seconds": w["busy_hours"]*3600, "e2e_audio_s_per_s_span": e2e, "e2e_audio_s_per_s_life": audio_s/lifetime,
           "model_only_audio_s_per_s": model_only}, open(f"{out}/e2e-summary.json", "w"), indent=1)
PYEOF
