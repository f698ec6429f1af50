#!/usr/bin/env bash
# Issue 16's candidate packages side by side on one warm GPU machine, through compiled-bench.sh:
# STAGE=compile compiles the default packages (estimator and vocoder body; OTHER_STAGES=encoder,hift adds the encoder, slower than the eager one in session 19, /tmp/cv2full-compiled)
# and, once the full model is built, every variant into its own directory (/tmp/cv2full-NAME), all
# at once; each variant directory then holds the default's package for any stage it did not compile.
# STAGE=bench benches the eager model (EAGER=1), the default directory and every variant that
# compiled, at BATCHES with PROFILE, then the fastest of them again at SWEET's batches, and the
# reference token2wav (REFERENCE=1: the official code path at batch 1, flow fp16 and bf16 autocast,
# HiFT outside it with torch's default TF32) — all in one call, as docs/PERFORMANCE.md's tables need.
# STAGE=all does both (a fresh machine; over 6 minutes). The shortest call for the default
# packages (session 19's candidate, now the tool's defaults): no VARIANTS, e.g. `STAGE=all
# COMPILE_LIMIT=330 SWEET=256 REFERENCE=1` (on an H200 in session 19: compiles 187 s and 115 s at
# once, the whole call 412 s with parity-gpu.sh beside the compiles; on an H100 host in session 18
# the compiles did not finish within 250 s). A variant's settings in the environment instead
# (e.g. MISH=exact) are inherited by the default's two compiles.
#
# Env: VARIANTS — space-separated NAME:KEY=VALUE+KEY=VALUE…, the keys compiled-bench.sh's compile
# settings (LAYOUT, MISH, QKV, FF_GELU, ATTENTION, HIFT_CHANNEL_MULTIPLE, HIFT_DILATION, TUNING, INDUCTOR_OPTIONS — one
# KEY=VALUE, e.g. INDUCTOR_OPTIONS=estimator:freezing=False, after the tool's default estimator:freezing=True —, STAGES — default estimator; a variant of the vocoder
# alone says STAGES=hift), e.g.
#   VARIANTS="strided-exp:LAYOUT=time-major-strided+MISH=exp hift4:STAGES=hift+HIFT_CHANNEL_MULTIPLE=4"
# and a variant may name another's packages with FROM=NAME (the union of two, no compile of its own:
# "both:FROM=strided-exp+FROM=hift4"). Also STAGE (all | compile | bench), EAGER (1), SWEET (e.g.
# 192,256; empty: none), FLOW_GRAPHS and FLOW_GRAPH_MAX_FRAMES (the sweet spot once more with flow
# steps as CUDA graphs, compiled-bench.sh's), REFERENCE (0), BATCHES (128), REPEATS (3), PROFILE (1), UTTERANCE_SECONDS,
# MAX_BATCH (512: the packages' largest batch, which must be at least twice the largest batch
# benched), COMPILE_LIMIT (540: seconds every compile may take, counted from the stage's start),
# OUT, PY. Logs: everything under WORK (/tmp/variants); OUT gets variants-compile.log,
# variants-bench.log (each bench's summary lines and profile tables), variants-token2wav.jsonl (each
# bench's JSON, one a line) and reference.json — few files, as the device tool returns few.
# Carry: .whl .t2w (pack-gpu.sh).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/variants-out}; mkdir -p "$OUT"
WORK=${WORK:-/tmp/variants}; mkdir -p "$WORK"
PY=${PY:-python3}; export PY
log() { echo "[variants $(date -u +%T)] $*"; }
BENCH=${BENCH:-scripts/device/compiled-bench.sh}  # (another script only to try this one without a GPU)
M=/tmp/cv2full
DEFAULT=/tmp/cv2full-compiled
STAGE=${STAGE:-all}
# Every package takes batches of up to 512 rows: the flow's classifier-free guidance doubles a
# batch, and a batch past a package's limit runs eager — SWEET=256 must not measure the eager port.
export MAX_BATCH=${MAX_BATCH:-512}
ALLOWED=" LAYOUT MISH QKV FF_GELU ATTENTION HIFT_CHANNEL_MULTIPLE HIFT_DILATION TUNING INDUCTOR_OPTIONS STAGES FROM "

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

