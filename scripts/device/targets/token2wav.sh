# token2wav: issue 16's compiled token2wav in one call — the full-size random CosyVoice2 (lib/cv2full.sh),
# its packages compiled for this GPU by tools/compile_token2wav.py (the default ones, and VARIANTS
# beside them, all at once), then `voxbatch bench token2wav` of the eager port, the default packages
# and every variant at BATCHES, the fastest compiled directory again at SWEET's batches, and the
# reference token2wav (the official code path at batch 1: flow under fp16 and bf16 autocast, HiFT
# outside it with torch's default TF32) — same weights, same call, as docs/PERFORMANCE.md's tables
# need them. A fresh machine needs STAGE=all (over 6 minutes with variants: the estimator's compile
# takes 3 minutes on an H200); on one warm machine STAGE=compile then STAGE=bench.
# With STAGES=none nothing is compiled: the eager port alone, as issue 7's bench (STAGES=none
# BATCHES=1,8,32,64,128 PRECISIONS=fp32,fp16,bf16 VOCODERS= PROFILE= REF_PRECISIONS=fp32,fp16,bf16;
# packages a warm machine's COMPILED_DIR already holds are benched too, unless BENCH_DIRS=/tmp/cv2full/model).
# Carry: .whl .t2w (pack.sh).
#
# Compile (STAGE all or compile):
#   STAGES (estimator,hift; none: no compile): the default packages' stages, each compiled in a process
#     of its own into COMPILED_DIR (/tmp/cv2full-compiled: a directory of links to the model's files
#     plus its compiled/), so nothing waits behind the estimator's, the longest. encoder is experimental
#     (slower than the eager encoder on an H200, 2026-12-05).
#   The compile settings, each left unset the tool's default: PRECISION (bf16: the flow's; the vocoder's
#     is the model's, tf32), LAYOUT (--layout), MISH (--mish), QKV (--qkv), FF_GELU (--ff-gelu), ATTENTION
#     (--attention), HIFT_CHANNEL_MULTIPLE, HIFT_DILATION, TUNING (none | coordinate-descent |
#     max-autotune), INDUCTOR_OPTIONS ("[STAGE:]KEY=VALUE ...", after the tool's default
#     estimator:freezing=True, e.g. "realize_reads_threshold=2"), MAX_FRAMES (1500), MAX_BATCH (512: every
#     package takes batches of up to 512 rows — classifier-free guidance doubles a batch, and a batch past
#     a package's limit runs eager, so SWEET=256 must not measure the eager port), CHECK (set: each
#     package compared with its eager module after compiling).
#   VARIANTS: space-separated NAME:KEY=VALUE+KEY=VALUE…, each compiled into /tmp/cv2full-NAME with the
#     compile settings above as keys (one INDUCTOR_OPTIONS=KEY=VALUE each) and STAGES (default estimator;
#     a vocoder variant says STAGES=hift), e.g.
#       VARIANTS="strided-exp:LAYOUT=time-major-strided+MISH=exp hift4:STAGES=hift+HIFT_CHANNEL_MULTIPLE=4"
#     or FROM=NAME: another variant's packages, no compile of its own ("both:FROM=strided-exp+FROM=hift4").
#     A variant directory holds the default's package for each stage it did not compile. Settings in the
#     environment instead are the default's too.
#   COMPILE_LIMIT (540): seconds every compile may take, counted from the compile stage's start (the device
#     tool's calls end at 600 s); a compile cut short says so in its log (rc=124) and is not benched.
# Bench (STAGE all or bench):
#   EAGER (1: the eager model first), BENCH_DIRS (instead: the directories benched at BATCHES), BATCHES
#   (128), PRECISIONS (PRECISION), VOCODERS (tf32; empty: the model's), REPEATS (3), PROFILE (1: each bench
#   ends with one run of its largest batch under libtorch's profiler; empty: none), UTTERANCE_SECONDS (10),
#   SWEET (e.g. 192,256; empty: none): the fastest compiled directory at the largest batch benched, again
#   at these batches. Each round also benches, after its directories: EAGER_ATTENTION ("packed flash": the
#   eager model with each of these flow_attention values; PACKED=1 is packed), CUDNN_BENCHMARK (set: the
#   round's compiled directory with `--cudnn-benchmark`), CUDNN_ATTENTION (set: and with `--cudnn-attention`,
#   attention as cuDNN's, the worker's default before 2026-12-08), CUDNN_HEURISTIC_B (set: and with
#   TORCH_CUDNN_USE_HEURISTIC_MODE_B=1, cuDNN's heuristic mode B, no search), FLOW_GRAPHS (N: with
#   `--flow-graphs N`, small batches' flow steps replayed as CUDA graphs — at the sweet spot when SWEET is
#   set; FLOW_GRAPH_MAX_FRAMES raises the largest step captured, rows × frames, e.g. 1000000 for batches of
#   128 ten-second utterances). DIAGNOSE (set: a failed bench runs again with CUDA_LAUNCH_BLOCKING=1 at
#   DIAGNOSE_BATCHES, 128), REFERENCE (1; 0: no reference), REF_PRECISIONS (fp16,bf16).
# Logs: everything under WORK (/tmp/token2wav); OUT gets variants-compile.log (each compile's log),
# variants-bench.log (each bench's summary lines and profile tables), variants-token2wav.jsonl (each
# bench's JSON, one a line) and reference.json — few files, as the device tool returns few.
WORK=${WORK:-/tmp/token2wav}; mkdir -p "$WORK"
STAGE=${STAGE:-all}
STAGES=${STAGES:-estimator,hift}
DEFAULT=${COMPILED_DIR:-/tmp/cv2full-compiled}
export PRECISION=${PRECISION:-bf16} MAX_BATCH=${MAX_BATCH:-512} PY
ALLOWED=" PRECISION LAYOUT MISH QKV FF_GELU ATTENTION HIFT_CHANNEL_MULTIPLE HIFT_DILATION TUNING INDUCTOR_OPTIONS MAX_FRAMES MAX_BATCH CHECK STAGES FROM "
case $STAGE in all|compile|bench) ;; *) log "STAGE=$STAGE: all, compile or bench"; exit 2 ;; esac

