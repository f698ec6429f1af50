#!/usr/bin/env bash
# The CosyVoice2 parity tests on the GPU: builds the tiny fixtures there from the reference code
# (carried wheels in .whl; the reduced-precision ones at bf16 and fp16 on the GPU), converts them,
# and runs the carried test binary (.t2w/integration.xz: target/debug/deps/integration-*,
# stripped) on cuda:0; then compiles the tiny model's packages there and runs tests/integration/compiled.rs's
# GPU test (.t2w/integration.xz, compiled::): each compiled stage against the eager port at the same precision.
# .whl and .t2w are made by scripts/device/pack-gpu.sh.
# The binary finds its files under the path it was built in (/work/main): linked to here.
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-python3}
# Wheel by wheel: a binary wheel built for another Python is skipped (the machine's own copy serves).
# The LLM reference's transformers/huggingface_hub/tokenizers are left out: diffusers needs the
# machine's newer huggingface_hub (resolve_revision), which that pinned one would shadow.
# Its own site folder: it may run beside compiled-bench.sh (which rebuilds /tmp/site) on one machine.
SITE=/tmp/site-parity; rm -rf "$SITE"
for w in $(ls .whl/*.whl | grep -v -e transformers- -e huggingface_hub- -e tokenizers-); do
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$w" 2>/dev/null || echo "skipped $(basename "$w")"
done
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
source scripts/device/libtorch.sh
mkdir -p /work && { [ -e /work/main ] || ln -s "$PWD" /work/main; }
# The fp32 fixtures on the CPU as always; the reference at bf16 and fp16 on the GPU as upstream runs it.
$PY tools/make_parity_fixtures.py --config tiny --out models/cosyvoice2-tiny-parity --precisions bf16,fp16 --device cuda:0 2>&1 | tail -1
$PY tools/convert_cosyvoice.py models/cosyvoice2-tiny-parity/official models/cosyvoice2-tiny --name cosyvoice2-tiny | tail -1
# ONLY=compiled: the compiled-vs-eager part alone (its packages need the converted tiny model above).
if [ "${ONLY:-}" != compiled ]; then
xz -dc .t2w/integration.xz > /tmp/integration && chmod +x /tmp/integration || exit 1
VOXBATCH_TEST_DEVICE=${DEVICE:-cuda:0} /tmp/integration cosyvoice2_parity:: --test-threads 1 --nocapture 2>&1 | grep -E "^PARITY|^PRECISION|^test |test result|panicked"
fi
# Compiled vs eager at the same precision (issue 16): the tiny model's packages compiled on this GPU
# (flow bf16, vocoder tf32; COMPILE_ARGS: more tools/compile_token2wav.py arguments, e.g. a variant's
# "--layout time-major-strided --mish exp"), then tests/integration/compiled.rs's GPU test (.t2w/integration.xz, compiled::).
G=models/cosyvoice2-tiny-compiled-gpu; rm -rf "$G"; mkdir -p "$G"
for f in models/cosyvoice2-tiny/*; do ln -s "$PWD/$f" "$G/"; done
# All three stages, the encoder too (not in the tool's default: slower than the eager encoder; its package crashed a
# GPU bench in session 18 until its CPU constants were moved; in session 19 it passed there): the
# GPU test checks each stage. COMPILED_STAGES and TESTS narrow a run: e.g. COMPILED_STAGES=hift
# TESTS=out_of_memory (a substring of the GPU tests' names) for the out-of-memory test alone.
$PY tools/compile_token2wav.py --model "$G" --device "${DEVICE:-cuda:0}" --stages "${COMPILED_STAGES:-encoder,estimator,hift}" --precision bf16 \
  --max-frames 400 --max-batch 16 ${COMPILE_ARGS:-} 2>&1 \
  | grep -v -i "warn\|deprecat\|__new__" | cut -c1-300
VOXBATCH_TEST_DEVICE=${DEVICE:-cuda:0} /tmp/integration --ignored --test-threads 1 --nocapture ${TESTS:-compiled::} 2>&1 | grep -E "^COMPILED|^test |test result|panicked"
