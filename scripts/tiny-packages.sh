#!/usr/bin/env bash
# The tiny models' token2wav stages compiled for this CPU (AOTInductor), each in a directory of its
# own (links to the model's files): tests/integration/compiled.rs and cosyvoice3_compiled.rs compare
# them with the eager port and check that a broken or mismatched package falls back to eager. The
# plain tiny models stay eager. Each is skipped when its package is newer than this script, the
# compile tool and the model's weights.
#   models/cosyvoice2-tiny-compiled: the flow encoder and estimator and the vocoder body, ≈ 2 minutes
#   models/cosyvoice3-tiny-compiled: the DiT and the vocoder body (`--family cosyvoice3`, ≈ 1 minute:
#     small limits, 256 frames and 16 rows, what the tests run)
# Three compiles run side by side (each is mostly one Python thread's lowering): the CosyVoice2
# encoder alone (its 512-wide layers make it the longest stage), its estimator and vocoder body,
# and CosyVoice3's two, so that no one of them runs on alone at the end (2026-12-07: with the
# CosyVoice2 stages in one process, that process ended 15-40 s after the rest). `bootstrap.sh test`
# runs this beside the test build, after it has made the tiny models.
# Their C++ kernels are scalar (`cpp.simdlen=1`, recorded in each package's metadata): what the
# tests check is the tool's export, packaging and metadata and the package's numbers against the
# eager port, not a CPU's vector code (a GPU's packages are Triton's), and inductor's vectorising
# code generation was a fifth of the compile — 200 CPU-s for the five stages with it, 159 without
# (2026-12-07, docs/PERFORMANCE.md#build-times).
set -euo pipefail
cd "$(dirname "$0")/.."
log() { printf '[tiny-packages %s] %s\n' "$(date -u +%T)" "$*" >&2; }
KEY=cpu-torch2.11.0-fp32

# stale PACKAGE WEIGHTS: whether PACKAGE is missing or older than this script, the compile tool or WEIGHTS.
stale() {
  [ ! -f "$1" ] || [ scripts/tiny-packages.sh -nt "$1" ] || [ tools/compile_token2wav.py -nt "$1" ] || [ -n "$(find tools/compile -name '*.py' -newer "$1")" ] || [ "$2" -nt "$1" ]
}
# linked MODEL: models/MODEL-compiled made, with links to models/MODEL's files (before the
# compiles start: two of them share the directory).
linked() {
  mkdir -p "models/$1-compiled"
  for f in "models/$1"/*; do ln -sfn "../$1/$(basename "$f")" "models/$1-compiled/"; done
}
# compile MODEL LOG ARGS...: MODEL's packages into models/MODEL-compiled, the tool's output in .run/LOG.log.
compile() {
  local model=$1 name=$2; shift 2
  .venv/bin/python tools/compile_token2wav.py --model "models/$model-compiled" --device cpu --precision fp32 \
    --inductor-option cpp.simdlen=1 "$@" \
    > ".run/$name.log" 2>&1 || { log "compiling $model's stages failed (a C++ compiler is needed): .run/$name.log"; return 1; }
}

mkdir -p .run
pids=()
CV2=models/cosyvoice2-tiny-compiled/compiled/$KEY
if stale "$CV2/encoder.pt2" models/cosyvoice2-tiny/token2wav.safetensors \
   || stale "$CV2/hift.pt2" models/cosyvoice2-tiny/token2wav.safetensors; then
  log "compiling the tiny CosyVoice2's flow encoder, and its estimator and vocoder body (AOTInductor, CPU)"
  linked cosyvoice2-tiny
  compile cosyvoice2-tiny cosyvoice2-tiny-compile-encoder --stages encoder --max-frames 600 --max-batch 64 &
  pids+=($!)
  compile cosyvoice2-tiny cosyvoice2-tiny-compile --stages estimator,hift --max-frames 600 --max-batch 64 &
  pids+=($!)
fi
if stale "models/cosyvoice3-tiny-compiled/compiled/$KEY/hift.pt2" models/cosyvoice3-tiny/token2wav.safetensors; then
  log "compiling the tiny CosyVoice3's DiT and vocoder body (AOTInductor, CPU)"
  linked cosyvoice3-tiny
  compile cosyvoice3-tiny cosyvoice3-tiny-compile --family cosyvoice3 --max-frames 256 --max-batch 16 &
  pids+=($!)
fi
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
[ ${#pids[@]} -eq 0 ] || [ $status -ne 0 ] || log "done"
exit $status
