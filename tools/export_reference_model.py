#!/usr/bin/env python3
"""Export voxbatch's reference model: a CNN TTS-shaped network with random weights.

The audio it produces is NOT speech. The network reproduces the compute and memory shape of a
CNN text-to-speech stack (embedding -> 1-D conv encoder -> length regulator -> conv decoder ->
HiFi-GAN-style transposed-conv upsampler -> waveform) so that batching, memory and cost can be
measured anywhere, with weights drawn from a fixed seed.

Usage: tools/export_reference_model.py --size tiny|base|large --out models/reference-tiny

Writes OUT/model.pt (TorchScript) and OUT/model.toml (the manifest voxbatch reads).
"""
import argparse
import math
import os
from typing import List, Tuple

import torch
from torch import Tensor, nn

SIZES = {
    # vocab, emb, enc channels/layers, dec channels/layers, upsampler channels, resblock kernels
    "tiny": dict(emb=64, enc=64, enc_layers=2, dec=64, dec_layers=2, up=64, kernels=[3]),
    "base": dict(emb=256, enc=256, enc_layers=4, dec=256, dec_layers=4, up=256, kernels=[3, 7]),
    "large": dict(emb=512, enc=512, enc_layers=6, dec=512, dec_layers=6, up=512, kernels=[3, 7, 11]),
}
VOCAB_SIZE = 4096
SAMPLE_RATE = 24000
FRAMES_PER_TOKEN = 6
UP_RATES = [5, 4, 3, 4]  # 240 samples per frame: 100 frames per second at 24 kHz
DILATIONS = [1, 3, 5]
VOICES = ["default", "narrator", "bright", "deep"]


class ResBlock(nn.Module):
    """HiFi-GAN-style residual block: dilated convolutions with leaky ReLU."""

    def __init__(self, ch: int, kernel: int):
        super().__init__()
        self.convs = nn.ModuleList(
            [nn.Conv1d(ch, ch, kernel, dilation=d, padding=d * (kernel - 1) // 2) for d in DILATIONS]
        )

    def forward(self, x: Tensor) -> Tensor:
        for conv in self.convs:
            x = x + conv(nn.functional.leaky_relu(x, 0.1))
        return x


class UpStage(nn.Module):
    """One upsampling stage: transposed conv by `rate`, then the mean of parallel resblocks."""

    def __init__(self, cin: int, cout: int, rate: int, kernels: List[int]):
        super().__init__()
        self.rate = rate
        self.up = nn.ConvTranspose1d(cin, cout, 2 * rate, stride=rate, padding=rate // 2)
        self.blocks = nn.ModuleList([ResBlock(cout, k) for k in kernels])

    def forward(self, x: Tensor) -> Tensor:
        n = x.size(2) * self.rate
        x = self.up(nn.functional.leaky_relu(x, 0.1))[:, :, :n]
        acc = torch.zeros_like(x)
        for block in self.blocks:
            acc = acc + block(x)
        return acc / float(len(self.blocks))


class ReferenceTTS(nn.Module):
    def __init__(self, emb: int, enc: int, enc_layers: int, dec: int, dec_layers: int, up: int, kernels: List[int]):
        super().__init__()
        self.frames_per_token = FRAMES_PER_TOKEN
        self.samples_per_frame = int(math.prod(UP_RATES))
        self.embed = nn.Embedding(VOCAB_SIZE, emb, padding_idx=0)
        self.speaker = nn.Embedding(len(VOICES), enc)
        self.enc_in = nn.Conv1d(emb, enc, 1)
        self.encoder = nn.ModuleList([nn.Conv1d(enc, enc, 5, padding=2) for _ in range(enc_layers)])
        self.dec_in = nn.Conv1d(enc, dec, 1)
        self.decoder = nn.ModuleList([nn.Conv1d(dec, dec, 5, padding=2) for _ in range(dec_layers)])
        self.pre = nn.Conv1d(dec, up, 7, padding=3)
        stages = []
        ch = up
        for rate in UP_RATES:
            stages.append(UpStage(ch, ch // 2, rate, kernels))
            ch = ch // 2
        self.stages = nn.ModuleList(stages)
        self.post = nn.Conv1d(ch, 1, 7, padding=3)

    def forward(self, tokens: Tensor, lengths: Tensor, speakers: Tensor) -> Tuple[Tensor, Tensor]:
        t = tokens.size(1)
        mask = (torch.arange(t, device=tokens.device)[None, :] < lengths[:, None]).unsqueeze(1).to(torch.float32)
        x = self.enc_in(self.embed(tokens).transpose(1, 2)) * mask
        x = x + self.speaker(speakers).unsqueeze(2)
        for conv in self.encoder:
            x = (x + torch.relu(conv(x))) * mask
        # length regulator: a fixed number of frames per token
        x = x.repeat_interleave(self.frames_per_token, dim=2)
        fmask = mask.repeat_interleave(self.frames_per_token, dim=2)
        x = self.dec_in(x) * fmask
        for conv in self.decoder:
            x = (x + torch.relu(conv(x))) * fmask
        x = self.pre(x)
        for stage in self.stages:
            x = stage(x)
        audio = torch.tanh(self.post(nn.functional.leaky_relu(x, 0.1))).squeeze(1).to(torch.float32)
        audio_lengths = lengths * self.frames_per_token * self.samples_per_frame
        smask = torch.arange(audio.size(1), device=audio.device)[None, :] < audio_lengths[:, None]
        return audio * smask.to(audio.dtype), audio_lengths


def manifest(name: str, size: str, seed: int) -> str:
    voices = ", ".join(f'"{v}"' for v in VOICES)
    return f"""# voxbatch model manifest (written by tools/export_reference_model.py)
# The reference model's audio is not speech: random weights, CNN TTS compute shape.
name = "{name}"
kind = "torchscript"
description = "voxbatch reference CNN TTS network, size {size}, random weights (seed {seed})"
sample_rate = {SAMPLE_RATE}
frames_per_token = {FRAMES_PER_TOKEN}
samples_per_frame = {int(math.prod(UP_RATES))}
voices = [{voices}]

[tokenizer]
kind = "codepoint"
vocab_size = {VOCAB_SIZE}

[signature]
inputs = ["tokens:int64[B,T]", "lengths:int64[B]", "speakers:int64[B]"]
outputs = ["audio:float32[B,S]", "audio_lengths:int64[B]"]
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=sorted(SIZES), default="tiny")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    model = ReferenceTTS(**SIZES[args.size]).eval()
    # Keep weights small so the untrained network's waveform stays in [-1, 1] without saturating.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.mul_(0.5)
    scripted = torch.jit.script(model)
    os.makedirs(args.out, exist_ok=True)
    scripted.save(os.path.join(args.out, "model.pt"))
    name = f"reference-{args.size}"
    with open(os.path.join(args.out, "model.toml"), "w") as f:
        f.write(manifest(name, args.size, args.seed))
    params = sum(p.numel() for p in model.parameters())
    print(f"wrote {args.out}: {name}, {params / 1e6:.2f} M parameters")


if __name__ == "__main__":
    main()
