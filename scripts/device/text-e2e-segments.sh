#!/usr/bin/env bash
# Issue 14's segment-length experiment on the GPU machine: the end-to-end text run
# (scripts/device/text-e2e.sh, STAGE=e2e, after its STAGE=model call on the same warm machine)
# twice on the same corpus, first with the default segments ([frontend] 80/60/20 tokens, [llm]
# max_text_tokens 80), then with segments three times as long (240/180/60, max_text_tokens 240), so
# the voice prompt that token2wav re-reads for every segment is spread over three times the audio.
# Each run is cut at WORK_TIMEOUT seconds (throughput is over what finished). Results under
# $OUT/base and $OUT/long.
# VARIANTS: which runs, in order (default "base long"; one a call keeps each call short).
# Env: OUT, VARIANTS, JOBS (1200), CHAPTERS (6), WORK_TIMEOUT (240), and text-e2e.sh's.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/text-e2e-segments}
export JOBS=${JOBS:-1200} CHAPTERS=${CHAPTERS:-6} WORK_TIMEOUT=${WORK_TIMEOUT:-240} STAGE=e2e
for variant in ${VARIANTS:-base long}; do
case $variant in
base) OUT="$OUT/base" bash scripts/device/text-e2e.sh ;;
long)
# Its own queues, so that jobs the first run left queued do not mix in.
OUT="$OUT/long" VOXBATCH_AMQP__EXCHANGE=voxbatch-long VOXBATCH_AMQP__QUEUE=voxbatch-long.jobs \
  VOXBATCH_AMQP__DEAD_LETTER_EXCHANGE=voxbatch-long.dlx VOXBATCH_AMQP__DEAD_LETTER_QUEUE=voxbatch-long.jobs.dead \
  VOXBATCH_FRONTEND__SEGMENT_MAX_TOKENS=240 VOXBATCH_FRONTEND__SEGMENT_MIN_TOKENS=180 \
  VOXBATCH_FRONTEND__SEGMENT_MERGE_TOKENS=60 VOXBATCH_LLM__MAX_TEXT_TOKENS=240 bash scripts/device/text-e2e.sh ;;
*) echo "unknown variant $variant (base, long)"; exit 1 ;;
esac
done
