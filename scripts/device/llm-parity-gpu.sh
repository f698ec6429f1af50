#!/usr/bin/env bash
# The CosyVoice2 LLM parity tests on the GPU (cuda:0): the carried test binary
# (.t2w/integration.xz, scripts/device/pack-gpu.sh) against the fixtures bootstrap made
# here (carry models/cosyvoice2-llm-parity and models/cosyvoice2-tiny). The binary finds its files
# under the path it was built in (/work/main): linked to here.
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-python3}
source scripts/device/libtorch.sh
mkdir -p /work && { [ -e /work/main ] || ln -s "$PWD" /work/main; }
xz -dc .t2w/integration.xz > /tmp/integration && chmod +x /tmp/integration || exit 1
VOXBATCH_TEST_DEVICE=${DEVICE:-cuda:0} /tmp/integration cosyvoice2_llm_parity:: --test-threads 1 --nocapture 2>&1 | grep -E "^PARITY|^test |test result|panicked"
