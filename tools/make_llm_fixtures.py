#!/usr/bin/env python3
"""Parity fixtures for voxbatch's CosyVoice2 speech-token LM (src/model/llm/).

Builds CosyVoice2's `Qwen2LM` from the reference code of the PyPI package `token2wav-cosyvoice`
(`cosyvoice/llm/llm.py`) around a tiny Qwen2 made from a `transformers` 4.x config (random weights,
fixed seed; transformers 4.51.3 as CosyVoice pins it), and writes:

  OUT/llm.safetensors  the LM's weights under the names of CosyVoice2's llm.pt state dict
                       (`llm.model.model.*`, `llm_embedding`, `speech_embedding`, `llm_decoder`;
                       the unused `lm_head` left out as the converter does);
  OUT/parity.safetensors per item: text, prompt text, prompt speech tokens, the reference's
                       `lm_input`, its prefill hidden states, and teacher-forced decode steps (the
                       fed tokens and the log-probabilities of each step), run the way the
                       reference runs (batch 1, fp32, CPU, its Hugging Face KV cache);
                       and sampler cases: log-probabilities, a history, two uniforms and the
                       reference's `ras_sampling` pick with `multinomial` drawing by inverse CDF
                       from those uniforms (nucleus first, full distribution second);
  OUT/parity.json      dimensions, item lengths and the sampler cases' settings;
  OUT/tokenizer_parity.json the reference tokenizer's ids for tests/data/tokenizer_cases.txt;
  OUT/official/        llm.pt and CosyVoice-BlankEN/ (config.json, and a stand-in Qwen2 tokenizer's
                       vocab.json, merges.txt, tokenizer_config.json) as CosyVoice2 ships them (bootstrap
                       copies them into the tiny token2wav fixture's official directory, so that
                       tools/convert_cosyvoice.py converts a whole model).

Run with `transformers` 4.51.3 importable (bootstrap installs it apart from the project venv:
`PYTHONPATH=.run/llm-site`). Usage: make_llm_fixtures.py --out DIR [--seed N]
"""
import argparse
import json
import logging
import os
import sys
import types

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import convert_cosyvoice  # noqa: E402

# vocab covers the stand-in tokenizer (tokenizer.json: 256 bytes, merges, CosyVoice2's added tokens);
# speech_tokens is the tiny token2wav's vocabulary (its voices' prompt tokens feed the LLM too).
DIMS = dict(vocab=480, hidden=32, layers=2, heads=4, kv_heads=2, intermediate=48, speech_tokens=64, rope_theta=1e6, eps=1e-6)
# CosyVoice2-0.5B's (CosyVoice-BlankEN/config.json and cosyvoice2.yaml), for `--full`.
FULL = dict(vocab=151936, hidden=896, layers=24, heads=14, kv_heads=2, intermediate=4864, speech_tokens=6561, rope_theta=1e6, eps=1e-6)
# (text tokens, prompt text tokens, prompt speech tokens, teacher-forced steps) per item.
ITEMS = [(5, 0, 0, 12), (9, 3, 7, 16), (3, 2, 4, 9)]


def import_reference():
    """`cosyvoice.llm.llm` without torchaudio (only its logging helper is needed)."""
    file_utils = types.ModuleType("cosyvoice.utils.file_utils")
    file_utils.logging = logging
    sys.modules["cosyvoice.utils.file_utils"] = file_utils
    import transformers
    if transformers.__version__ != "4.51.3":
        sys.exit(f"transformers {transformers.__version__}: the parity reference needs 4.51.3, the version CosyVoice pins "
                 "(4.57 already decodes differently with the reference's one-position step mask)")
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from cosyvoice.llm import llm
    return llm, Qwen2Config, Qwen2ForCausalLM


