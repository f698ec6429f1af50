# parity: the CosyVoice2 parity tests on the GPU, from the carried integration test binary
# (.t2w/integration.xz), in three parts (PARTS, in this order):
#   llm        the LLM's parity tests (cosyvoice2_llm_parity::) on DEVICE against the fixtures bootstrap
#              made here: carry models/cosyvoice2-llm-parity and models/cosyvoice2-tiny (its token2wav
#              weights may stay behind — the carry limit —: empty stand-ins satisfy the manifest's
#              file check); skipped with a message when models/cosyvoice2-llm-parity is not carried.
#              First: the token2wav part converts models/cosyvoice2-tiny again, without the LLM.
#   token2wav  the tiny token2wav fixtures built there from the reference code (carried wheels in .whl;
#              fp32 on the CPU as always, bf16 and fp16 on the GPU as upstream runs it), converted, and
#              the token2wav parity tests (cosyvoice2_parity::) on DEVICE
#   compiled   the tiny model's packages compiled on this GPU (flow bf16, vocoder tf32) into
#              models/cosyvoice2-tiny-compiled-gpu and tests/integration/compiled.rs's GPU tests
#              (compiled::, --ignored): each compiled stage against the eager port at the same
#              precision. Needs the converted tiny model: the token2wav part's, or its fixtures
#              alone when that part is not asked for.
#   tts        (not in the default PARTS) the whole tiny text model built there — the token2wav
#              fixtures with the carried LLM fixtures, converted with the LLM reference's
#              transformers, as bootstrap builds models/cosyvoice2-tiny — and the text pipeline's GPU
#              tests (cosyvoice2_tts::, --ignored: `[llm] pipelined_buckets` against the stages waited
#              for). Carry models/cosyvoice2-llm-parity, not models/cosyvoice2-tiny (62 MB with .t2w's
#              24 is past the carry limit).
# Carry: .whl .t2w (pack.sh), and for the llm part models/cosyvoice2-llm-parity models/cosyvoice2-tiny.
# Env: PARTS ("llm token2wav compiled"; ONLY=compiled means PARTS=compiled), DEVICE (cuda:0),
#      COMPILED_STAGES (encoder,estimator,hift: all three, the encoder too, though not in the tool's
#      default — the GPU test checks each stage), TESTS (compiled::, a filter of the compiled tests,
#      e.g. COMPILED_STAGES=hift TESTS=out_of_memory for the out-of-memory test alone), COMPILE_ARGS
#      (more tools/compile_token2wav.py arguments, e.g. a variant's "--layout time-major-strided --mish exp"), PY.
# Output: the console (each test's PARITY/PRECISION/COMPILED lines and results).
PARTS=${PARTS:-llm token2wav compiled}
[ "${ONLY:-}" = compiled ] && PARTS=compiled
DEVICE=${DEVICE:-cuda:0}
has_part() { case " $PARTS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
for part in $PARTS; do
  case $part in llm|token2wav|compiled|tts) ;; *) log "unknown part '$part' (llm, token2wav, compiled, tts)"; exit 2 ;; esac
done

use_libtorch
link_work_main
unpack_tests

if has_part llm; then
  if [ -d models/cosyvoice2-llm-parity ]; then
    log "LLM parity on $DEVICE"
    for f in token2wav.safetensors voices.safetensors; do [ -f models/cosyvoice2-tiny/$f ] || : > models/cosyvoice2-tiny/$f; done
    VOXBATCH_TEST_DEVICE=$DEVICE "$TESTS_BIN" cosyvoice2_llm_parity:: --test-threads 1 --nocapture 2>&1 | grep -E "^PARITY|^test |test result|panicked"
  else
    log "LLM parity skipped: models/cosyvoice2-llm-parity was not carried"
  fi
fi

if has_part tts; then
  [ -d models/cosyvoice2-llm-parity ] || { log "the tts part needs models/cosyvoice2-llm-parity carried"; exit 1; }
  install_wheels llm
  log "the whole tiny text model (token2wav fixtures and the LLM fixtures, reference code), converted"
  $PY tools/make_parity_fixtures.py --config tiny --out models/cosyvoice2-tiny-parity --precisions bf16 2>&1 | tail -1
  cp -r models/cosyvoice2-llm-parity/official/. models/cosyvoice2-tiny-parity/official/
  $LLM_PY tools/convert_cosyvoice.py models/cosyvoice2-tiny-parity/official models/cosyvoice2-tiny --name cosyvoice2-tiny | tail -1
  log "text pipeline GPU tests on $DEVICE"
  VOXBATCH_TEST_DEVICE=$DEVICE "$TESTS_BIN" cosyvoice2_tts:: --ignored --test-threads 1 --nocapture 2>&1 | grep -E "^PIPELINED|^test |test result|panicked"
fi

has_part token2wav || has_part compiled || exit 0
# Its own site folder (/tmp/site-parity): another target may run beside it on one machine.
# The LLM reference's pins are left out: diffusers needs the machine's newer huggingface_hub
# (resolve_revision), which that pinned one would shadow.
install_wheels
log "tiny token2wav fixtures (reference code; bf16 and fp16 on $DEVICE) and their conversion"
$PY tools/make_parity_fixtures.py --config tiny --out models/cosyvoice2-tiny-parity --precisions bf16,fp16 --device "$DEVICE" 2>&1 | tail -1
$PY tools/convert_cosyvoice.py models/cosyvoice2-tiny-parity/official models/cosyvoice2-tiny --name cosyvoice2-tiny | tail -1
if has_part token2wav; then
  log "token2wav parity on $DEVICE"
  VOXBATCH_TEST_DEVICE=$DEVICE "$TESTS_BIN" cosyvoice2_parity:: --test-threads 1 --nocapture 2>&1 | grep -E "^PARITY|^PRECISION|^test |test result|panicked"
fi

has_part compiled || exit 0
# Compiled vs eager at the same precision (issue 16): the tiny model's packages compiled on this GPU.
log "the tiny model's packages compiled on $DEVICE (${COMPILED_STAGES:-encoder,estimator,hift}), then compiled::"
G=models/cosyvoice2-tiny-compiled-gpu; rm -rf "$G"; mkdir -p "$G"
for f in models/cosyvoice2-tiny/*; do ln -s "$PWD/$f" "$G/"; done
# shellcheck disable=SC2086
$PY tools/compile_token2wav.py --model "$G" --device "$DEVICE" --stages "${COMPILED_STAGES:-encoder,estimator,hift}" --precision bf16 \
  --max-frames 400 --max-batch 16 ${COMPILE_ARGS:-} 2>&1 \
  | grep -v -i "warn\|deprecat\|__new__" | cut -c1-300
# shellcheck disable=SC2086
VOXBATCH_TEST_DEVICE=$DEVICE "$TESTS_BIN" --ignored --test-threads 1 --nocapture ${TESTS:-compiled::} 2>&1 | grep -E "^COMPILED|^test |test result|panicked"
