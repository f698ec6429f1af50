# llm: issue 13's LLM on the GPU in one call — the LLM's GPU tests (cosyvoice2_llm_parity::
# --include-ignored: parity on cuda:0, CUDA graph replay, graph decoding = eager decoding), then the
# benchmark: a CosyVoice2-0.5B-shaped LLM with random weights inside the full-size random
# CosyVoice2 (lib/cv2full.sh, `llm`); the official Qwen2LM.inference at batch 1 on the same weights
# (tools/bench_llm_reference.py, fp32 as the official default, and bf16); `voxbatch bench llm` over
# slot counts, CUDA graphs on, and eager at a few slot counts for comparison.
# Carry: .whl .t2w models/cosyvoice2-llm-parity models/cosyvoice2-tiny (pack.sh; the tiny model's
# token2wav weights may stay behind: the LLM tests read only its LLM, and empty stand-ins satisfy
# the manifest's file check).
# Env: SLOTS (1,8,32,64,128,256,512), EAGER_SLOTS (64,256; empty: none), REF_SEQUENCES (3),
#      REF_PRECISIONS ("fp32 bf16"; empty: none), REQUESTS_PER_SLOT (2), TESTS (1; 0: no GPU tests,
#      so no integration binary needed), PROFILE (set: `--profile`, each slot count's step alone
#      under libtorch's profiler, its kernels by category and the longest in bench.log), PY.
# Output: OUT/gpu-tests.log, reference-<precision>.json, bench.log, bench/, llm.json (and
#      bench-eager.log, bench-eager/, llm-eager.json).
install_wheels llm
use_libtorch
link_work_main
unpack_voxbatch
source "$DEVICE_DIR/lib/cv2full.sh"

if [ "${TESTS:-1}" = 1 ]; then
  unpack_tests
  for f in token2wav.safetensors voices.safetensors; do [ -f models/cosyvoice2-tiny/$f ] || : > models/cosyvoice2-tiny/$f; done
  log "LLM tests on cuda:0 (parity, graphs)"
  VOXBATCH_TEST_DEVICE=cuda:0 "$TESTS_BIN" cosyvoice2_llm_parity:: --include-ignored --test-threads 1 --nocapture 2>&1 \
    | grep -E "^PARITY|^test |test result|panicked|graphs:" | tee "$OUT/gpu-tests.log"
fi

build_cv2full llm
for p in ${REF_PRECISIONS-fp32 bf16}; do
  log "reference Qwen2LM.inference, batch 1, $p"
  $LLM_PY tools/bench_llm_reference.py --official "$M/official" --device cuda:0 --precision "$p" \
    --sequences "${REF_SEQUENCES:-3}" --out "$OUT/reference-$p.json" 2>&1 | grep -v -i warn | tail -2
done
log "voxbatch bench llm (CUDA graphs)"
REFERENCE_ARG=(); [ -f "$OUT/reference-fp32.json" ] && REFERENCE_ARG=(--reference "$OUT/reference-fp32.json")
$BIN bench llm --model "$M/model" --device cuda:0 --slots "${SLOTS:-1,8,32,64,128,256,512}" ${PROFILE:+--profile} \
  --requests-per-slot "${REQUESTS_PER_SLOT:-2}" ${REFERENCE_ARG[@]+"${REFERENCE_ARG[@]}"} --out "$OUT/bench" 2>&1 | tee "$OUT/bench.log"
if [ -n "${EAGER_SLOTS-64,256}" ]; then
  log "voxbatch bench llm (eager)"
  $BIN bench llm --model "$M/model" --device cuda:0 --slots "${EAGER_SLOTS-64,256}" --no-graphs \
    --requests-per-slot "${REQUESTS_PER_SLOT:-2}" ${REFERENCE_ARG[@]+"${REFERENCE_ARG[@]}"} --out "$OUT/bench-eager" 2>&1 | tee "$OUT/bench-eager.log"
fi
cp "$OUT"/bench/llm-*/llm.json "$OUT/llm.json" 2>/dev/null
cp "$OUT"/bench-eager/llm-*/llm.json "$OUT/llm-eager.json" 2>/dev/null
log "done"
