#!/usr/bin/env bash
# Issue 13 on the GPU machine, one call: the LLM's GPU tests (parity on cuda:0, CUDA graph replay,
# graph decoding = eager decoding), then the benchmark — a CosyVoice2-0.5B-shaped LLM with random
# weights (tools/make_llm_fixtures.py --full) inside a full-size random CosyVoice2 directory
# (tools/make_parity_fixtures.py --config full), converted by tools/convert_cosyvoice.py; the
# official Qwen2LM.inference at batch 1 on the same weights (tools/bench_llm_reference.py, fp32 as
# the official default, and bf16); `voxbatch bench llm` over slot counts, CUDA graphs on, and eager
# at a few slot counts for comparison.
# Carry: .whl .t2w models/cosyvoice2-llm-parity models/cosyvoice2-tiny (scripts/device/pack-gpu.sh).
# Env: OUT, SLOTS (1,8,32,64,128,256,512), EAGER_SLOTS (64,256; empty: none), REF_SEQUENCES (3),
# REF_PRECISIONS ("fp32 bf16"), REQUESTS_PER_SLOT (2), PY (python3).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/llm-out}; mkdir -p "$OUT"
PY=${PY:-python3}
log() { echo "[llm $(date -u +%T)] $*"; }
# transformers 4.51.3 needs a huggingface_hub < 1 that diffusers (token2wav reference) cannot use:
# the LLM reference gets its own site, put first only for the LLM scripts.
rm -rf /tmp/site /tmp/llm-site  # a warm machine keeps /tmp: start clean
LLM_WHEELS=".whl/transformers-* .whl/huggingface_hub-* .whl/tokenizers-*"
$PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/llm-site $LLM_WHEELS || exit 1
$PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  $(ls .whl/*.whl | grep -v -e transformers- -e huggingface_hub- -e tokenizers-) || exit 1
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
LLM_PY="env PYTHONPATH=/tmp/llm-site:$PYTHONPATH $PY"
source scripts/device/libtorch.sh
mkdir -p /work && { [ -e /work/main ] || ln -s "$PWD" /work/main; }
source scripts/device/voxbatch-binary.sh
xz -dc .t2w/integration.xz > /tmp/integration && chmod +x /tmp/integration || exit 1

# The LLM tests read only the LLM of the tiny model; its 50 MB token2wav weights stay behind
# (the carry limit): empty stand-ins satisfy the manifest's file check.
for f in token2wav.safetensors voices.safetensors; do [ -f models/cosyvoice2-tiny/$f ] || : > models/cosyvoice2-tiny/$f; done
log "LLM tests on cuda:0 (parity, graphs)"
VOXBATCH_TEST_DEVICE=cuda:0 /tmp/integration cosyvoice2_llm_parity:: --include-ignored --test-threads 1 --nocapture 2>&1 \
  | grep -E "^PARITY|^test |test result|panicked|graphs:" | tee "$OUT/gpu-tests.log"

M=/tmp/cv2full
if [ ! -f "$M/model/llm.safetensors" ]; then
  log "building the full-size random model (reference code) and converting it"
  $PY tools/make_parity_fixtures.py --config full --no-fixtures --out "$M" 2>&1 | grep -v Warning | tail -1
  $LLM_PY tools/make_llm_fixtures.py --full --out "$M/llm" 2>&1 | tail -1
  cp -r "$M/llm/official/." "$M/official/"
  $PY tools/convert_cosyvoice.py "$M/official" "$M/model" --name cosyvoice2-full-random 2>&1 | tail -1 | cut -c1-200
fi
for p in ${REF_PRECISIONS:-fp32 bf16}; do
  log "reference Qwen2LM.inference, batch 1, $p"
  $LLM_PY tools/bench_llm_reference.py --official "$M/official" --device cuda:0 --precision $p \
    --sequences "${REF_SEQUENCES:-3}" --out "$OUT/reference-$p.json" 2>&1 | grep -v -i warn | tail -2
done
log "voxbatch bench llm (CUDA graphs)"
$BIN bench llm --model "$M/model" --device cuda:0 --slots "${SLOTS:-1,8,32,64,128,256,512}" \
  --requests-per-slot "${REQUESTS_PER_SLOT:-2}" --reference "$OUT/reference-fp32.json" --out "$OUT/bench" 2>&1 | tee "$OUT/bench.log"
if [ -n "${EAGER_SLOTS-64,256}" ]; then
  log "voxbatch bench llm (eager)"
  $BIN bench llm --model "$M/model" --device cuda:0 --slots "${EAGER_SLOTS-64,256}" --no-graphs \
    --requests-per-slot "${REQUESTS_PER_SLOT:-2}" --reference "$OUT/reference-fp32.json" --out "$OUT/bench-eager" 2>&1 | tee "$OUT/bench-eager.log"
fi
cp "$OUT"/bench/llm-*/llm.json "$OUT/llm.json" 2>/dev/null
cp "$OUT"/bench-eager/llm-*/llm.json "$OUT/llm-eager.json" 2>/dev/null
log "done"