def tiny_qwen2(llm, Qwen2Config, Qwen2ForCausalLM, d):
    """The reference's Qwen2Encoder around a Qwen2ForCausalLM made from `d`'s dimensions (random init
    from torch's global generator), without from_pretrained."""
    config = Qwen2Config(vocab_size=d["vocab"], hidden_size=d["hidden"], intermediate_size=d["intermediate"],
                         num_hidden_layers=d["layers"], num_attention_heads=d["heads"], num_key_value_heads=d["kv_heads"],
                         rope_theta=d["rope_theta"], rms_norm_eps=d["eps"], max_position_embeddings=1024,
                         tie_word_embeddings=False, use_sliding_window=False, sliding_window=None,
                         attn_implementation="eager", torch_dtype="float32")
    encoder = llm.Qwen2Encoder.__new__(llm.Qwen2Encoder)
    torch.nn.Module.__init__(encoder)
    encoder.model = Qwen2ForCausalLM(config)
    return encoder


def scale_weights(lm):
    """Larger random weights than Hugging Face's init (std 0.02), so that every layer matters."""
    with torch.no_grad():
        for name, p in lm.named_parameters():
            if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.3 * torch.randn_like(p))


def build(seed, d=DIMS, scale=True):
    llm, Qwen2Config, Qwen2ForCausalLM = import_reference()
    torch.manual_seed(seed)
    encoder = tiny_qwen2(llm, Qwen2Config, Qwen2ForCausalLM, d)
    lm = llm.Qwen2LM(llm_input_size=d["hidden"], llm_output_size=d["hidden"], speech_token_size=d["speech_tokens"],
                     llm=encoder, sampling=None)
    if not scale:
        return lm.eval()
    scale_weights(lm)
    with torch.no_grad():
        # Random weights rarely end speech (end-of-speech is one id in 67): lean the tiny model
        # towards it, so that tests decoding real texts end near min_len instead of at max_len.
        lm.llm_decoder.bias[d["speech_tokens"]] += 1.0
    return lm.eval()


# (top_p, top_k, win_size, tau_r) of the sampler cases: CosyVoice2's, and one where top_k binds.
SAMPLER_SETTINGS = [(0.8, 25, 10, 0.1), (0.95, 3, 10, 0.1)]
SAMPLER_CASES = 48  # per setting
HISTORY = 16


def sampler_cases(rows, g, pick, settings=SAMPLER_SETTINGS):
    """Sampler cases from log-probability `rows`: per setting (top_p, top_k, win_size, tau_r),
    SAMPLER_CASES of a row, a history drawn from the row's likely tokens, two uniforms, and
    `pick(row, history, setting, case)` — the reference's sampler — with its multinomial replaced by
    an inverse-CDF draw from those uniforms (nucleus first, full distribution second), so that the
    port can be given the same. `pick` gets a copy of the row (ras_sampling writes into it)."""
    draws = []

    def inverse_cdf_multinomial(probs, num_samples, replacement=False):
        u = draws.pop(0)
        cdf = torch.cumsum(probs, 0) / probs.sum()
        return (cdf <= u).sum().clamp(max=len(probs) - 1).reshape(1)

    original = torch.Tensor.multinomial
    torch.Tensor.multinomial = inverse_cdf_multinomial
    try:
        out = {}
        for s, setting in enumerate(settings):
            logp, hist, hist_len, uni, picks = [], [], [], [], []
            for c in range(SAMPLER_CASES):
                row = rows[int(torch.randint(0, len(rows), (1,), generator=g))]
                n = int(torch.randint(0, HISTORY + 1, (1,), generator=g))
                # Histories drawn from the row's own likely tokens, so that repeats occur.
                likely = row.topk(4).indices
                h = likely[torch.randint(0, 4, (n,), generator=g)].tolist()
                u = torch.rand(2, generator=g, dtype=torch.float64).tolist()
                draws[:] = list(u)
                picks.append(int(pick(row.clone(), h, setting, c)))
                logp.append(row)
                hist.append(h + [-1] * (HISTORY - n))
                hist_len.append(n)
                uni.append(u)
            out[f"sampler{s}.logp"] = torch.stack(logp).contiguous()
            out[f"sampler{s}.history"] = torch.tensor(hist, dtype=torch.int64)
            out[f"sampler{s}.history_len"] = torch.tensor(hist_len, dtype=torch.int64)
            out[f"sampler{s}.uniforms"] = torch.tensor(uni, dtype=torch.float64)
            out[f"sampler{s}.pick"] = torch.tensor(picks, dtype=torch.int64)
        return out
    finally:
        torch.Tensor.multinomial = original


