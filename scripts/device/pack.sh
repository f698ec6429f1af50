#!/usr/bin/env bash
# Packs here what the device targets (scripts/device/run.sh) carry: the device machine has torch
# but no cargo and no network. `scripts/device/pack.sh [PART]...`, default `wheels binaries`:
#   wheels    .whl/  the CosyVoice2 reference code and what its imports need, as wheels at the versions
#                    the project venv has, and the LLM reference's transformers pins (needs network)
#   binaries  .t2w/  the stripped voxbatch binary (voxbatch.xz) and the integration test binary
#                    (integration.xz: target/debug/deps/integration-*, one binary whose tests a target
#                    picks by module prefix), from target/debug — after `make test` (`cargo build --profile test --all-targets`)
#   cv3       .cv3/  CosyVoice3's reference code (no PyPI package ships it): cosyvoice/ and the
#                    CosyVoice3 yaml of a FunAudioLLM/CosyVoice checkout or git directory (CV3_REPO,
#                    default .run/cv3-ref/CosyVoice), and matcha/ of Matcha-TTS at the commit it pins
#                    (MATCHA_REPO, default its third_party/Matcha-TTS), as reference.tar.xz with
#                    REFERENCE_COMMIT files; the wheels tools/make_cv3_fixtures.py names (x-transformers,
#                    hyperpyyaml, …; needs network). Read there, never committed.
#   services  .e2e/  RabbitMQ (with Erlang) and PostgreSQL 15 from Debian's packages, trimmed, as
#                    services.tar.xz (~50 MB; needs apt-get and network), for the e2e, text-e2e and
#                    scaling targets
# Each is ignored by git; name them in the device call's carry (run.sh's table says which).
set -euo pipefail
cd "$(dirname "$0")/../.."
PARTS=("$@"); [ ${#PARTS[@]} -gt 0 ] || PARTS=(wheels binaries)
for part in "${PARTS[@]}"; do
  case $part in wheels|binaries|services|cv3) ;; *) echo "unknown part '$part': wheels, binaries, services or cv3" >&2; exit 2 ;; esac
done

pack_wheels() {
  rm -rf .whl && mkdir -p .whl
  # The reference code and the few packages its flow and HiFT import that the GPU machine's torch
  # environment lacks, without dependencies: that environment has numpy, scipy, PyYAML and a
  # huggingface_hub/transformers pair of its own, which a newer huggingface_hub would break.
  .venv/bin/pip download -q --no-deps -d .whl token2wav-cosyvoice==0.1.0 conformer==0.3.2 einops==0.8.2 \
    diffusers==0.42.1 omegaconf==2.4.0 importlib_metadata==10.2.0 zipp==4.1.2 safetensors==0.8.0
  # The LLM reference (tools/make_llm_fixtures.py, tools/bench_llm_reference.py) needs the transformers
  # CosyVoice pins, with the huggingface_hub and tokenizers it was released with (tokenizers' wheel is
  # abi3: it serves the GPU machine's Python 3.12 too).
  .venv/bin/pip download -q --no-deps -d .whl transformers==4.51.3 huggingface_hub==0.36.0 tokenizers==0.21.4
  # The text normalisation grammars the converter copies (its FST files only: not imported).
  .venv/bin/pip download -q --no-deps -d .whl wetext==0.1.8
  du -sh .whl
}

