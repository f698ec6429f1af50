#!/usr/bin/env bash
# One GPU call for issues 4 and 7 (carry .e2e and .whl): the token2wav bench, then the end-to-end
# drain. Keeps what comes back under the device tool's 8-file limit: copies the summaries to $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
R=${OUT:-/tmp/run-out}; mkdir -p "$R"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
OUT=/tmp/t2w-out timeout "${T2W_TIMEOUT:-270}" bash scripts/device/token2wav-bench.sh > "$R/t2w.log" 2>&1; echo "token2wav exit $?" | tee -a "$R/t2w.log"
tail -30 "$R/t2w.log"
cp /tmp/t2w-out/token2wav.json /tmp/t2w-out/reference.json "$R/" 2>/dev/null
OUT=/tmp/e2e-out JOBS=${JOBS:-2000} WORK_TIMEOUT=240 timeout "${E2E_TIMEOUT:-300}" bash scripts/device/e2e.sh > "$R/e2e.log" 2>&1; echo "e2e exit $?" | tee -a "$R/e2e.log"
tail -40 "$R/e2e.log"
cp /tmp/e2e-out/e2e-summary.json /tmp/e2e-out/report-campaign.json "$R/" 2>/dev/null
tail -200 /tmp/e2e-out/worker.log > "$R/worker-tail.log" 2>/dev/null
