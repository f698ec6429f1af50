# text-e2e: issue 14's end-to-end run — text jobs → CosyVoice2 speech through RabbitMQ, Postgres and
# a worker on one GPU (storage file://). The model is CosyVoice2-shaped with random weights
# (lib/cv2full.sh, `text`: token2wav, the LLM, the stand-in tokenizer of the LLM fixtures, the
# wetext grammars). Random weights end speech at random, so lengths are forced ([llm]
# force_lengths: each segment decodes its characters ÷ [frontend] chars_per_second × 25 speech
# tokens). The corpus is tools/make_text_corpus.py (JOBS lines of 5-400 characters plus CHAPTERS of
# ~10,000). NVML's utilisation is sampled over the whole drain by nvidia-smi; the reference
# Qwen2LM.inference at batch 1 runs on the same LLM weights in the same call. The summary:
# lib/text_e2e_summary.py.
# Carry: .whl .t2w/voxbatch.xz .e2e/services.tar.xz models/cosyvoice2-llm-parity (pack.sh, and
# `pack.sh services`). Together they pass the carry limit (64 MiB), so the run can be split in two
# calls on one warm machine: STAGE=model (carry .whl, .t2w/voxbatch.xz, models/cosyvoice2-llm-parity:
# builds the model in /tmp/cv2full and runs the reference) then STAGE=e2e (carry
# .e2e/services.tar.xz, .t2w/voxbatch.xz; needs the first call's /tmp). STAGE=all (default) does both.
# Compiled token2wav stages (issue 16): when COMPILED (default /tmp/cv2full-compiled/compiled, what
# the token2wav target leaves on a warm machine) exists, the e2e stage links it into the model: the
# token2wav weights are the same seeded build, and a worker uses a package only if its weights
# digest matches (batches.kernels and the worker log say which ran). COMPILED=none: eager.
# FLOW_GRAPHS ([model] flow_graphs, default config's 16; 0: none): small token2wav buckets' compiled
# flow steps replayed as CUDA graphs (the summary's token2wav_buckets.graph_* say how many).
# Env: STAGE, JOBS (2000), CHAPTERS (10), SEED (7), SLOTS (512), T2W_BATCH ([llm] token2wav_max_bucket, 256; the runs of 2026-12-06 and before: 128), REF_SEQUENCES (3),
# COMPILED, FLOW_ATTENTION (padded | packed | flash), FLOW_GRAPHS, CPU_THREADS ([model] cpu_threads:
# libtorch's intra-op threads, default all cores — they spin beside the 8 frontend threads),
# FRONTEND_THREADS ([frontend] threads, default half the cores up to 8: the first batch of the
# 2026-12-05 H200 run ran at 87.9 % NVML while the frontend prepared the next; whether the
# frontend slows the model thread's host work is what comparing runs with fewer threads tells),
# WORK_TIMEOUT (420 s for the drain), PROFILE_BATCH (below), E (/tmp/voxbatch-e2e: the services' and the worker's files),
# PGPORT, AMQP_PORT, NODENAME (lib/services.sh), any VOXBATCH_* setting (e.g. the stages one after
# the other: VOXBATCH_LLM__OVERLAP_TOKEN2WAV=false; token2wav's buckets pipelined, the summary's
# token2wav_bucket_seconds then the launches' only: VOXBATCH_LLM__PIPELINED_BUCKETS=true; token2wav on a green context that
# leaves the decode at least 8 SMs: VOXBATCH_LLM__DECODE_SMS=8; like runs of 128 before a bucket fills:
# VOXBATCH_LLM__TOKEN2WAV_LEAST_BUCKET=128; longer segments:
# VOXBATCH_FRONTEND__SEGMENT_MAX_TOKENS, VOXBATCH_LLM__MAX_TEXT_TOKENS, with queues of their own,
# VOXBATCH_AMQP__QUEUE…), libtorch's own environment, which the worker inherits (e.g.
# TORCH_CUDNN_V8_API_DISABLED (default 1 for the worker, as the Dockerfile and the systemd unit run
# it: VOXBATCH_ENV, lib/common.sh; 0: cuDNN's v8 API), PYTORCH_CUDA_ALLOC_CONF), PY.
# The buckets' debug lines say how long each stage waited for the GPU and what the caching allocator
# did; the summary sums them (token2wav_bucket_seconds *_wait, token2wav_bucket_allocator).
# Output: OUT/reference-fp32.json, simulated.json, nvml.csv, worker.log, report-campaign.json,
# report-stage.json, text-e2e-summary.json (the dry run stays on the machine, in E: the device tool
# returns at most 8 files from OUT).
# FAMILY=cosyvoice3 (issue 44): the e2e stage on the whole full-size random CosyVoice3 that
# cv3-token2wav.sh TEXT=1 COMPILE=1 left on this warm machine (/tmp/cv3full, its packages in
# /tmp/cv3full-compiled/compiled): STAGE=e2e only; the reference's batch-1 figures are that target's
# (its reference.json: token2wav; no CosyVoice3 LM reference runs here).
E=${E:-/tmp/voxbatch-e2e}; mkdir -p "$E"
STAGE=${STAGE:-all}
case $STAGE in all|model|e2e) ;; *) log "STAGE=$STAGE: all, model or e2e"; exit 2 ;; esac
# RUNS (STAGE=e2e): several drains in one call, one after the other, each with settings of its own:
# RUNS="def; cudnn-att: VOXBATCH_MODEL__CUDNN_ATTENTION=true; v8: TORCH_CUDNN_V8_API_DISABLED=0"
# (a name, then KEY=VALUE pairs after a colon), each under `timeout RUN_TIMEOUT` (190 s). What comes
# back, within the device tool's 8 files: OUT/NAME-summary.json and OUT/NAME-worker.log.xz per run
# (the rest stays in /tmp/text-e2e-runs/NAME). The other knobs (JOBS, CHAPTERS, BIN_XZ, …) apply to all.
if [ -n "${RUNS:-}" ]; then
  [ "$STAGE" = e2e ] || { log "RUNS goes with STAGE=e2e"; exit 2; }
  IFS=';' read -ra specs <<< "$RUNS"
  names=(); sets=()
  for spec in "${specs[@]}"; do  # all checked before the first runs
    spec=$(echo "$spec" | xargs)
    [ -n "$spec" ] || continue
    name=${spec%%:*}; settings=""; [[ "$spec" == *:* ]] && settings=${spec#*:}
    name=$(echo "$name" | xargs)
    [[ "$name" =~ ^[A-Za-z0-9_-]+$ ]] || { log "RUNS: '$name' is not a name (letters, digits, - and _)"; exit 2; }
    for kv in $settings; do [[ "$kv" =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || { log "RUNS: '$kv' in run $name is not KEY=VALUE"; exit 2; }; done
    names+=("$name"); sets+=("$settings")
  done
  for i in "${!names[@]}"; do
    name=${names[$i]}; settings=${sets[$i]}
    dir=/tmp/text-e2e-runs/$name; rm -rf "$dir"; mkdir -p "$dir"
    log "run $name: ${settings:-(defaults)}"
    # shellcheck disable=SC2086 # the settings are split into their KEY=VALUE words on purpose
    env -u RUNS $settings OUT="$dir" timeout "${RUN_TIMEOUT:-190}" scripts/device/run.sh text-e2e STAGE=e2e > "$dir/call.log" 2>&1
    log "run $name exited $? ($(grep -o '"e2e_audio_s_per_s_span": [0-9.]*' "$dir/text-e2e-summary.json" 2>/dev/null || echo 'no summary'))"
    cp "$dir/text-e2e-summary.json" "$OUT/$name-summary.json" 2>/dev/null
    xz -c "$dir/worker.log" > "$OUT/$name-worker.log.xz" 2>/dev/null
  done
  exit 0
fi
source "$DEVICE_DIR/lib/cv2full.sh"
FAMILY=${FAMILY:-cosyvoice2}
if [ "$FAMILY" = cosyvoice3 ]; then
  [ "$STAGE" = e2e ] || { log "FAMILY=cosyvoice3 runs STAGE=e2e, after cv3-token2wav.sh TEXT=1 COMPILE=1 on this warm machine"; exit 2; }
  M=/tmp/cv3full; COMPILED=${COMPILED:-/tmp/cv3full-compiled/compiled}
  grep -q '^kind = "cosyvoice3"' "$M/model/model.toml" 2>/dev/null || { log "no kind cosyvoice3 model in $M (cv3-token2wav.sh TEXT=1 first)"; exit 1; }
fi
use_libtorch
if [ "$STAGE" != e2e ]; then
  install_wheels llm
  build_cv2full text
  grep -q '^kind = "cosyvoice2"' "$M/model/model.toml" || { log "the converted model is not kind cosyvoice2"; head -5 "$M/model/model.toml"; exit 1; }
  log "reference Qwen2LM.inference, batch 1, fp32, same LLM weights"
  $LLM_PY tools/bench_llm_reference.py --official "$M/official" --device cuda:0 --precision fp32 \
    --sequences "${REF_SEQUENCES:-3}" --out "$OUT/reference-fp32.json" 2>&1 | grep -v -i warn | tail -2
  cp "$OUT/reference-fp32.json" /tmp/cv2full-reference-fp32.json 2>/dev/null
  [ "$STAGE" = model ] && { log "model stage done"; exit 0; }
fi
[ -f "$M/model/model.toml" ] || { log "no model in $M: run STAGE=model first on this (warm) machine"; exit 1; }
[ -f "$OUT/reference-fp32.json" ] || cp /tmp/cv2full-reference-fp32.json "$OUT/reference-fp32.json" 2>/dev/null
COMPILED=${COMPILED:-/tmp/cv2full-compiled/compiled}
rm -f "$M/model/compiled"
if [ -d "$COMPILED" ]; then ln -sfn "$COMPILED" "$M/model/compiled"; log "compiled packages: $(cd "$COMPILED" && echo */*.pt2)"; fi
# FLOW_ATTENTION=packed: the eager estimator's transformer levels on valid frames only (model.toml).
sed -i '/^flow_attention = /d' "$M/model/model.toml"
if [ "${FLOW_ATTENTION:-padded}" != padded ]; then
  sed -i "s/^\[cosyvoice2\]\$/[cosyvoice2]\nflow_attention = \"$FLOW_ATTENTION\"/" "$M/model/model.toml"
  log "flow_attention: $(grep '^flow_attention' "$M/model/model.toml")"
fi

source "$DEVICE_DIR/lib/services.sh"
NVSMI_PID=
finish() { [ -n "$NVSMI_PID" ] && kill "$NVSMI_PID" 2>/dev/null; stop_worker; stop_services; }
trap finish EXIT
start_services || exit 1

BIN=$E/voxbatch; unpack_voxbatch
export AMQP_URL="amqp://guest:guest@127.0.0.1:$AMQP_PORT/%2f" DATABASE_URL="postgres://postgres@127.0.0.1:$PGPORT/voxbatch"
export VOXBATCH_STORAGE__URL="file://$E/audio" VOXBATCH_MODEL__DIR="$M/model"
export VOXBATCH_MODEL__DEVICE=cuda:0 VOXBATCH_MODEL__PRECISION=bf16
[ -n "${FLOW_GRAPHS:-}" ] && export VOXBATCH_MODEL__FLOW_GRAPHS="$FLOW_GRAPHS"
[ -n "${CPU_THREADS:-}" ] && export VOXBATCH_MODEL__CPU_THREADS="$CPU_THREADS"
[ -n "${FRONTEND_THREADS:-}" ] && export VOXBATCH_FRONTEND__THREADS="$FRONTEND_THREADS"
export VOXBATCH_MEMORY__POLICY=tokens VOXBATCH_LLM__SLOTS=${SLOTS:-512} VOXBATCH_LLM__FORCE_LENGTHS=true
export VOXBATCH_LLM__TOKEN2WAV_MAX_BUCKET=${T2W_BATCH:-256} VOXBATCH_BATCHING__MAX_BATCH_TOKENS=1000000
# voxbatch::model::tts logs each text batch's token2wav buckets (sizes, padding): the
# summary adds them up; at debug, each bucket's time by stage on the model thread (since c24472d
# its waveforms are cut into segments on another thread; before, audio_out_ms was that).
# voxbatch::model logs "model loaded" (the summary's load end).
export RUST_LOG=${RUST_LOG:-warn,voxbatch::worker=info,voxbatch::model=info,voxbatch::model::tts=debug}

log "corpus, dry run, enqueue"
$PY tools/make_text_corpus.py --jobs "${JOBS:-2000}" --chapters "${CHAPTERS:-10}" --seed "${SEED:-7}" > "$E/corpus.jsonl"
# A queue of the run's own (and its own routing key): on a warm machine a run cut short by
# WORK_TIMEOUT leaves jobs queued, which the next run's worker would otherwise take.
CAMPAIGN=text-e2e-$(date +%s)
export VOXBATCH_AMQP__QUEUE=${VOXBATCH_AMQP__QUEUE:-$CAMPAIGN.jobs} VOXBATCH_AMQP__ROUTING_KEY=${VOXBATCH_AMQP__ROUTING_KEY:-$CAMPAIGN}
$BIN migrate || exit 1
# The dry run (3.5 MB for the full corpus) stays on the machine: the device tool returns at most 8
# files from $OUT (alphabetically first), and the worker log and summary must come back.
$BIN text "$E/corpus.jsonl" --gpu H200 --format json > "$E/dry-run.json" 2> "$E/dry-run.err" || tail -3 "$E/dry-run.err"
# What tools/simulate_text_buckets.py predicts for this corpus (batches as the worker's work budget
# cuts them: 8 fills of the slots), to set against the measured fill and buckets below.
$PY tools/simulate_text_buckets.py "$E/dry-run.json" --slots "${SLOTS:-512}" --cap "${T2W_BATCH:-256}" \
  --work-budget $(( ${SLOTS:-512} * 250 * 8 )) > "$OUT/simulated.json" 2>&1 && log "simulated: $(cat "$OUT/simulated.json")"
$BIN enqueue "$E/corpus.jsonl" --campaign "$CAMPAIGN" || exit 1

log "worker: drain (NVML sampled every 200 ms)"
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used,power.draw --format=csv,noheader,nounits -lms 200 > "$OUT/nvml.csv" 2>/dev/null &
NVSMI_PID=$!
# PROFILE_BATCH=N (issue 42): the worker's Nth text batch under libtorch's profiler ([model]
# profile_batch): the kernels' GPU time, the device's busy time by CUDA stream and their union (what
# the decode and token2wav ran at once), 100-ms bins; in OUT/profile.tgz, the summary in worker.log
# ("batch profiled"). The profiled batch runs slower than the others: its wall is not a figure. Not
# yet run on a GPU: a full batch of the default corpus holds ≈ 10^6 kernels (2,000 decode steps of
# ≈ 400 each, token2wav's), which Kineto buffers in host memory; try a smaller corpus first
# (JOBS=300 CHAPTERS=0).
if [ -n "${PROFILE_BATCH:-}" ]; then
  rm -rf "$E/profiles"
  export VOXBATCH_MODEL__PROFILE_BATCH=$PROFILE_BATCH VOXBATCH_MODEL__PROFILE_DIR=$E/profiles
fi
# The drain is timed to the worker's exit: without /metrics' linger (default 20 s, for a last
# scrape after the queue drained), which the runs up to 2026-12-06 16:50 UTC counted in their wall.
export VOXBATCH_METRICS__LINGER=${VOXBATCH_METRICS__LINGER:-0s}
t0=$(date +%s.%N)
run_worker "${WORK_TIMEOUT:-420}" "$OUT/worker.log"
t1=$(date +%s.%N)
kill "$NVSMI_PID" 2>/dev/null; NVSMI_PID=
log "worker exited $rc after $($PY -c "print(round($t1 - $t0, 2))") s (model load included)"
grep -E "error|panicked" "$OUT/worker.log" | head -5
$BIN status | tail -15
$BIN report --by campaign --campaign "$CAMPAIGN" --format json > "$OUT/report-campaign.json"
$BIN report --by stage --campaign "$CAMPAIGN" --format json > "$OUT/report-stage.json"
$BIN report --by stage --campaign "$CAMPAIGN"
[ -n "${PROFILE_BATCH:-}" ] && [ -d "$E/profiles" ] && tar -C "$E" -czf "$OUT/profile.tgz" profiles
$PY "$DEVICE_DIR/lib/text_e2e_summary.py" "$OUT" "$t0" "$t1"
log "done"