pack_binaries() {
  rm -rf .t2w && mkdir -p .t2w
  local test_bin
  # The test binary is there only after `make test` (the demo builds the binary alone): the
  # targets that run no test binary (token2wav, text-e2e, cv3-token2wav) need voxbatch only.
  test_bin=$(ls -t target/debug/deps/integration-* 2>/dev/null | grep -v '\.d$' | head -n1 || true)
  if [ -n "$test_bin" ]; then
    strip -o .t2w/integration "$test_bin" && xz -T2 -6 -f .t2w/integration
  else
    echo "no integration test binary (make test builds it): packed voxbatch alone" >&2
  fi
  ( source scripts/env.sh && dev_binary )  # the optimised build, not `make test`'s
  strip -o .t2w/voxbatch target/debug/voxbatch && xz -T2 -6 -f .t2w/voxbatch
  du -sh .t2w/*
}

# git directory of a checkout or of a bare mirror
git_dir_of() { if [ -d "$1/.git" ] || [ -f "$1/.git" ]; then git -C "$1" rev-parse --absolute-git-dir; else echo "$1"; fi; }

pack_cv3() {
  local repo=${CV3_REPO:-.run/cv3-ref/CosyVoice} cv matcha pin stage
  cv=$(git_dir_of "$repo")
  pin=$(git --git-dir="$cv" ls-tree HEAD third_party/Matcha-TTS | awk '{print $3}')
  [ -n "$pin" ] || { echo "$repo: no third_party/Matcha-TTS pin (a FunAudioLLM/CosyVoice checkout?)" >&2; exit 1; }
  matcha=$(git_dir_of "${MATCHA_REPO:-$repo/third_party/Matcha-TTS}")
  rm -rf .cv3 && mkdir -p .cv3/wheels
  stage=$(mktemp -d); mkdir -p "$stage/CosyVoice/third_party/Matcha-TTS"
  git --git-dir="$cv" archive HEAD cosyvoice examples/libritts/cosyvoice3/conf/cosyvoice3.yaml | tar -x -C "$stage/CosyVoice"
  git --git-dir="$matcha" archive "$pin" matcha | tar -x -C "$stage/CosyVoice/third_party/Matcha-TTS"
  git --git-dir="$cv" log -1 --format='%H %cs' > "$stage/CosyVoice/REFERENCE_COMMIT"
  git --git-dir="$matcha" log -1 --format='%H %cs' "$pin" > "$stage/CosyVoice/third_party/Matcha-TTS/REFERENCE_COMMIT"
  tar -C "$stage" -cJf .cv3/reference.tar.xz CosyVoice && rm -rf "$stage"
  .venv/bin/pip download -q --no-deps -d .cv3/wheels x-transformers==2.11.24 loguru einx frozendict \
    HyperPyYAML==1.2.3 ruamel.yaml==0.17.40
  du -sh .cv3/*
}

pack_services() {
  mkdir -p .e2e/debs
  (
    cd .e2e/debs
    apt-get update -qq
    apt-get download rabbitmq-server erlang-base erlang-asn1 erlang-crypto erlang-eldap erlang-inets erlang-mnesia \
      erlang-os-mon erlang-parsetools erlang-public-key erlang-runtime-tools erlang-ssl erlang-syntax-tools \
      erlang-tools erlang-xmerl postgresql-15 libpq5 libicu72 libldap-2.5-0 libsasl2-2 libsasl2-modules-db libxml2 \
      libgssapi-krb5-2 libkrb5-3 libk5crypto3 libkrb5support0 libkeyutils1 libcom-err2 libpam0g libaudit1 libcap-ng0 \
      liblz4-1 libzstd1 libtinfo6 libgnutls30 libnettle8 libhogweed6 libgmp10 libp11-kit0 libidn2-0 libunistring2 \
      libtasn1-6 libffi8 libgcrypt20 libgpg-error0 libcap2 liblzma5 libsystemd0
  )
  (
    cd .e2e
    rm -rf stage && mkdir -p stage/sys stage/lib
    for f in debs/*.deb; do
      case $(basename "$f") in rabbitmq-server*|erlang-*) dpkg -x "$f" stage/sys ;; *) dpkg -x "$f" stage/lib ;; esac
    done
    rm -rf stage/*/usr/share/doc stage/*/usr/share/man stage/*/usr/share/locale stage/lib/usr/lib/postgresql/15/lib/bitcode
    ( cd stage/lib/usr/lib/postgresql/15/bin && rm -f pg_upgrade pgbench pg_waldump pg_rewind pg_receivewal pg_recvlogical \
      pg_basebackup pg_checksums pg_amcheck pg_verifybackup pg_test_fsync pg_test_timing pg_archivecleanup pg_resetwal \
      pg_dumpall pg_dump pg_restore vacuumlo oid2name )
    tar -C stage -cJf services.tar.xz sys lib
    rm -rf stage debs
    ls -la services.tar.xz
  )
}

for part in "${PARTS[@]}"; do "pack_$part"; done