def ras_pick(row, history, setting, case):
    """CosyVoice2's sampler: the reference's ras_sampling with `setting`."""
    from cosyvoice.utils import common
    top_p, top_k, win, tau = setting
    return common.ras_sampling(row, history, None, top_p=top_p, top_k=top_k, win_size=win, tau_r=tau)


def write_official(lm, official):
    """llm.pt and CosyVoice-BlankEN/config.json as CosyVoice2 ships them."""
    os.makedirs(os.path.join(official, "CosyVoice-BlankEN"), exist_ok=True)
    torch.save(lm.state_dict(), os.path.join(official, "llm.pt"))
    lm.llm.model.config.to_json_file(os.path.join(official, "CosyVoice-BlankEN", "config.json"))


TOKENIZER_CASES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data", "tokenizer_cases.txt")


def tokenizer_cases():
    with open(TOKENIZER_CASES, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f if line.strip() and not line.startswith("#")]


def write_standin_tokenizer(blank_en):
    """A stand-in for CosyVoice-BlankEN's Qwen2 tokenizer (no real vocabulary can be downloaded): a
    byte-level BPE with Qwen2's pre-tokenizer, trained on the parity cases, saved as the checkpoint
    ships its own (vocab.json, merges.txt, tokenizer_config.json; no tokenizer.json)."""
    import shutil
    import tempfile
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import Qwen2TokenizerFast
    bpe = Tokenizer(models.BPE())
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(convert_cosyvoice.QWEN2_PATTERN), behavior="isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=420, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
                                  special_tokens=["<|endoftext|>"])
    bpe.train_from_iterator(tokenizer_cases() * 3, trainer)
    tmp = tempfile.mkdtemp()
    try:
        Qwen2TokenizerFast(tokenizer_object=bpe, unk_token=None, bos_token=None, eos_token="<|endoftext|>",
                           pad_token="<|endoftext|>").save_pretrained(tmp)
        os.makedirs(blank_en, exist_ok=True)
        for name in ("vocab.json", "merges.txt", "tokenizer_config.json"):
            os.replace(os.path.join(tmp, name), os.path.join(blank_en, name))
    finally:
        shutil.rmtree(tmp)


def write_tokenizer_parity(tokenizer, cases, vocab, path, **extra):
    """The reference tokenizer's ids for `cases` -> `path` (JSON: vocab_size, cases [{text, ids}],
    and `extra`); exits when an id falls outside the tiny Qwen2's `vocab`."""
    rows = [{"text": t, "ids": tokenizer.encode(t)} for t in cases]
    top = max(i for r in rows for i in r["ids"])
    if top >= vocab:
        sys.exit(f"the stand-in tokenizer makes id {top}: raise the tiny Qwen2's vocab above it")
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"vocab_size": len(tokenizer.tokenizer), **extra, "cases": rows}, f, ensure_ascii=False, indent=1)