# name_of SPEC / settings_of SPEC: a variant's name and its KEY=VALUE settings, one a line.
name_of() { echo "${1%%:*}"; }
settings_of() { [ "${1#*:}" != "$1" ] && echo "${1#*:}" | tr '+' '\n'; }
for spec in ${VARIANTS:-}; do
  name=$(name_of "$spec")
  [[ "$name" =~ ^[a-z0-9-]+$ ]] || { log "variant name '$name': lower-case letters, digits and '-' only"; exit 2; }
  while read -r kv; do
    [ -z "$kv" ] && continue
    case "$ALLOWED" in *" ${kv%%=*} "*) ;; *) log "variant $name: unknown setting '${kv%%=*}' (one of:$ALLOWED)"; exit 2 ;; esac
  done < <(settings_of "$spec")
done

install_wheels
use_libtorch
unpack_voxbatch
source "$DEVICE_DIR/lib/cv2full.sh"
build_cv2full token2wav

# compile_packages DIR STAGES: tools/compile_token2wav.py for this GPU into DIR/compiled, with the
# compile settings of the environment. Run in a process of its own (timeout), hence exported.
compile_packages() {
  local dir=$1 stages=$2 o
  echo "compiling $stages into $dir (flow $PRECISION)"
  # shellcheck disable=SC2046
  $PY tools/compile_token2wav.py --model "$dir" --device cuda:0 --stages "$stages" --precision "$PRECISION" \
    ${ATTENTION:+--attention "$ATTENTION"} ${LAYOUT:+--layout "$LAYOUT"} ${FF_GELU:+--ff-gelu "$FF_GELU"} ${MISH:+--mish "$MISH"} \
    ${QKV:+--qkv "$QKV"} ${HIFT_CHANNEL_MULTIPLE:+--hift-channel-multiple "$HIFT_CHANNEL_MULTIPLE"} \
    ${HIFT_DILATION:+--hift-dilation "$HIFT_DILATION"} --tuning "${TUNING:-none}" --max-frames "${MAX_FRAMES:-1500}" \
    $(for o in ${INDUCTOR_OPTIONS:-}; do printf -- '--inductor-option %s ' "$o"; done) \
    --max-batch "$MAX_BATCH" ${CHECK:+--check} 2>&1 | grep --line-buffered -v -i "warn\|deprecat\|__new__"
  return "${PIPESTATUS[0]}"
}
export -f compile_packages

