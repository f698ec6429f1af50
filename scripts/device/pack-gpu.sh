#!/usr/bin/env bash
# Packs what the GPU scripts carry besides .e2e (pack-services.sh):
#   .whl/  the CosyVoice2 reference code and what its imports need, as wheels at the versions the
#          project venv has (the GPU machine has torch but no network);
#   .t2w/  the stripped voxbatch binary and the integration test binary (xz), from target/debug.
# Run after `cargo build --all-targets`. Carry with: carry [".whl", ".t2w"].
set -euo pipefail
cd "$(dirname "$0")/../.."
rm -rf .whl .t2w && mkdir -p .whl .t2w
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
for t in integration; do
  test_bin=$(ls -t target/debug/deps/$t-* | grep -v '\.d$' | head -n1)
  strip -o .t2w/$t "$test_bin" && xz -T2 -6 -f .t2w/$t
done
strip -o .t2w/voxbatch target/debug/voxbatch && xz -T2 -6 -f .t2w/voxbatch
du -sh .whl .t2w
