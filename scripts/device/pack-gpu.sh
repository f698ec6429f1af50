#!/usr/bin/env bash
# Packs what the GPU scripts carry besides .e2e (pack-services.sh):
#   .whl/  the CosyVoice2 reference code and what its imports need, as wheels at the versions the
#          project venv has (the GPU machine has torch but no network);
#   .t2w/  the stripped voxbatch binary and CosyVoice2 parity test binary (xz), from target/debug.
# Run after `cargo build --all-targets`. Carry with: carry [".whl", ".t2w"].
set -euo pipefail
cd "$(dirname "$0")/../.."
rm -rf .whl .t2w && mkdir -p .whl .t2w
pure="token2wav-cosyvoice==0.1.0 conformer==0.3.2 diffusers==0.42.1 einops==0.8.2 omegaconf==2.4.0
  importlib_metadata==10.2.0 zipp==4.1.2 huggingface_hub==2.4.0 httpx2==2.16.2 httpcore2==2.16.2 h11==0.16.0
  anyio==4.16.0 idna==3.20 certifi==2026.10.19.post1 filelock==4.3.1 fsspec==2026.9.0 tqdm==4.70.1 packaging==26.4"
binary="safetensors==0.8.0 PyYAML==6.0.4 regex==2026.11.19"
# shellcheck disable=SC2086
.venv/bin/pip download -q --no-deps -d .whl $pure
# Binary wheels for this machine's Python and for the GPU machine's (3.12).
for py in 3.11 3.12; do
  # shellcheck disable=SC2086
  .venv/bin/pip download -q --no-deps --only-binary=:all: --python-version "$py" --platform manylinux2014_x86_64 -d .whl $binary
done
test_bin=$(ls -t target/debug/deps/cosyvoice2_parity-* | grep -v '\.d$' | head -n1)
strip -o .t2w/cosyvoice2_parity "$test_bin" && xz -T2 -6 -f .t2w/cosyvoice2_parity
strip -o .t2w/voxbatch target/debug/voxbatch && xz -T2 -6 -f .t2w/voxbatch
du -sh .whl .t2w
