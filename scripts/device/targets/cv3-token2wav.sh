# cv3-token2wav: issue 43's CosyVoice3 token2wav on one GPU — a full-size random Fun-CosyVoice3-0.5B
# token2wav (the DiT flow, 22 layers of 1024, and the causal HiFT) built with the reference classes
# (tools/make_cv3_fixtures.py --config full --no-fixtures, seed 1234: the same weights on every machine)
# and converted (tools/convert_cosyvoice.py, kind cosyvoice3-token2wav), then `voxbatch bench
# token2wav` of the eager port at BATCHES for each PRECISIONS × VOCODERS, the compiled packages when
# COMPILE is set (tools/compile_token2wav.py --family cosyvoice3), and the reference token2wav at batch 1 the way
# CosyVoice3Model.token2wav runs it (flow and HiFT under fp16 autocast, or fp32) — same weights, same
# call. Random weights: nothing speaks; the figures are speed and memory.
# TEXT=1 (issue 44): the model is a whole Fun-CosyVoice3-0.5B-shaped one, kind cosyvoice3 — the same
#   token2wav weights, plus a full-size random LM (tools/make_cv3_llm_fixtures.py --full, seed 4343), the
#   stand-in tokenizer and the wetext grammars — what text-e2e.sh FAMILY=cosyvoice3 then runs on the warm
#   machine (with the packages COMPILE=1 leaves in /tmp/cv3full-compiled).
#   REF_LLM=1 with it: the reference CosyVoice3LM.inference at batch 1 on the same LM weights.
# Carry: .whl .cv3 .t2w/voxbatch.xz (pack.sh wheels cv3 binaries).
# Env: STAGE (all | model | bench), TEXT, BATCHES (1,64,128,256), PRECISIONS (bf16), VOCODERS (fp16,bf16:
#   the vocoder's precision; upstream's is the flow's autocast, fp16), UTTERANCE_SECONDS (10), REPEATS (3),
#   PROFILE (1: the largest batch once under libtorch's profiler), REFERENCE (1), REF_PRECISIONS
#   (fp16,fp32), COMPILE (unset; set: compile the packages into /tmp/cv3full-compiled and bench them
#   too; the DiT's compile time on a GPU is not yet known: on a fresh machine run STAGE=model, then
#   STAGE=bench COMPILE=1 as a second call on the warm machine), COMPILE_STAGES (estimator,hift: those
#   not yet in /tmp/cv3full-compiled; each compiles in a process of its own, side by side),
#   EXTRA_VOCODERS (e.g. fp16: the vocoder's package at these precisions too, each benched from a
#   directory /tmp/cv3full-compiled-vocoder-P whose model.toml names it, with --vocoders P),
#   COMPILE_LIMIT (420 s), COMPILE_DEADLINE (epoch seconds: the limit
#   is what is left until then — a call that builds the model first), BENCH (1; 0: no bench and no reference,
#   e.g. a call that only compiles or calibrates), EAGER (1; 0: bench the compiled directory alone),
#   PRECISION (bf16: both packages' unless model.toml names the vocoder's), MAX_BATCH (512 rows: CFG doubles a batch),
#   MAX_FRAMES (1000), CHECK (set: each package against the eager module after compiling; on an
#   H100 the estimator's check crashed loading it in Python, signal 11, while the worker's C++ loader
#   serves it), CALIBRATE (set: `voxbatch calibrate` of the compiled directory, else the eager one;
#   CAL_MAX_BATCH 256, CAL_MAX_TOKENS 512, CAL_SECONDS 120), PY.
# First run on an H100 on 2026-12-06 (docs/PERFORMANCE.md#2026-12-06-h100b): the DiT compiled in
# 174.5 s, the vocoder body in 121.9 s; run STAGE=model then STAGE=bench COMPILE=1 on one warm machine.
# Output: OUT/gpu.txt, build.log, bench-<name>.log (summary lines and profile tables), bench JSON
#   files, reference.json, calibrate.log and calibration/ (CALIBRATE).
M3=/tmp/cv3full
STAGE=${STAGE:-all}
case $STAGE in all|model|bench) ;; *) log "STAGE=$STAGE: all, model or bench"; exit 2 ;; esac
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
use_libtorch
if [ -n "${TEXT:-}" ]; then install_wheels llm; else install_wheels; fi
SNAP=/tmp/cv3-reference/CosyVoice
CV3_SITE=/tmp/cv3-site
if [ ! -d "$SNAP/cosyvoice" ]; then
  [ -f .cv3/reference.tar.xz ] || { log "no .cv3/reference.tar.xz (scripts/device/pack.sh cv3 here, then carry .cv3)"; exit 1; }
  mkdir -p /tmp/cv3-reference && tar -C /tmp/cv3-reference -xJf .cv3/reference.tar.xz