# link_missing FROM TO: TO's compiled/ gets FROM's own package (not one FROM links to) for each
# stage and key it lacks.
link_missing() {
  for f in "$1"/compiled/*/*.pt2; do
    [ -f "$f" ] && [ ! -L "$f" ] || continue
    rel=${f#"$1"/}
    [ -e "$2/$rel" ] || { mkdir -p "$(dirname "$2/$rel")"; ln -sfn "$(readlink -f "$f")" "$2/$rel"; }
  done
}

if [ "$STAGE" != bench ]; then
  # The default's estimator in one process, its vocoder body (OTHER_STAGES) in another (started with
  # the variants): the estimator's compile is the longest, so nothing waits behind it.
  # Every compile stops at COMPILE_LIMIT seconds from here (default 540: the device tool's calls end
  # at 600 s, and a call cut off there loses the stage's summary): a compile cut short says so in
  # its log (rc=124) and its variant is not benched.
  LIMIT=${COMPILE_LIMIT:-540}; SECONDS=0
  left() { echo $((LIMIT - SECONDS > 10 ? LIMIT - SECONDS : 10)); }
  log "compiling the default packages"
  (OUT=$WORK/default STAGES=estimator STAGE=compile timeout -k 10 "$(left)" bash "$BENCH" > "$WORK/compile-default.log" 2>&1
   echo "compile default rc=$?" >> "$WORK/compile-default.log") &
  pids="$!"
  # The variants start once the default's run has built the model (its compile has begun).
  for _ in $(seq 300); do
    grep -q "compiling" "$WORK/compile-default.log" 2>/dev/null && break
    kill -0 "$pids" 2>/dev/null || { log "the default's compile ended before compiling:"; tail -5 "$WORK/compile-default.log"; exit 1; }
    sleep 2
  done
  (OUT=$WORK/default-other STAGES=${OTHER_STAGES:-hift} SITE=/tmp/site-default-other STAGE=compile timeout -k 10 "$(left)" bash "$BENCH" \
     > "$WORK/compile-default-other.log" 2>&1
   echo "compile default-other rc=$?" >> "$WORK/compile-default-other.log") &
  pids="$pids $!"
  for spec in ${VARIANTS:-}; do
    name=$(name_of "$spec"); settings=$(settings_of "$spec")
    echo "$settings" | grep -q '^FROM=' && continue
    log "compiling variant $name: $(echo $settings)"
    rm -rf "/tmp/cv2full-$name/compiled"
    (env STAGES=estimator $settings COMPILED_DIR="/tmp/cv2full-$name" SITE="/tmp/site-$name" OUT="$WORK/$name" STAGE=compile \
       timeout -k 10 "$(left)" bash "$BENCH" > "$WORK/compile-$name.log" 2>&1; echo "compile $name rc=$?" >> "$WORK/compile-$name.log") &
    pids="$pids $!"
  done
  wait $pids
  for f in "$WORK"/compile-*.log; do echo "== $(basename "$f")"; grep -v -e "^Looking" "$f" | cut -c1-400; done > "$OUT/variants-compile.log"
  grep -h -E "rc=|compile_seconds|max_abs" "$WORK"/compile-*.log | cut -c1-300
fi
[ "$STAGE" = compile ] && { log "compile stage done"; exit 0; }

# Every variant directory: its own packages, then the ones it names with FROM, then the default's.
DIRS=$DEFAULT
# own_packages DIR: how many packages DIR holds itself (not links).
own_packages() { find "$1/compiled" -mindepth 2 -maxdepth 2 -name '*.pt2' -type f 2>/dev/null | wc -l; }
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
log "bench at batches ${BATCHES:-128}: $DIRS"
OUT=$WORK/bench FLOW_GRAPHS= BENCH_DIRS="$DIRS" BATCHES=${BATCHES:-128} REPEATS=${REPEATS:-3} PROFILE=${PROFILE-1} STAGE=bench \
  bash "$BENCH" 2>&1 | grep -E "audio-s/s|^\[compiled|exited"
# The fastest compiled directory at the largest batch benched.
largest=$(echo "${BATCHES:-128}" | tr ',' '\n' | sort -n | tail -1)
best=; best_rate=0
for d in $DIRS; do
  [ "$d" = "$M/model" ] && continue
  rate=$(grep -h "batch $largest: " "$WORK/bench/$(basename "$d").log" 2>/dev/null | sed -n 's/.*: \([0-9.]*\) audio-s\/s.*/\1/p' | head -1)
  [ -n "$rate" ] && awk -v a="$rate" -v b="$best_rate" 'BEGIN { exit !(a > b) }' && { best=$d; best_rate=$rate; }
done
log "fastest at batch $largest: ${best:-none} ($best_rate audio-s/s)"
echo "$best" > "$WORK/fastest"  # (for a later step of the same call: e.g. compiled-calibrate.sh's COMPILED_DIR)
if [ -n "${SWEET:-}" ] && [ -n "$best" ]; then
  log "sweet spot: $(basename "$best") at batches $SWEET"
  # (FLOW_GRAPHS=N also runs it with every flow step replayed as a CUDA graph: compiled-bench.sh's
  # flow-graphs entry is COMPILED_DIR's; FLOW_GRAPH_MAX_FRAMES must cover rows × frames, e.g. 1000000.)
  OUT=$WORK/sweet COMPILED_DIR="$best" BENCH_DIRS="$best" BATCHES=$SWEET REPEATS=${REPEATS:-3} PROFILE= STAGE=bench \
    bash "$BENCH" 2>&1 | grep -E "audio-s/s|^\| bf16|^\| fp16|exited"
fi
# The benches' logs go to OUT before the reference runs: a call cut off during it keeps them.
# (The .log files hold compiled-bench.sh's summary lines: which packages ran with which variant,
# the tables and profiles; the .full.log files beside them stay on the machine.)
for f in "$WORK"/bench/*.log "$WORK"/sweet/*.log; do
  case "$f" in *.full.log) continue ;; esac
  [ -e "$f" ] && { echo "== $f"; cut -c1-400 "$f"; }
done > "$OUT/variants-bench.log"
for f in "$WORK"/bench/*/token2wav-*/token2wav.json "$WORK"/sweet/*/token2wav-*/token2wav.json; do
  [ -e "$f" ] && $PY -c 'import json, sys; d = json.load(open(sys.argv[1])); d["file"] = sys.argv[1]; print(json.dumps(d))' "$f"
done > "$OUT/variants-token2wav.jsonl"
if [ "${REFERENCE:-0}" = 1 ]; then
  log "reference token2wav (official code path, batch 1: flow fp16 and bf16 autocast, HiFT outside it)"
  PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} $PY tools/bench_reference_token2wav.py --official "$M/official" \
    --precisions fp16,bf16 --repeats 3 --out "$OUT/reference.json" 2>&1 | grep -v -i warn
fi
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
log "done"
