#!/usr/bin/env python3
"""The reference figure for `voxbatch bench llm`: CosyVoice2's official `Qwen2LM.inference`
(cosyvoice/llm/llm.py from the PyPI package `token2wav-cosyvoice`, its Hugging Face path: one
utterance at a time with a KV cache, ras_sampling as cosyvoice2.yaml sets it) on an official
directory's llm.pt + CosyVoice-BlankEN/config.json, timed on the device.

Requests follow `voxbatch bench llm`'s stated distribution (text U[20,120] tokens, prompt speech
U[0,250] with prompt text = prompt/6, output forced U[100,750] by setting min and max length
ratios to the drawn length over the text length). Random weights cannot speak: the figure is
throughput only. Writes the JSON `voxbatch bench llm --reference` reads.

`--family cosyvoice3 --snapshot CHECKOUT`: Fun-CosyVoice3's `CosyVoice3LM.inference` instead, from a
FunAudioLLM/CosyVoice checkout (no PyPI package ships it; tools/make_cv3_llm_fixtures.py imports it),
on a directory with its llm.pt (`make_cv3_llm_fixtures.py --full`). Its inference asserts that
`<|endofprompt|>` (151646) is in the text: each request's text begins with it. Every id from the
speech tokens on ends its decoding and only the first is masked before min_len, so with random
weights sequences end early (a random pick among 200 stop ids): the figure is tokens per second.

Needs transformers 4.51.3 (CosyVoice's pin). Usage:
  bench_llm_reference.py --official DIR --device cuda:0 [--sequences 4] [--precision fp32|bf16]
      [--family cosyvoice3 --snapshot CHECKOUT] --out FILE
"""
import argparse
import functools
import json
import os
import random
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_llm_fixtures import import_reference  # noqa: E402


# CosyVoice3's `<|endofprompt|>` in the released vocabulary, which its inference asserts is in the text.
END_OF_PROMPT = 151646


def load(official, device, precision, family="cosyvoice2", snapshot=None):
    if family == "cosyvoice3":
        import make_cv3_llm_fixtures
        ref = make_cv3_llm_fixtures.import_reference(snapshot)
        llm, Qwen2Config, Qwen2ForCausalLM = ref.llm, ref.Qwen2Config, ref.Qwen2ForCausalLM
    else:
        llm, Qwen2Config, Qwen2ForCausalLM = import_reference()
    from cosyvoice.utils import common
    config = Qwen2Config.from_json_file(os.path.join(official, "CosyVoice-BlankEN", "config.json"))
    config._attn_implementation = "eager"
    encoder = llm.Qwen2Encoder.__new__(llm.Qwen2Encoder)
    torch.nn.Module.__init__(encoder)
    encoder.model = Qwen2ForCausalLM(config)
    sd = torch.load(os.path.join(official, "llm.pt"), map_location="cpu", weights_only=True)
    sampling = functools.partial(common.ras_sampling, top_p=0.8, top_k=25, win_size=10, tau_r=0.1)
    if family == "cosyvoice3":
        speech = sd["speech_embedding.weight"].shape[0] - 200
        lm = llm.CosyVoice3LM(llm_input_size=config.hidden_size, llm_output_size=config.hidden_size, speech_token_size=speech,
                              llm=encoder, sampling=sampling)
    else:
        speech = sd["speech_embedding.weight"].shape[0] - 3
        lm = llm.Qwen2LM(llm_input_size=config.hidden_size, llm_output_size=config.hidden_size, speech_token_size=speech,
                         llm=encoder, sampling=sampling)
    lm.load_state_dict(sd, strict=True)
    lm = lm.to(device).eval()
    if precision == "bf16":
        lm = lm.to(torch.bfloat16)
    return lm, config.vocab_size, speech


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--official", required=True)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--sequences", type=int, default=4)
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                    help="fp32: the official default (fp16=False); bf16: the whole module cast")
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--family", choices=["cosyvoice2", "cosyvoice3"], default="cosyvoice2")
    ap.add_argument("--snapshot", help="a FunAudioLLM/CosyVoice checkout (--family cosyvoice3)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if args.family == "cosyvoice3" and not args.snapshot:
        sys.exit("--family cosyvoice3 needs --snapshot (a FunAudioLLM/CosyVoice checkout)")
    lm, vocab, speech = load(args.official, args.device, args.precision, args.family, args.snapshot)
    rng = random.Random(args.seed)
    torch.manual_seed(args.seed)
    dev = args.device

    def request():
        text, prompt = rng.randint(20, 120), rng.randint(0, 250)
        forced = rng.randint(100, 750)
        t = lambda n, hi: torch.tensor([[rng.randrange(hi) for _ in range(n)]], dtype=torch.int64, device=dev)
        text_ids = t(text, vocab)
        if args.family == "cosyvoice3":
            text_ids[0, 0] = END_OF_PROMPT  # where the system prompt would end
        return text_ids, t(prompt // 6, vocab), t(prompt, speech), forced

    def decode(text, ptext, pspeech, forced):
        ratio = forced / text.shape[1]
        out = lm.inference(text, torch.tensor([text.shape[1]], device=dev), ptext, torch.tensor([ptext.shape[1]], device=dev),
                           pspeech, torch.tensor([pspeech.shape[1]], device=dev), None, sampling=25,
                           max_token_text_ratio=ratio, min_token_text_ratio=ratio)
        return sum(1 for _ in out)

    decode(*request())  # warm-up
    torch.cuda.synchronize() if dev.startswith("cuda") else None
    tokens, started = 0, time.perf_counter()
    for _ in range(args.sequences):
        tokens += decode(*request())
    torch.cuda.synchronize() if dev.startswith("cuda") else None
    seconds = time.perf_counter() - started
    what = "CosyVoice3LM.inference" if args.family == "cosyvoice3" else "Qwen2LM.inference"
    result = dict(what=f"official {what} (Hugging Face path, batch 1, KV cache, ras_sampling)",
                  precision=args.precision, sequences=args.sequences, tokens=tokens, seconds=seconds,
                  tokens_per_second=tokens / seconds)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