def write_tokenizer(blank_en, out):
    """The stand-in tokenizer into `blank_en`; then the reference's QwenTokenizer (cosyvoice/tokenizer/
    tokenizer.py, CosyVoice2's special tokens added) tokenizes every case: OUT/tokenizer_parity.json."""
    write_standin_tokenizer(blank_en)
    # The reference class, its unused whisper/tiktoken imports stubbed.
    for name in ("whisper", "whisper.tokenizer", "tiktoken"):
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.modules["whisper.tokenizer"].Tokenizer = object
    from cosyvoice.tokenizer.tokenizer import QwenTokenizer
    ref = QwenTokenizer(blank_en, skip_special_tokens=True)
    write_tokenizer_parity(ref, tokenizer_cases(), DIMS["vocab"], os.path.join(out, "tokenizer_parity.json"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=4321)
    ap.add_argument("--full", action="store_true",
                    help="CosyVoice2-0.5B's dimensions (Hugging Face's random init), official files only: for benchmarks")
    args = ap.parse_args()
    from safetensors.torch import save_file
    if args.full:
        lm = build(args.seed, FULL, scale=False)
        write_official(lm, os.path.join(args.out, "official"))
        print(f"wrote {args.out}/official: CosyVoice2-0.5B-shaped LLM, random weights")
        return
    lm = build(args.seed)
    os.makedirs(args.out, exist_ok=True)
    weights = {k: v.contiguous() for k, v in lm.state_dict().items() if not k.startswith("llm.model.lm_head")}
    save_file(weights, os.path.join(args.out, "llm.safetensors"))
    # The converter's input, as CosyVoice2 ships it: llm.pt (the whole state dict, lm_head
    # included) and the Qwen2 config under CosyVoice-BlankEN/.
    write_official(lm, os.path.join(args.out, "official"))
    write_tokenizer(os.path.join(args.out, "official", "CosyVoice-BlankEN"), args.out)
    d = DIMS
    g = torch.Generator().manual_seed(args.seed + 1)
    fx = {}
    with torch.no_grad():
        for i, (n_text, n_ptext, n_pspeech, steps) in enumerate(ITEMS):
            text = torch.randint(0, d["vocab"], (1, n_text), generator=g)
            ptext = torch.randint(0, d["vocab"], (1, n_ptext), generator=g)
            pspeech = torch.randint(0, d["speech_tokens"], (1, n_pspeech), generator=g)
            fed = torch.randint(0, d["speech_tokens"], (steps,), generator=g)
            # lm_input exactly as Qwen2LM.inference builds it.
            emb = lm.llm.model.model.embed_tokens(torch.concat([ptext, text], dim=1))
            sos = lm.llm_embedding.weight[lm.sos_eos].reshape(1, 1, -1)
            task = lm.llm_embedding.weight[lm.task_id].reshape(1, 1, -1)
            speech = lm.speech_embedding(pspeech) if n_pspeech else torch.zeros(1, 0, d["hidden"])
            lm_input = torch.concat([sos, emb, task, speech], dim=1)
            # Prefill and teacher-forced steps, as inference_wrapper runs them.
            masks = torch.tril(torch.ones((1, lm_input.shape[1], lm_input.shape[1]), dtype=torch.bool))
            y, cache = lm.llm.forward_one_step(lm_input, masks=masks, cache=None)
            hidden = y[0]
            logps = [lm.llm_decoder(y[:, -1]).log_softmax(dim=-1)[0]]
            for t in fed.tolist():
                x = lm.speech_embedding.weight[t].reshape(1, 1, -1)
                step_masks = torch.tril(torch.ones((1, x.shape[1], x.shape[1]), dtype=torch.bool))
                y, cache = lm.llm.forward_one_step(x, masks=step_masks, cache=cache)
                logps.append(lm.llm_decoder(y[:, -1]).log_softmax(dim=-1)[0])
            for k, v in dict(text=text[0], prompt_text=ptext[0], prompt_speech=pspeech[0], fed=fed, lm_input=lm_input[0],
                             hidden=hidden, logp=torch.stack(logps)).items():
                fx[f"item{i}.{k}"] = v.contiguous()
    fx.update(sampler_cases(torch.cat([fx[f"item{i}.logp"] for i in range(len(ITEMS))]), g, ras_pick))
    save_file(fx, os.path.join(args.out, "parity.safetensors"))
    with open(os.path.join(args.out, "parity.json"), "w") as f:
        json.dump({"dims": DIMS, "items": ITEMS, "seed": args.seed, "sampler": SAMPLER_SETTINGS}, f, indent=2)
    print(f"wrote {args.out}: {len(ITEMS)} items")


if __name__ == "__main__":
    main()
