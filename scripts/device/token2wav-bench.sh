#!/usr/bin/env bash
# Issue 7's benchmark on the GPU machine: CosyVoice2 token2wav, `full` config, random weights,
# 10-second utterances. Builds the random model there from CosyVoice2's reference code (carried as
# wheels in .whl: token2wav-cosyvoice, diffusers, conformer, omegaconf, importlib_metadata), converts
# it, runs `voxbatch bench token2wav` (the tch port, batches 1..128, fp32/fp16/bf16) and the
# reference at batch 1 on the same weights (tools/bench_reference_token2wav.py).
# Needs the binary as .e2e/voxbatch.xz (scripts/device/pack-services.sh writes it) or .t2w/voxbatch.xz.
# Env: OUT, BATCHES (1,8,32,64,128), PRECISIONS (fp32,fp16,bf16: the flow's), VOCODERS (the HiFT's,
# e.g. tf32,fp32,bf16; default the model's vocoder_precision), REFERENCE (1; 0 skips the reference),
# REPEATS (3), PY (python3).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/t2w-out}; mkdir -p "$OUT"
PY=${PY:-python3}
log() { echo "[token2wav $(date -u +%T)] $*"; }
if [ -d .whl ]; then
  # Not the LLM reference's transformers pins (their huggingface_hub breaks diffusers): text-e2e.sh
  # installs those apart.
  rm -rf /tmp/site
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    $(ls .whl/*.whl | grep -v -e transformers- -e huggingface_hub- -e tokenizers-) || exit 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
source scripts/device/libtorch.sh
BIN_XZ=.e2e/voxbatch.xz; [ -f "$BIN_XZ" ] || BIN_XZ=.t2w/voxbatch.xz
source scripts/device/voxbatch-binary.sh
M=/tmp/cv2full
if [ ! -f "$M/model/token2wav.safetensors" ]; then
  log "building the full-size random model (reference code) and converting it"
  $PY tools/make_parity_fixtures.py --config full --no-fixtures --out "$M" 2>&1 | grep -v Warning | tail -2
  $PY tools/convert_cosyvoice.py "$M/official" "$M/model" --name cosyvoice2-full-random | tail -1
fi
[ "${REFERENCE:-1}" = 1 ] && log "reference (official code path, batch 1)" && $PY tools/bench_reference_token2wav.py --official "$M/official" --repeats "${REPEATS:-3}" --out "$OUT/reference.json" 2>&1 | grep -v -i warn
log "voxbatch bench token2wav"
$BIN bench token2wav --model "$M/model" --device cuda:0 --batches "${BATCHES:-1,8,32,64,128}" \
  --precisions "${PRECISIONS:-fp32,fp16,bf16}" ${VOCODERS:+--vocoders "$VOCODERS"} --repeats "${REPEATS:-3}" --out "$OUT/bench" 2>&1 | tee "$OUT/bench.log"
cp "$OUT"/bench/token2wav-*/token2wav.json "$OUT/token2wav.json" 2>/dev/null
log "done"
