# Sourced by scripts/device/run.sh, from the repository root, before the target's file: what every
# target shares. The device machine has torch (as $PY) but no cargo and no network: the binaries
# and wheels come from scripts/device/pack.sh here, carried.
#   OUT            where a target's results go (default /tmp/TARGET-out; the device tool sets it)
#   PY             python3: the machine's torch, and the reference code once installed
#   log            a line stamped with the target and the time (UTC)
#   use_libtorch   the carried binaries link libtorch from $PY's torch, NVML from the driver's folder
#   install_wheels the reference code's wheels (.whl) into SITE (/tmp/site-TARGET), on PYTHONPATH;
#                  `install_wheels llm` also the LLM reference's pins into their own site, for $LLM_PY
#                  (transformers 4.51.3 needs a huggingface_hub < 1 that diffusers cannot use)
#   unpack_voxbatch  .t2w/voxbatch.xz → $BIN (/tmp/voxbatch)
#   VOXBATCH_ENV   what the Dockerfile and the systemd unit set for the worker, for voxbatch's GPU
#                  runs here (run_worker, the token2wav benches: `env $VOXBATCH_ENV $BIN …`); the
#                  references' Python runs without it. TORCH_CUDNN_V8_API_DISABLED=0 among a call's
#                  settings: convolutions through cuDNN's v8 API (docs/models.md#attention-and-cudnn)
#   unpack_tests     .t2w/integration.xz → /tmp/integration, the one integration test binary: a target
#                    picks its tests by module prefix (cosyvoice2_parity::, compiled::, …)
#   link_work_main   the test binary finds its files under the path it was built in (/work/main)
OUT=${OUT:-/tmp/$TARGET-out}; mkdir -p "$OUT"
PY=${PY:-python3}
DEVICE_DIR=scripts/device

log() { echo "[$TARGET $(date -u +%T)] $*"; }

VOXBATCH_ENV="TORCH_CUDNN_V8_API_DISABLED=${TORCH_CUDNN_V8_API_DISABLED:-1}"

use_libtorch() {
  local lib
  lib=$($PY -c 'import torch, os; print(os.path.dirname(torch.__file__) + "/lib")') || return 1
  export LD_LIBRARY_PATH="$lib:/usr/local/nvidia/lib64:${LD_LIBRARY_PATH:-}"
}

pip_into() {  # SITE WHEEL...
  local site=$1; shift
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$@"
}

install_wheels() {
  SITE=${SITE:-/tmp/site-$TARGET}; rm -rf "$SITE"  # a warm machine keeps /tmp: start clean
  local wheels w
  wheels=$(ls .whl/*.whl 2>/dev/null | grep -v -e transformers- -e huggingface_hub- -e tokenizers-)
  [ -n "$wheels" ] || { log "no wheels in .whl (scripts/device/pack.sh here, then carry .whl)"; exit 1; }
  # All at once, else wheel by wheel: a binary wheel built for another Python is skipped (the
  # machine's own copy serves).
  # shellcheck disable=SC2086
  pip_into "$SITE" $wheels 2>/dev/null || for w in $wheels; do pip_into "$SITE" "$w" 2>/dev/null || echo "skipped $(basename "$w")"; done
  export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
  if [ "${1:-}" = llm ]; then
    LLM_SITE=/tmp/llm-site-$TARGET; rm -rf "$LLM_SITE"
    pip_into "$LLM_SITE" .whl/transformers-* .whl/huggingface_hub-* .whl/tokenizers-* || exit 1
    # Put first only for the LLM reference's scripts.
    LLM_PY="env PYTHONPATH=$LLM_SITE:$PYTHONPATH $PY"
  fi
}

# unpack XZ DEST: through a temporary file of this process's own and a rename, so that a copy
# another step still runs is not overwritten in place, and two targets run side by side (a compile
# beside a bench) do not write one temporary file; exits the target when there is none.
unpack() {
  local tmp="$2.unpacking.$$"
  { xz -dc "$1" > "$tmp" && chmod +x "$tmp" && mv -f "$tmp" "$2"; } || {
    rm -f "$tmp"
    echo "no binary at $1 (scripts/device/pack.sh here, then carry .t2w)"
    exit 1
  }
}

unpack_voxbatch() {
  BIN=${BIN:-/tmp/voxbatch}
  unpack "${BIN_XZ:-.t2w/voxbatch.xz}" "$BIN"
}

unpack_tests() {
  TESTS_BIN=/tmp/integration
  unpack .t2w/integration.xz "$TESTS_BIN"
}

# The worker, drained, under `timeout SECONDS`, its output in LOG; sets rc. In the background with
# its pid kept, so that a target's EXIT trap stops it (stop_worker) before the services: a call cut
# short by the device tool's or a caller's timeout signals the target's shell alone, and on
# 2026-12-07 a worker left running so reconnected to the next run's services on the same ports.
WORKER_PID=
run_worker() {  # SECONDS LOG ARGS...
  local seconds=$1 log=$2; shift 2
  env $VOXBATCH_ENV timeout "$seconds" $BIN work --drain "$@" > "$log" 2>&1 &
  WORKER_PID=$!
  wait "$WORKER_PID"; rc=$?
  WORKER_PID=
}
stop_worker() {  # a graceful stop (the batch in hand finished, the rest requeued), killed after 30 s
  [ -n "${WORKER_PID:-}" ] || return 0
  kill -TERM "$WORKER_PID" 2>/dev/null  # timeout passes it on to the worker
  for _ in $(seq 30); do kill -0 "$WORKER_PID" 2>/dev/null || break; sleep 1; done
  pkill -KILL -P "$WORKER_PID" 2>/dev/null; kill -KILL "$WORKER_PID" 2>/dev/null
  WORKER_PID=
}
link_work_main() {
  mkdir -p /work && { [ -e /work/main ] || ln -s "$PWD" /work/main; }
}
