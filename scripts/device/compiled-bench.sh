#!/usr/bin/env bash
# Issue 16's compiled stages on the GPU machine: builds the `full` random CosyVoice2 token2wav
# (reference code, as token2wav-bench.sh), compiles its flow estimator (at PRECISION) and vocoder
# body (at the model's vocoder_precision, tf32) for this GPU with tools/compile_token2wav.py
# (AOTInductor, --check against the eager module) into a second model directory (links to the
# first's files + compiled/), then runs `voxbatch bench token2wav` on both: eager port vs compiled
# stages, same weights, same call.
# Carry: .whl .t2w/voxbatch.xz (pack-gpu.sh). Env: OUT, STAGE (all | compile | bench: compiling the
# full estimator takes over 3 minutes on the H200 host, so split it from the bench on one warm
# machine), DIAGNOSE (set: a failed bench runs again with CUDA_LAUNCH_BLOCKING=1 at DIAGNOSE_BATCHES),
# STAGES (estimator,hift: what the compile stage compiles; encoder is experimental — its package
# crashed a GPU bench in session 18 before its CPU constant was moved, and ran 3× slower than the eager
# encoder in session 19), TUNING (none | coordinate-descent |
# max-autotune: tools/compile_token2wav.py --tuning), ATTENTION (auto | sdpa | flex | flash | cudnn: the estimator's
# attention, tools/compile_token2wav.py --attention), LAYOUT (time-major | time-major-strided | time-major-strided-copy | time-major-shift |
# time-major-cudnn | reference: each stage's activations, tools/compile_token2wav.py --layout), FF_GELU (epilogue |
# exact: the estimator's feed-forward GELU, tools/compile_token2wav.py --ff-gelu), MISH (exact | exp: --mish), QKV
# (auto | separate | fused: --qkv),
# HIFT_CHANNEL_MULTIPLE (1 | 4 | 8: --hift-channel-multiple), HIFT_DILATION (dilated | phases:
# --hift-dilation), INDUCTOR_OPTIONS ("[STAGE:]KEY=VALUE ...": inductor
# settings for the compile after the tool's default estimator:freezing=True, e.g. "realize_reads_threshold=2")
# — each of these compile settings, left unset, is the tool's default —, PRECISION (bf16), BATCHES
# (64,128), VOCODERS (tf32), REPEATS (3), MAX_FRAMES (1500), MAX_BATCH (256), CHECK (set: compare
# each package with its eager module after compiling), BENCH_DIRS (default: the eager model, then the
# compiled one), PROFILE (set: each bench ends with one run of its largest batch under libtorch's
# profiler — `bench token2wav --profile`: time by kernel category and the longest kernels), PY.
# A fresh machine has neither model: compile and
# bench in one call. EAGER_ATTENTION ("packed flash": also the eager model with each of these
# flow_attention values; PACKED=1 means packed), CUDNN_BENCHMARK (set: the compiled directory again
# with `--cudnn-benchmark`), CUDNN_HEURISTIC_B (set: and with TORCH_CUDNN_USE_HEURISTIC_MODE_B=1,
# cuDNN's slower, more accurate algorithm heuristics, no search), FLOW_GRAPHS (N: the compiled directory again with `--flow-graphs N`, small
# batches' flow steps replayed as CUDA graphs — measure it with short utterances, e.g.
# UTTERANCE_SECONDS=2 BATCHES=8,32,128; FLOW_GRAPH_MAX_FRAMES raises the largest step captured, rows ×
# frames, e.g. 1000000 for batches of 128 ten-second utterances), UTTERANCE_SECONDS (10), COMPILED_DIR
# (/tmp/cv2full-compiled: where the compile stage writes and the bench reads the packages; another
# directory compiles a variant beside the default one, e.g. LAYOUT=time-major-shift, started once
# the first has built the model; give it its own SITE, default /tmp/site, where the wheels go).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/compiled-out}; mkdir -p "$OUT"
PY=${PY:-python3}
log() { echo "[compiled $(date -u +%T)] $*"; }
SITE=${SITE:-/tmp/site}; rm -rf "$SITE"
$PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" \
  $(ls .whl/*.whl | grep -v -e transformers- -e huggingface_hub- -e tokenizers-) || exit 1
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
source scripts/device/libtorch.sh
source scripts/device/voxbatch-binary.sh
M=/tmp/cv2full
if [ ! -f "$M/model/token2wav.safetensors" ]; then
  log "building the full-size random model (reference code) and converting it"
  $PY tools/make_parity_fixtures.py --config full --no-fixtures --out "$M" 2>&1 | grep -v Warning | tail -1
  $PY tools/convert_cosyvoice.py "$M/official" "$M/model" --name cosyvoice2-full-random | tail -1 | cut -c1-200
