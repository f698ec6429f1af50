#!/usr/bin/env python3
"""The reference token2wav run the way the official code runs it, for the bench table.

Loads the "official" directory written by `make_parity_fixtures.py --no-fixtures` (CosyVoice2) or
`make_cv3_fixtures.py --no-fixtures` (CosyVoice3, `--family cosyvoice3 --snapshot DIR`: the
reference classes come from a FunAudioLLM/CosyVoice checkout) — the same random weights as the
converted model `voxbatch bench token2wav` measures — into the reference modules and times speech
tokens -> waveform at batch 1 (the official flows assert batch 1), torch's default TF32 settings:
- CosyVoice2: the flow under autocast with the given dtype (as CosyVoice2Model.token2wav does),
  HiFT outside it;
- CosyVoice3: the flow AND the causal HiFT under autocast (CosyVoice3Model.token2wav puts both
  inside `torch.cuda.amp.autocast(fp16)`; its F0 predictor runs in float64, which autocast leaves
  alone); `finalize=True`, no prompt.
Prints a table and writes JSON.

Usage: bench_reference_token2wav.py --official DIR [--family cosyvoice2|cosyvoice3 --snapshot DIR]
       [--seconds 10] [--repeats 5] [--out FILE.json]
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_parity_fixtures as mpf  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--official", required=True)
    ap.add_argument("--family", default="cosyvoice2", choices=("cosyvoice2", "cosyvoice3"))
    ap.add_argument("--snapshot", default=None, help="cosyvoice3: a FunAudioLLM/CosyVoice checkout (make_cv3_fixtures.py)")
    ap.add_argument("--site", default=None, help="cosyvoice3: where x-transformers and hyperpyyaml are")
    ap.add_argument("--config", default="full", choices=sorted(mpf.CONFIGS))
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--precisions", default="fp32,fp16,bf16")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    cv3 = args.family == "cosyvoice3"
    if cv3:
        if not args.snapshot:
            sys.exit("--family cosyvoice3 needs --snapshot (a FunAudioLLM/CosyVoice checkout)")
        import make_cv3_fixtures as mcf
        ref = mcf.import_reference(args.snapshot, args.site)
        with open(os.path.join(args.official, "cosyvoice3.yaml")) as f:
            flow, hift = mcf.build(ref, f.read())
        vocab = mcf.convert_cosyvoice.cosyvoice3_config(os.path.join(args.official, "cosyvoice3.yaml"))["vocab_size"]
    else:
        ref = mpf.import_reference()
        flow, hift = mpf.build(ref, mpf.CONFIGS[args.config])
        vocab = mpf.CONFIGS[args.config]["vocab_size"]
    flow.load_state_dict(torch.load(os.path.join(args.official, "flow.pt"), map_location="cpu"))
    hift.load_state_dict(torch.load(os.path.join(args.official, "hift.pt"), map_location="cpu"))
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    flow, hift = flow.to(dev).eval(), hift.to(dev).eval()
    n_tok = int(round(args.seconds * 25))
    gen = torch.Generator().manual_seed(7)
    token = torch.randint(0, vocab, (1, n_tok), generator=gen).to(dev)
    emb = torch.randn(1, 192, generator=gen).to(dev)
    empty_tok = torch.zeros(1, 0, dtype=torch.long, device=dev)
    empty_feat = torch.zeros(1, 0, 80, device=dev)
    dtypes = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}

    def once(dtype):
        with torch.inference_mode():
            with torch.autocast(dev.type, dtype=dtype or torch.float32, enabled=dtype is not None):
                mel, _ = flow.inference(token=token, token_len=torch.tensor([n_tok], device=dev), prompt_token=empty_tok,
                                        prompt_token_len=torch.tensor([0], device=dev), prompt_feat=empty_feat,
                                        prompt_feat_len=torch.tensor([0], device=dev), embedding=emb,
                                        streaming=False, finalize=True)
                if cv3:
                    wav, _ = hift.inference(speech_feat=mel, finalize=True)
            if not cv3:
                wav, _ = hift.inference(speech_feat=mel.float())
        return wav

    rows = []
    for name in args.precisions.split(","):
        dtype = dtypes[name]
        once(dtype)
        if dev.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            wav = once(dtype)
            if dev.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        t = statistics.median(times)
        audio = wav.shape[-1] / 24000
        peak = torch.cuda.max_memory_allocated() if dev.type == "cuda" else None
        rows.append({"precision": name, "batch": 1, "seconds": t, "audio_seconds": audio,
                     "audio_seconds_per_second": audio / t, "peak_memory_bytes": peak})
        print(f"reference {name} batch 1: {t:.3f} s for {audio:.1f} s of audio = {audio / t:.1f} audio-s/s, "
              f"peak {peak / 2**30 if peak else 0:.2f} GiB", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"family": args.family, "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
                       "torch": torch.__version__, "utterance_tokens": n_tok, "repeats": args.repeats, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
