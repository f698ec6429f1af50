# Sourced by the targets that bench the full-size CosyVoice2 (token2wav, llm, text-e2e, calibrate):
# one random model in M (/tmp/cv2full, seed 1234 — the same weights on every machine), built there
# from the reference code (install_wheels first) and converted by tools/convert_cosyvoice.py into
# M/model, named cosyvoice2-full-random. Random weights: nothing speaks.
#   build_cv2full token2wav  token2wav alone (tools/make_parity_fixtures.py --config full)
#   build_cv2full llm        and a CosyVoice2-0.5B-shaped LLM (tools/make_llm_fixtures.py --full; install_wheels llm)
#   build_cv2full text       and the LLM fixtures' stand-in tokenizer and the wetext grammars: kind
#                            cosyvoice2, text jobs (needs models/cosyvoice2-llm-parity carried)
# Each builds only when M/model lacks its file; a larger build keeps the same token2wav weights,
# so packages compiled for the smaller one still match (their weights digest).
# link_model DIR: DIR gets M/model's files (linked) beside its own compiled/.
M=/tmp/cv2full

build_cv2full() {
  local need=token2wav.safetensors convert_py=$PY
  case $1 in llm) need=llm.safetensors ;; text) need=tokenizer.json; convert_py=$LLM_PY ;; esac
  [ -f "$M/model/$need" ] && return 0
  log "building the full-size random model ($1; reference code) and converting it"
  $PY tools/make_parity_fixtures.py --config full --no-fixtures --out "$M" 2>&1 | grep -v Warning | tail -1
  if [ "$1" != token2wav ]; then
    $LLM_PY tools/make_llm_fixtures.py --full --out "$M/llm" 2>&1 | tail -1
    cp -r "$M/llm/official/." "$M/official/"
  fi
  if [ "$1" = text ]; then
    # The stand-in tokenizer (no real vocabulary can be downloaded), beside the full config.json.
    cp models/cosyvoice2-llm-parity/official/CosyVoice-BlankEN/{vocab.json,merges.txt,tokenizer_config.json} "$M/official/CosyVoice-BlankEN/"
  fi
  # (The tokenizer's conversion needs transformers 4.x: the LLM site's.)
  $convert_py tools/convert_cosyvoice.py "$M/official" "$M/model" --name cosyvoice2-full-random 2>&1 | tail -1 | cut -c1-300
}

# Linked again before each bench too: the text-e2e target rebuilds the model as kind cosyvoice2
# (LLM and tokenizer files beside the same token2wav weights), and a directory linked before that
# would name files it lacks.
link_model() {
  local f
  for f in "$M"/model/*; do [ "$(basename "$f")" = compiled ] || ln -sfn "$f" "$1/"; done
}