fi
rm -rf "$CV3_SITE"; pip_into "$CV3_SITE" .cv3/wheels/*.whl || exit 1

NEED=token2wav.safetensors; [ -n "${TEXT:-}" ] && NEED=llm.safetensors
if [ "$STAGE" != bench ] && [ ! -f "$M3/model/$NEED" ]; then
  log "building the full-size random CosyVoice3 ${TEXT:+(with its LM) }(reference classes) and converting it"
  # (The tokenizer's conversion needs transformers 4.x: the LLM site's.)
  { $PY tools/make_cv3_fixtures.py --snapshot "$SNAP" --site "$CV3_SITE" --config full --no-fixtures --out "$M3" \
      && if [ -n "${TEXT:-}" ]; then $LLM_PY tools/make_cv3_llm_fixtures.py --full --out "$M3"; fi \
      && ${LLM_PY:-$PY} tools/convert_cosyvoice.py "$M3/official" "$M3/model" --name cosyvoice3-full-random --noise-seconds 60; } \
    > "$OUT/build.log" 2>&1 || { log "build failed:"; tail -20 "$OUT/build.log"; exit 1; }
  tail -2 "$OUT/build.log"
  grep '^kind' "$M3/model/model.toml"
fi
# REF_LLM=1 (with TEXT=1): the reference's LM at batch 1, `CosyVoice3LM.inference` on the same LM
# weights (tools/bench_llm_reference.py --family cosyvoice3, fp32, REF_SEQUENCES sequences).
if [ -n "${TEXT:-}" ] && [ -n "${REF_LLM:-}" ]; then
  log "reference CosyVoice3LM.inference, batch 1, fp32, same LM weights"
  env PYTHONPATH="$LLM_SITE:$CV3_SITE:$PYTHONPATH" $PY tools/bench_llm_reference.py --family cosyvoice3 --snapshot "$SNAP" \
    --official "$M3/official" --device cuda:0 --precision fp32 --sequences "${REF_SEQUENCES:-3}" --out "$OUT/reference-llm.json" 2>&1 \
    | grep -v -i warn | tail -2
fi
[ "$STAGE" = model ] && exit 0

unpack_voxbatch
DIRS=$M3/model; [ "${EAGER:-1}" = 1 ] || DIRS=""; PROFILE=${PROFILE-1}; COMPILE_STAGES=${COMPILE_STAGES:-estimator,hift}
if [ -n "${COMPILE:-}" ]; then
  C=/tmp/cv3full-compiled
  mkdir -p "$C"; for f in "$M3"/model/*; do ln -sfn "$f" "$C/"; done
  # Only the stages not yet compiled on this machine: COMPILE_STAGES=estimator in one call and
  # COMPILE_STAGES=hift in the next keep each call inside the device's 600 s.
  todo=""
  for stage in ${COMPILE_STAGES//,/ }; do
    ls "$C"/compiled/*/"$stage.pt2" > /dev/null 2>&1 || todo="$todo $stage"
  done
  # EXTRA_VOCODERS: the vocoder's package at each of these precisions too (e.g. fp16, upstream's),
  # filed under its own key beside the flow's; each gets a directory of its own whose model.toml
  # names it (`[cosyvoice3] vocoder_precision`), which the bench runs with `--vocoders` at it.
  extra=""
  for vp in ${EXTRA_VOCODERS//,/ }; do
    ls "$C"/compiled/*-"$vp"/hift.pt2 > /dev/null 2>&1 || extra="$extra $vp"
  done
  limit=${COMPILE_LIMIT:-420}
  [ -n "${COMPILE_DEADLINE:-}" ] && limit=$(( COMPILE_DEADLINE - $(date +%s) ))
  if [ -n "$todo$extra" ] && [ "$limit" -gt 0 ]; then
    # One process per package, side by side (each is mostly one Python thread of Inductor's
    # lowering): the vocoder's wait behind the DiT's no longer.
    log "compiling the packages (${todo# }${extra:+; vocoder at$extra}; limit $limit s)"
    compile_package() { # NAME ARGS...: one package in the background, its log /tmp/cv3-compile-NAME.log
      local name=$1; shift
      (timeout -k 10 "$limit" $PY tools/compile_token2wav.py --family cosyvoice3 --model "$C" --device cuda:0 \
        --precision "${PRECISION:-bf16}" --max-batch "${MAX_BATCH:-512}" --max-frames "${MAX_FRAMES:-1000}" ${CHECK:+--check} "$@" \
        > "/tmp/cv3-compile-$name.log" 2>&1; echo "compile $name exited $?" >> "/tmp/cv3-compile-$name.log") &
    }
    for stage in $todo; do compile_package "$stage" --stages "$stage"; done
    for vp in $extra; do compile_package "hift-$vp" --stages hift --vocoder-precision "$vp"; done
    wait
    for f in /tmp/cv3-compile-*.log; do tail -3 "$f"; cat "$f" >> "$OUT/compile.log"; done; rm -f /tmp/cv3-compile-*.log
  fi
  ls "$C"/compiled/*/ 2>/dev/null && DIRS="$DIRS $C"
  for vp in ${EXTRA_VOCODERS//,/ }; do
    ls "$C"/compiled/*-"$vp"/hift.pt2 > /dev/null 2>&1 || { log "no $vp vocoder package: not benched"; continue; }
    V=$C-vocoder-$vp; rm -rf "$V"; mkdir -p "$V"
    for f in "$C"/*; do [ "$(basename "$f")" = model.toml ] || ln -sfn "$(readlink -f "$f")" "$V/"; done
    # model.toml a copy naming the vocoder's precision (the key goes under [cosyvoice3]).
    sed -e '/^vocoder_precision = /d' -e "/^\[cosyvoice3\]/a vocoder_precision = \"$vp\"" "$(readlink -f "$C/model.toml")" > "$V/model.toml"
    grep -q "^vocoder_precision = \"$vp\"" "$V/model.toml" || { log "$V/model.toml: no [cosyvoice3] table"; continue; }
    VDIRS="${VDIRS:-} $V:$vp"
  done
fi
[ "${BENCH:-1}" = 1 ] || { DIRS=""; VDIRS=""; }

for entry in $DIRS ${VDIRS:-}; do
  d=${entry%%:*}; vocoders=${VOCODERS:-fp16,bf16}; [ "$entry" != "$d" ] && vocoders=${entry#*:}
  name=$(basename "$d")
  log "bench token2wav: $name"
  RUST_LOG=voxbatch=info $BIN bench token2wav --model "$d" --device cuda:0 --batches "${BATCHES:-1,64,128,256}" \
    --precisions "${PRECISIONS:-bf16}" --vocoders "$vocoders" --utterance-seconds "${UTTERANCE_SECONDS:-10}" \
    --repeats "${REPEATS:-3}" ${PROFILE:+--profile} --out "$OUT/bench-$name" > "$OUT/bench-$name.full.log" 2>&1
  rc=$?
  grep -E "audio-s/s|compiled|eager|failed|peak|^\| " "$OUT/bench-$name.full.log" | tee "$OUT/bench-$name.log"
  [ $rc = 0 ] || { log "bench exited $rc; its last lines:"; tail -25 "$OUT/bench-$name.full.log"; }
done

# CALIBRATE=1: `voxbatch calibrate` of the compiled directory (else the eager one), the memory
# profile issue 43 asks for, written under OUT/calibration.
if [ -n "${CALIBRATE:-}" ]; then
  C=/tmp/cv3full-compiled; ls "$C"/compiled/*/estimator.pt2 > /dev/null 2>&1 || C=$M3/model
  log "calibrate $C"
  VOXBATCH_MEMORY__CALIBRATION_DIR=$OUT/calibration RUST_LOG=voxbatch=info $BIN calibrate --model "$C" --device cuda:0 \
    --precision "${PRECISION:-bf16}" --no-db --max-batch "${CAL_MAX_BATCH:-256}" --max-tokens "${CAL_MAX_TOKENS:-512}" \
    --max-seconds "${CAL_SECONDS:-120}" > "$OUT/calibrate.log" 2>&1
  log "calibrate exited $?"; grep -v " INFO " "$OUT/calibrate.log" | tail -6
fi

if [ "${REFERENCE:-1}" = 1 ] && [ "${BENCH:-1}" = 1 ]; then
  log "reference token2wav at batch 1 (CosyVoice3Model.token2wav's way)"
  $PY tools/bench_reference_token2wav.py --family cosyvoice3 --snapshot "$SNAP" --site "$CV3_SITE" --official "$M3/official" \
    --seconds "${UTTERANCE_SECONDS:-10}" --precisions "${REF_PRECISIONS:-fp16,fp32}" --out "$OUT/reference.json" 2>&1 \
    | grep -v -i warn | tail -4
fi