fi
C=${COMPILED_DIR:-/tmp/cv2full-compiled}; mkdir -p "$C"
# A compiled directory is the model's files (linked) plus its own compiled/. Linked again before each
# bench too: text-e2e.sh rebuilds the model as kind cosyvoice2 (LLM and tokenizer files beside the
# same token2wav weights), and a directory linked before that would name files it lacks.
link_model() { for f in "$M"/model/*; do [ "$(basename "$f")" = compiled ] || ln -sfn "$f" "$1/"; done; }
link_model "$C"
P=${PRECISION:-bf16}
STAGE=${STAGE:-all}
if [ "$STAGE" != bench ]; then
STAGES=${STAGES:-estimator,hift}
log "compiling $STAGES (flow $P)"
# Each setting left unset is the tool's default (session 19's measured candidate with session 20's
# window copy: time-major-strided-copy, Mish exp, fused q/k/v, the estimator's weights frozen, the
# vocoder's STFT channels padded to 20 and its dilated convolutions as phases).
$PY tools/compile_token2wav.py --model "$C" --device cuda:0 --stages "$STAGES" --precision "$P" \
  ${ATTENTION:+--attention "$ATTENTION"} ${LAYOUT:+--layout "$LAYOUT"} ${FF_GELU:+--ff-gelu "$FF_GELU"} ${MISH:+--mish "$MISH"} \
  ${QKV:+--qkv "$QKV"} ${HIFT_CHANNEL_MULTIPLE:+--hift-channel-multiple "$HIFT_CHANNEL_MULTIPLE"} \
  ${HIFT_DILATION:+--hift-dilation "$HIFT_DILATION"} --tuning "${TUNING:-none}" --max-frames "${MAX_FRAMES:-1500}" \
  $(for o in ${INDUCTOR_OPTIONS:-}; do printf -- '--inductor-option %s ' "$o"; done) \
  --max-batch "${MAX_BATCH:-256}" ${CHECK:+--check} 2>&1 | grep --line-buffered -v -i "warn\|deprecat\|__new__" \
  | tee "$OUT/compile-${STAGES//,/-}.log" | tail -6
compile_rc=${PIPESTATUS[0]}
# (The log is written as the compile goes: a call that runs out of time still says how far it got.)
[ "$compile_rc" = 0 ] || log "compile exited $compile_rc (a stage failed: its error is above; the others were compiled)"
fi
[ "$STAGE" = compile ] && { log "compile stage done"; exit "${compile_rc:-0}"; }
# EAGER_ATTENTION="packed flash": one more directory per value, the eager model with that
# `flow_attention` (packed: the estimator's transformer levels on valid frames only, FlashAttention
# varlen; flash: the padded batch through FlashAttention with each item's key count), benched after
# the others. PACKED=1 is EAGER_ATTENTION=packed.
EAGER_ATTENTION=${EAGER_ATTENTION:-${PACKED:+packed}}
EXTRA_DIRS=
for a in $EAGER_ATTENTION; do
  D=/tmp/cv2full-$a; mkdir -p "$D"
  for f in "$M"/model/*; do case "$(basename "$f")" in compiled|model.toml) ;; *) ln -sfn "$f" "$D/" ;; esac; done
  sed "s/^\[cosyvoice2\]\$/[cosyvoice2]\nflow_attention = \"$a\"/" "$M/model/model.toml" > "$D/model.toml"
  grep -q "^flow_attention = \"$a\"" "$D/model.toml" || { log "could not set flow_attention in $D/model.toml"; exit 1; }
  EXTRA_DIRS="$EXTRA_DIRS $D"
done
# CUDNN_BENCHMARK=1: the compiled directory once more with cuDNN's per-shape algorithm search.
[ -n "${CUDNN_BENCHMARK:-}" ] && EXTRA_DIRS="$EXTRA_DIRS $C:cudnn-benchmark"
# FLOW_GRAPHS=N: and once more with small batches' flow steps as CUDA graphs.
[ -n "${FLOW_GRAPHS:-}" ] && EXTRA_DIRS="$EXTRA_DIRS $C:flow-graphs"
# CUDNN_HEURISTIC_B=1: and once more with cuDNN's heuristic mode B choosing each convolution's
# algorithm (libtorch reads TORCH_CUDNN_USE_HEURISTIC_MODE_B once, at its first convolution): no
# search, no workspace beyond the chosen algorithm's.
[ -n "${CUDNN_HEURISTIC_B:-}" ] && EXTRA_DIRS="$EXTRA_DIRS $C:heuristic-b"
for entry in ${BENCH_DIRS:-$M/model $C} $EXTRA_DIRS; do
  d=${entry%%:*}; flag=; name=$(basename "$d"); run_env=
  [ "$d" != "$M/model" ] && [ -d "$d/compiled" ] && link_model "$d"
  [ "$entry" != "$d" ] && { flag=--${entry#*:}; name=$name-${entry#*:}; }
  [ "$flag" = --flow-graphs ] && flag="--flow-graphs $FLOW_GRAPHS ${FLOW_GRAPH_MAX_FRAMES:+--flow-graph-max-frames $FLOW_GRAPH_MAX_FRAMES}"
  [ "$flag" = --heuristic-b ] && { flag=; run_env=TORCH_CUDNN_USE_HEURISTIC_MODE_B=1; }
  log "bench token2wav: $name"
  # The whole output is kept (a failure's message and whatever the process printed before an
  # abort); the console gets the summary lines.
  env $run_env RUST_LOG=voxbatch=info $BIN bench token2wav --model "$d" --device cuda:0 --batches "${BATCHES:-64,128}" --precisions "$P" \
    --utterance-seconds "${UTTERANCE_SECONDS:-10}" --vocoders "${VOCODERS:-tf32}" --repeats "${REPEATS:-3}" $flag ${PROFILE:+--profile} --out "$OUT/$name" > "$OUT/$name.full.log" 2>&1
  rc=$?
  grep -E "audio-s/s|compiled|eager|failed|^\| " "$OUT/$name.full.log" | tee "$OUT/$name.log"
  # (Each tail line marked "[compiled tail]": compiled-variants.sh's console filter keeps them.)
  [ $rc = 0 ] || { log "bench exited $rc; its last lines:"; tail -25 "$OUT/$name.full.log" | sed 's/^/[compiled tail] /'; }
  # DIAGNOSE=1: a failed run again with synchronous launches, so the failing kernel is the one named.
  if [ -n "${DIAGNOSE:-}" ] && { [ $rc != 0 ] || grep -q "failed" "$OUT/$name.log"; }; then
    log "again with CUDA_LAUNCH_BLOCKING=1 (batches ${DIAGNOSE_BATCHES:-128}, one repeat)"
    CUDA_LAUNCH_BLOCKING=1 TORCH_SHOW_CPP_STACKTRACES=1 RUST_LOG=voxbatch=debug $BIN bench token2wav --model "$d" --device cuda:0 \
      --batches "${DIAGNOSE_BATCHES:-128}" --precisions "$P" --vocoders "${VOCODERS:-tf32}" --repeats 1 --out "$OUT/$name-blocking" \
      > "$OUT/$name-blocking.full.log" 2>&1
    log "exit $?; its last lines:"; tail -40 "$OUT/$name-blocking.full.log"
  fi
done
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv > "$OUT/nvidia-smi.csv" 2>&1
log "done"
