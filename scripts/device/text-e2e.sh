#!/usr/bin/env bash
# Issue 14's end-to-end run on the GPU machine: text jobs → CosyVoice2 speech through RabbitMQ,
# Postgres and a worker on one GPU (storage file://). The model is CosyVoice2-shaped with random
# weights: token2wav from tools/make_parity_fixtures.py --config full, the LLM from
# tools/make_llm_fixtures.py --full, the stand-in tokenizer of the LLM fixtures, the wetext grammars,
# converted by tools/convert_cosyvoice.py. Random weights end speech at random, so lengths are forced
# ([llm] force_lengths: each segment decodes its characters ÷ [frontend] chars_per_second × 25 speech
# tokens). The corpus is tools/make_text_corpus.py (JOBS lines of 5-400 characters plus CHAPTERS of
# ~10,000). NVML's utilisation is sampled over the whole drain by nvidia-smi; the reference
# Qwen2LM.inference at batch 1 runs on the same LLM weights in the same call.
# Carry: .whl .t2w/voxbatch.xz .e2e/services.tar.xz models/cosyvoice2-llm-parity (pack-gpu.sh,
# pack-services.sh). Together they pass the carry limit (64 MiB), so the run can be split in two calls
# on one warm machine: STAGE=model (carry .whl, .t2w/voxbatch.xz, models/cosyvoice2-llm-parity: builds
# the model in /tmp/cv2full and runs the reference) then STAGE=e2e (carry .e2e/services.tar.xz,
# .t2w/voxbatch.xz; needs the first call's /tmp). STAGE=all (default) does both.
# Compiled token2wav stages (issue 16): when COMPILED (default /tmp/cv2full-compiled/compiled, what
# compiled-bench.sh leaves on a warm machine) exists, the e2e stage links it into the model: the
# token2wav weights are the same seeded build, and a worker uses a package only if its weights
# digest matches (batches.kernels and the worker log say which ran). COMPILED=none: eager.
# FLOW_GRAPHS ([model] flow_graphs, default config's 16; 0: none): small token2wav buckets' compiled
# flow steps replayed as CUDA graphs (the summary's token2wav_buckets.graph_* say how many).
# Env: OUT, STAGE, JOBS (2000), CHAPTERS (10), SEED (7), SLOTS (512), T2W_BATCH (128), REF_SEQUENCES (3),
# COMPILED, FLOW_ATTENTION (padded | packed | flash), FLOW_GRAPHS, CPU_THREADS ([model] cpu_threads:
# libtorch's intra-op threads, default all cores — they spin beside the 8 frontend threads), PY.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
OUT=${OUT:-/tmp/text-e2e-out}; mkdir -p "$OUT"
E=${E:-/tmp/voxbatch-e2e}; mkdir -p "$E"
PY=${PY:-python3}
log() { echo "[text-e2e $(date -u +%T)] $*"; }
STAGE=${STAGE:-all}
M=/tmp/cv2full
if [ "$STAGE" != e2e ]; then
rm -rf /tmp/site /tmp/llm-site
$PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/llm-site .whl/transformers-* .whl/huggingface_hub-* .whl/tokenizers-* || exit 1
$PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
  $(ls .whl/*.whl | grep -v -e transformers- -e huggingface_hub- -e tokenizers-) || exit 1
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
LLM_PY="env PYTHONPATH=/tmp/llm-site:$PYTHONPATH $PY"
TORCH_LIB=$($PY -c 'import torch, os; print(os.path.dirname(torch.__file__) + "/lib")')
export LD_LIBRARY_PATH="$TORCH_LIB:/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}"

if [ ! -f "$M/model/tokenizer.json" ]; then
  log "building the full-size random CosyVoice2 (reference code) and converting it"
  $PY tools/make_parity_fixtures.py --config full --no-fixtures --out "$M" 2>&1 | grep -v Warning | tail -1
  $LLM_PY tools/make_llm_fixtures.py --full --out "$M/llm" 2>&1 | tail -1
  cp -r "$M/llm/official/." "$M/official/"
  # The stand-in tokenizer (no real vocabulary can be downloaded), beside the full config.json.
  cp models/cosyvoice2-llm-parity/official/CosyVoice-BlankEN/{vocab.json,merges.txt,tokenizer_config.json} "$M/official/CosyVoice-BlankEN/"
  $LLM_PY tools/convert_cosyvoice.py "$M/official" "$M/model" --name cosyvoice2-full-random 2>&1 | tail -1 | cut -c1-300
fi
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
TORCH_LIB=$($PY -c 'import torch, os; print(os.path.dirname(torch.__file__) + "/lib")')
export LD_LIBRARY_PATH="$TORCH_LIB:/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}"

source scripts/device/services.sh
start_services || exit 1
NVSMI_PID=
finish() { [ -n "$NVSMI_PID" ] && kill "$NVSMI_PID" 2>/dev/null; stop_services; }
trap finish EXIT

BIN=$E/voxbatch
xz -dc .t2w/voxbatch.xz > "$BIN" && chmod +x "$BIN" || exit 1
export AMQP_URL="amqp://guest:guest@127.0.0.1:$AMQP_PORT/%2f" DATABASE_URL="postgres://postgres@127.0.0.1:$PGPORT/voxbatch"
export VOXBATCH_STORAGE__URL="file://$E/audio" VOXBATCH_MODEL__DIR="$M/model"
export VOXBATCH_MODEL__DEVICE=cuda:0 VOXBATCH_MODEL__PRECISION=bf16
[ -n "${FLOW_GRAPHS:-}" ] && export VOXBATCH_MODEL__FLOW_GRAPHS="$FLOW_GRAPHS"
[ -n "${CPU_THREADS:-}" ] && export VOXBATCH_MODEL__CPU_THREADS="$CPU_THREADS"
export VOXBATCH_MEMORY__POLICY=tokens VOXBATCH_LLM__SLOTS=${SLOTS:-512} VOXBATCH_LLM__FORCE_LENGTHS=true
export VOXBATCH_BATCHING__MAX_BATCH=${T2W_BATCH:-128} VOXBATCH_BATCHING__MAX_BATCH_TOKENS=1000000
# voxbatch::model::cosyvoice2::tts logs each text batch's token2wav buckets (sizes, padding): the
# summary below adds them up; at debug, each bucket's time by stage on the model thread (since
# c24472d its waveforms are cut into segments on another thread; before, audio_out_ms was that).
export RUST_LOG=${RUST_LOG:-warn,voxbatch::worker=info,voxbatch::model::cosyvoice2::tts=debug}

log "corpus, dry run, enqueue"
$PY tools/make_text_corpus.py --jobs "${JOBS:-2000}" --chapters "${CHAPTERS:-10}" --seed "${SEED:-7}" > "$E/corpus.jsonl"
$BIN migrate || exit 1
# The dry run (3.5 MB for the full corpus) stays on the machine: the device tool returns at most 8
# files from $OUT (alphabetically first), and the worker log and summary must come back.
$BIN text "$E/corpus.jsonl" --gpu H200 --format json > "$E/dry-run.json" 2> "$E/dry-run.err" || tail -3 "$E/dry-run.err"
# What tools/simulate_text_buckets.py predicts for this corpus (batches as the worker's work budget
# cuts them: 8 fills of the slots), to set against the measured fill and buckets below.
$PY tools/simulate_text_buckets.py "$E/dry-run.json" --slots "${SLOTS:-512}" --cap "${T2W_BATCH:-128}" \
  --work-budget $(( ${SLOTS:-512} * 250 * 8 )) > "$OUT/simulated.json" 2>&1 && log "simulated: $(cat "$OUT/simulated.json")"
CAMPAIGN=text-e2e-$(date +%s)
$BIN enqueue "$E/corpus.jsonl" --campaign "$CAMPAIGN" || exit 1

log "worker: drain (NVML sampled every 200 ms)"
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used,power.draw --format=csv,noheader,nounits -lms 200 > "$OUT/nvml.csv" 2>/dev/null &
NVSMI_PID=$!
t0=$(date +%s.%N)
timeout "${WORK_TIMEOUT:-420}" $BIN work --drain > "$OUT/worker.log" 2>&1; rc=$?
t1=$(date +%s.%N)
kill "$NVSMI_PID" 2>/dev/null; NVSMI_PID=
log "worker exited $rc after $($PY -c "print(round($t1 - $t0, 2))") s (model load included)"
grep -E "error|panicked" "$OUT/worker.log" | head -5
$BIN status | tail -15
$BIN report --by campaign --campaign "$CAMPAIGN" --format json > "$OUT/report-campaign.json"
$BIN report --by stage --campaign "$CAMPAIGN" --format json > "$OUT/report-stage.json"
$BIN report --by stage --campaign "$CAMPAIGN"
$PY - "$OUT" "$t0" "$t1" <<'PYEOF'
import csv, json, sys, datetime
out, t0, t1 = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
r = json.load(open(f"{out}/report-campaign.json")); t = r["total"]; w = r["workers"]
st = json.load(open(f"{out}/report-stage.json"))
audio_s = t["audio_hours"] * 3600; span = r["batch_span_seconds"]; infer_s = t["gpu_hours"] * 3600
util = []
for row in csv.reader(open(f"{out}/nvml.csv")):
    try:
        ts = datetime.datetime.strptime(row[0].strip(), "%Y/%m/%d %H:%M:%S.%f").timestamp(); util.append((ts, float(row[1])))
    except (ValueError, IndexError):
        pass
# NVML over the whole drain (model load and the first batch's frontend included), and over the
# working span (first to last sample with any kernel activity).
busy = [u for _, u in util]
active = [i for i, (_, u) in enumerate(util) if u > 0]
working = busy[active[0]: active[-1] + 1] if active else []
ref = json.load(open(f"{out}/reference-fp32.json")) if __import__("os").path.exists(f"{out}/reference-fp32.json") else {}
summary = {
    "jobs": t["jobs"], "chars": t["chars"], "audio_seconds": audio_s, "batch_span_seconds": span,
    "worker_wall_seconds": t1 - t0, "inference_seconds": infer_s,
    "e2e_audio_s_per_s_span": audio_s / span, "e2e_audio_s_per_s_wall": audio_s / (t1 - t0),
    "model_audio_s_per_gpu_s": audio_s / infer_s, "usd_per_million_chars": t["usd_per_million_chars"],
    "nvml_util_mean_drain": sum(busy) / len(busy) if busy else None, "nvml_samples": len(busy),
    "nvml_util_mean_working": sum(working) / len(working) if working else None,
    "nvml_working_seconds": (util[active[-1]][0] - util[active[0]][0]) if active else None,
    "nvml_util_mean_in_batches": t["gpu_util_mean"],
    "stages": {s["key"]: {"gpu_seconds": s["gpu_hours"] * 3600, "audio_s_per_gpu_s": s["audio_s_per_gpu_s"]} for s in st["rows"]},
    "reference_batch1": ref,
}
# token2wav buckets, from the worker log's per-batch lines (tts.rs): how full they were.
import re
buckets = {"text_batches": 0, "buckets": 0, "segments": 0, "tokens": 0, "padded_tokens": 0,
           "graph_steps": 0, "graphs_captured": 0, "graph_capture_ms": 0}
for line in open(f"{out}/worker.log", errors="replace"):
    if "token2wav buckets" not in line:
        continue
    fields = dict(re.findall(r"(\w+)=(\d+)", line))
    buckets["text_batches"] += 1
    # graph_*: small buckets' flow steps replayed as CUDA graphs ([model] flow_graphs).
    for k in ("buckets", "segments", "tokens", "padded_tokens", "graph_steps", "graphs_captured", "graph_capture_ms"):
        buckets[k] += int(fields.get(k, 0))
if buckets["buckets"]:
    buckets["mean_bucket_size"] = buckets["segments"] / buckets["buckets"]
    buckets["fill"] = buckets["tokens"] / max(buckets["padded_tokens"], 1)
summary["token2wav_buckets"] = buckets
def ms_fields_summed(marker):
    """Every `<name>_ms=<n>` of the worker log's lines holding `marker`, summed, in seconds, from
    "model loaded" on (the load's warm-up sentence left out; the worker starts before its model
    has loaded, so "worker started" comes earlier)."""
    sums, started = {}, False
    for line in open(f"{out}/worker.log", errors="replace"):
        started = started or "model loaded" in line
        if started and marker in line:
            for k, v in re.findall(r"(\w+)_ms=(\d+)", line):
                sums[k] = sums.get(k, 0) + int(v) / 1000
    return sums
# Each bucket's time by stage (tts.rs, debug), and the LLM's share of each text batch by phase
# (tts.rs "llm decode"): seconds summed over the drain.
summary["token2wav_bucket_seconds"] = ms_fields_summed("token2wav bucket ")
summary["llm_decode_seconds"] = ms_fields_summed("llm decode")
# From each text batch's last token2wav bucket to its end as the inference stage saw it (the
# model thread's work after the GPU's: what the GPU idles through at each batch's end).
import datetime as dt
def stamp(line):
    return dt.datetime.strptime(line[:26], "%Y-%m-%dT%H:%M:%S.%f").timestamp()
tails, last_buckets = [], None
for line in open(f"{out}/worker.log", errors="replace"):
    if "token2wav buckets" in line:
        last_buckets = stamp(line)
    elif " inferred jobs=" in line and last_buckets is not None:
        tails.append(round(stamp(line) - last_buckets, 3)); last_buckets = None
summary["batch_end_seconds"] = tails
# NVML over the batch span: from the first batch's start to the last one's end, as the worker log
# times them (an "inferred" line at each batch's end with its infer_ms; log times are UTC, as the
# machine's nvidia-smi stamps are).
spans = []
for line in open(f"{out}/worker.log", errors="replace"):
    m = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+)Z .*inferred jobs=\d+ infer_ms=(\d+)", line)
    if m:
        end = datetime.datetime.strptime(m.group(1)[:26], "%Y-%m-%dT%H:%M:%S.%f").timestamp()
        spans.append((end - int(m.group(2)) / 1000, end))
        summary.setdefault("batches", []).append({"jobs": int(re.search(r"inferred jobs=(\d+)", line).group(1)), "infer_seconds": int(m.group(2)) / 1000})
if spans:
    lo, hi = min(s for s, _ in spans), max(e for _, e in spans)
    inside = [u for ts, u in util if lo <= ts <= hi]
    summary["nvml_util_mean_batch_span"] = sum(inside) / len(inside) if inside else None
    # NVML inside each batch: where a drain's shortfall is (its first batch, above all).
    for b, (lo, hi) in zip(summary["batches"], spans):
        inside = [u for ts, u in util if lo <= ts <= hi]
        b["nvml_util_mean"] = round(sum(inside) / len(inside), 1) if inside else None
# The model's load (it overlaps the intake and the frontend; the GPU waits for it): its seconds
# and where they went (tts.rs "weights loaded": token2wav, LLM, KV cache and graphs; the rest
# of "model loaded" is the warm-up).
load_lines = {"weights loaded": "", "warmed up": "warm_up_", "model loaded": "total_"}
loaded_at = None
for line in open(f"{out}/worker.log", errors="replace"):
    for marker, prefix in load_lines.items():
        if marker in line:
            for k, v in re.findall(r'(\w+)="?([\d.]+)"?', line[27:]):
                summary.setdefault("model_load", {})[prefix + k] = float(v)
    if "model loaded" in line and loaded_at is None:
        loaded_at = stamp(line)
# NVML from the model's load to the last batch's end: the drain's GPU time once the model can
# work (the intake and the frontend have worked through the load since the worker starts first).
if loaded_at is not None and spans:
    hi = max(e for _, e in spans)
    inside = [u for ts, u in util if loaded_at <= ts <= hi]
    summary["nvml_util_mean_after_load"] = sum(inside) / len(inside) if inside else None
    summary["after_load_seconds"] = hi - loaded_at
json.dump(summary, open(f"{out}/text-e2e-summary.json", "w"), indent=1)
print(json.dumps(summary, indent=1)[:3000])
PYEOF
log "done"