# link_missing FROM TO: TO's compiled/ gets FROM's own package (not one FROM links to) for each
# stage and key it lacks.
link_missing() {
  local f rel
  for f in "$1"/compiled/*/*.pt2; do
    [ -f "$f" ] && [ ! -L "$f" ] || continue
    rel=${f#"$1"/}
    [ -e "$2/$rel" ] || { mkdir -p "$(dirname "$2/$rel")"; ln -sfn "$(readlink -f "$f")" "$2/$rel"; }
  done
}
# own_packages DIR: how many packages DIR holds itself (not links).
own_packages() { find "$1/compiled" -mindepth 2 -maxdepth 2 -name '*.pt2' -type f 2>/dev/null | wc -l; }

if [ "$STAGE" != bench ] && [ "$STAGES" != none ]; then
  LIMIT=${COMPILE_LIMIT:-540}; SECONDS=0
  left() { echo $((LIMIT - SECONDS > 10 ? LIMIT - SECONDS : 10)); }
  rm -f "$WORK"/compile-*.log
  # compile_in NAME DIR [SETTING...]: one compile process, its log WORK/compile-NAME.log.
  compile_in() {
    local name=$1 dir=$2; shift 2
    mkdir -p "$dir"; link_model "$dir"
    (env "$@" timeout -k 10 "$(left)" bash -c 'compile_packages "$1" "$STAGES"' _ "$dir" > "$WORK/compile-$name.log" 2>&1
     echo "compile $name rc=$?" >> "$WORK/compile-$name.log") &
    pids="$pids $!"
  }
  pids=
  log "compiling the default packages ($STAGES, a process each) into $DEFAULT"
  for stage in ${STAGES//,/ }; do compile_in "default-$stage" "$DEFAULT" STAGES="$stage"; done
  for spec in ${VARIANTS:-}; do
    name=$(name_of "$spec"); settings=$(settings_of "$spec")
    echo "$settings" | grep -q '^FROM=' && continue
    log "compiling variant $name: $(echo $settings)"
    rm -rf "/tmp/cv2full-$name/compiled"
    # shellcheck disable=SC2086
    compile_in "$name" "/tmp/cv2full-$name" STAGES=estimator $settings
  done
  # shellcheck disable=SC2086
  wait $pids
  for f in "$WORK"/compile-*.log; do echo "== $(basename "$f")"; grep -v -e "^Looking" "$f" | cut -c1-400; done > "$OUT/variants-compile.log"
  grep -h -E "rc=|compile_seconds|max_abs" "$WORK"/compile-*.log | cut -c1-300
fi
[ "$STAGE" = compile ] && { log "compile stage done"; exit 0; }

# EAGER_ATTENTION="packed flash": one more directory per value, the eager model with that
# `flow_attention` (packed: the estimator's transformer levels on valid frames only, FlashAttention
# varlen; flash: the padded batch through FlashAttention with each item's key count).
EAGER_ATTENTION=${EAGER_ATTENTION:-${PACKED:+packed}}
ATTENTION_DIRS=
for a in $EAGER_ATTENTION; do
  D=/tmp/cv2full-$a; mkdir -p "$D"
  for f in "$M"/model/*; do case "$(basename "$f")" in compiled|model.toml) ;; *) ln -sfn "$f" "$D/" ;; esac; done
  sed "s/^\[cosyvoice2\]\$/[cosyvoice2]\nflow_attention = \"$a\"/" "$M/model/model.toml" > "$D/model.toml"
  grep -q "^flow_attention = \"$a\"" "$D/model.toml" || { log "could not set flow_attention in $D/model.toml"; exit 1; }
  ATTENTION_DIRS="$ATTENTION_DIRS $D"
done

# bench_round DIR_OUT BATCHES COMPILED GRAPHS ENTRY...: `voxbatch bench token2wav` of each entry
# (a directory, or DIR:MODE, a mode being cudnn-benchmark, cudnn-attention, flow-graphs or
# heuristic-b), then the round's extras for COMPILED (the environment's EAGER_ATTENTION,
# CUDNN_BENCHMARK, CUDNN_ATTENTION, CUDNN_HEURISTIC_B, and FLOW_GRAPHS when GRAPHS is 1). voxbatch
# runs as the Dockerfile and the systemd unit run the worker (VOXBATCH_ENV, lib/common.sh). Each bench's whole output in DIR_OUT/NAME.full.log (a failure's
# message, whatever the process printed before an abort), its summary lines in DIR_OUT/NAME.log.
bench_round() {
  local dir_out=$1 batches=$2 compiled=$3 graphs=$4; shift 4
  local entries="$* $ATTENTION_DIRS" entry d flag name run_env rc
  mkdir -p "$dir_out"
  [ -n "${CUDNN_BENCHMARK:-}" ] && entries="$entries $compiled:cudnn-benchmark"
  [ -n "${CUDNN_ATTENTION:-}" ] && entries="$entries $compiled:cudnn-attention"
  [ -n "${FLOW_GRAPHS:-}" ] && [ "$graphs" = 1 ] && entries="$entries $compiled:flow-graphs"
  [ -n "${CUDNN_HEURISTIC_B:-}" ] && entries="$entries $compiled:heuristic-b"
  for entry in $entries; do
    d=${entry%%:*}; flag=; name=$(basename "$d"); run_env=
    [ "$d" != "$M/model" ] && [ -d "$d/compiled" ] && link_model "$d"
    [ "$entry" != "$d" ] && { flag=--${entry#*:}; name=$name-${entry#*:}; }
    [ "$flag" = --flow-graphs ] && flag="--flow-graphs $FLOW_GRAPHS ${FLOW_GRAPH_MAX_FRAMES:+--flow-graph-max-frames $FLOW_GRAPH_MAX_FRAMES}"
    # (libtorch reads TORCH_CUDNN_USE_HEURISTIC_MODE_B once, at its first convolution.)
    [ "$flag" = --heuristic-b ] && { flag=; run_env=TORCH_CUDNN_USE_HEURISTIC_MODE_B=1; }
    log "bench token2wav: $name"
    # shellcheck disable=SC2086
    env $VOXBATCH_ENV $run_env RUST_LOG=voxbatch=info $BIN bench token2wav --model "$d" --device cuda:0 --batches "$batches" \
      --precisions "${PRECISIONS:-$PRECISION}" --utterance-seconds "${UTTERANCE_SECONDS:-10}" ${VOCODERS:+--vocoders "$VOCODERS"} \
      --repeats "${REPEATS:-3}" $flag ${PROFILE:+--profile} --out "$dir_out/$name" > "$dir_out/$name.full.log" 2>&1
    rc=$?
    grep -E "audio-s/s|compiled|eager|failed|^\| " "$dir_out/$name.full.log" | tee "$dir_out/$name.log"
    [ $rc = 0 ] || { log "bench exited $rc; its last lines:"; tail -25 "$dir_out/$name.full.log" | sed "s/^/[$TARGET tail] /"; }
    # DIAGNOSE=1: a failed run again with synchronous launches, so the failing kernel is the one named.
    if [ -n "${DIAGNOSE:-}" ] && { [ $rc != 0 ] || grep -q "failed" "$dir_out/$name.log"; }; then
      log "again with CUDA_LAUNCH_BLOCKING=1 (batches ${DIAGNOSE_BATCHES:-128}, one repeat)"
      CUDA_LAUNCH_BLOCKING=1 TORCH_SHOW_CPP_STACKTRACES=1 RUST_LOG=voxbatch=debug $BIN bench token2wav --model "$d" --device cuda:0 \
        --batches "${DIAGNOSE_BATCHES:-128}" --precisions "${PRECISIONS:-$PRECISION}" ${VOCODERS:+--vocoders "$VOCODERS"} --repeats 1 \
        --out "$dir_out/$name-blocking" > "$dir_out/$name-blocking.full.log" 2>&1
      log "exit $?; its last lines:"; tail -40 "$dir_out/$name-blocking.full.log"
    fi
  done
}
VOCODERS=${VOCODERS-tf32}; PROFILE=${PROFILE-1}; BATCHES=${BATCHES:-128}

# Every variant directory: its own packages, then the ones it names with FROM, then the default's.
DIRS=
[ "$(own_packages "$DEFAULT")" != 0 ] && DIRS=$DEFAULT
for spec in ${VARIANTS:-}; do
  name=$(name_of "$spec"); V=/tmp/cv2full-$name; mkdir -p "$V"
  for from in $(settings_of "$spec" | sed -n 's/^FROM=//p'); do link_missing "/tmp/cv2full-$from" "$V"; done
  # A variant whose compile did not finish would be the default's packages again: not benched.
  if [ "$(own_packages "$V")" = 0 ] && ! find "$V/compiled" -mindepth 2 -maxdepth 2 -name '*.pt2' -type l 2>/dev/null | grep -q .; then
    log "variant $name has no packages of its own (its compile failed or did not finish): not benched"; continue
  fi
  link_missing "$DEFAULT" "$V"
  DIRS="$DIRS $V"
done
[ "${EAGER:-1}" = 1 ] && DIRS="$M/model $DIRS"
DIRS=${BENCH_DIRS:-$DIRS}
rm -rf "$WORK/bench" "$WORK/sweet"
log "bench at batches $BATCHES: $DIRS"
# shellcheck disable=SC2086
bench_round "$WORK/bench" "$BATCHES" "$DEFAULT" "$([ -z "${SWEET:-}" ] && echo 1)" $DIRS 2>&1 | grep -E "audio-s/s|^\[$TARGET|exited"
# The fastest compiled directory at the largest batch benched.
largest=$(echo "$BATCHES" | tr ',' '\n' | sort -n | tail -1)
best=; best_rate=0
for d in $DIRS; do
  [ "$d" = "$M/model" ] && continue
  rate=$(grep -h "batch $largest: " "$WORK/bench/$(basename "$d").log" 2>/dev/null | sed -n 's/.*: \([0-9.]*\) audio-s\/s.*/\1/p' | head -1)
  [ -n "$rate" ] && awk -v a="$rate" -v b="$best_rate" 'BEGIN { exit !(a > b) }' && { best=$d; best_rate=$rate; }
done
log "fastest at batch $largest: ${best:-none} ($best_rate audio-s/s)"
echo "$best" > "$WORK/fastest"  # (for a later step of the same call)
if [ -n "${SWEET:-}" ] && [ -n "$best" ]; then
  log "sweet spot: $(basename "$best") at batches $SWEET"
  PROFILE= bench_round "$WORK/sweet" "$SWEET" "$best" 1 "$best" 2>&1 | grep -E "audio-s/s|^\| bf16|^\| fp16|exited"
fi
# The benches' logs go to OUT before the reference runs: a call cut off during it keeps them.
# (The .log files hold each bench's summary lines: which packages ran, the tables and profiles;
# the .full.log files beside them stay on the machine.)
for f in "$WORK"/bench/*.log "$WORK"/sweet/*.log; do
  case "$f" in *.full.log) continue ;; esac
  [ -e "$f" ] && { echo "== $f"; cut -c1-400 "$f"; }
done > "$OUT/variants-bench.log"
for f in "$WORK"/bench/*/token2wav-*/token2wav.json "$WORK"/sweet/*/token2wav-*/token2wav.json; do
  [ -e "$f" ] && $PY -c 'import json, sys; d = json.load(open(sys.argv[1])); d["file"] = sys.argv[1]; print(json.dumps(d))' "$f"
done > "$OUT/variants-token2wav.jsonl"
if [ "${REFERENCE:-1}" = 1 ]; then
  log "reference token2wav (official code path, batch 1: flow ${REF_PRECISIONS:-fp16,bf16} autocast, HiFT outside it)"
  $PY tools/bench_reference_token2wav.py --official "$M/official" --precisions "${REF_PRECISIONS:-fp16,bf16}" \
    --repeats "${REPEATS:-3}" --out "$OUT/reference.json" 2>&1 | grep -v -i warn
fi
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
log "done"
