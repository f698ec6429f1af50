"""Parity fixtures for voxbatch's prompt-recording pipeline (src/voice/, issue 15): signals and what
the reference's own tools make of them — `torchaudio.transforms.Resample` (CosyVoice's `load_wav`
resamples with it) at the rates prompts arrive in, and the speaker embedding's input (Kaldi fbank,
80 bins, mean removed, `frontend._extract_spk_embedding`), the speech tokenizer's input (Whisper's
128-bin log-mel, s3tokenizer's copy) and the flow's prompt mel (the reference package's matcha
`mel_spectrogram`). Needs torchaudio and s3tokenizer (both `--no-deps`; bootstrap installs them). Written to OUT/voice_parity.safetensors for
tests/voice.rs; deterministic for a seed.

  python tools/make_voice_fixtures.py --out models/voice-parity
"""
import argparse
import math
import os

import torch
import torchaudio
from safetensors.torch import save_file

# (from, to): common recording rates to the 16 kHz of the speech tokenizer and speaker
# embedding and the 24 kHz of the prompt mel.
RESAMPLES = [(24000, 16000), (44100, 16000), (48000, 16000), (22050, 24000), (16000, 24000), (48000, 24000)]


def signal(rate, seconds, gen):
    """Noise plus a sweep: energy across the band, so the filter's every tap matters."""
    n = int(rate * seconds)
    t = torch.arange(n, dtype=torch.float64) / rate
    sweep = 0.3 * torch.sin(2 * math.pi * (100 * t + 0.5 * (rate / 2.2 - 100) / seconds * t * t))
    noise = 0.1 * torch.randn(n, generator=gen, dtype=torch.float64)
    return (sweep + noise).float()


def reference_log_mel_spectrogram():
    """s3tokenizer's utils.log_mel_spectrogram, loaded from its file; `onnx` (imported there for
    the models, unused by this function) is stubbed when absent."""
    import importlib.util
    import sys
    import types
    if importlib.util.find_spec("onnx") is None:
        sys.modules.setdefault("onnx", types.ModuleType("onnx"))
    root = importlib.util.find_spec("s3tokenizer").submodule_search_locations[0]
    spec = importlib.util.spec_from_file_location("s3tokenizer_utils", os.path.join(root, "utils.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.log_mel_spectrogram


def reference_mel_spectrogram():
    import importlib.util
    import sys
    import types
    root = importlib.util.find_spec("matcha").submodule_search_locations[0]
    filters = types.ModuleType("librosa.filters")

    def mel(sr, n_fft, n_mels, fmin, fmax):
        fb = torchaudio.functional.melscale_fbanks(n_fft // 2 + 1, float(fmin), float(fmax), n_mels, sr, norm="slaney", mel_scale="slaney")
        return fb.T.numpy()

    filters.mel = mel
    sys.modules.setdefault("librosa", types.ModuleType("librosa"))
    sys.modules["librosa.filters"] = filters
    spec = importlib.util.spec_from_file_location("matcha_audio", os.path.join(root, "utils", "audio.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.mel_spectrogram


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=5)
    a = ap.parse_args()
    gen = torch.Generator().manual_seed(a.seed)
    tensors = {}
    for src, dst in RESAMPLES:
        x = signal(src, 1.37, gen)
        y = torchaudio.transforms.Resample(orig_freq=src, new_freq=dst)(x[None])[0]
        tensors[f"resample.{src}.{dst}.in"] = x.contiguous()
        tensors[f"resample.{src}.{dst}.out"] = y.contiguous()
    # The speaker embedding's input (frontend._extract_spk_embedding): Kaldi fbank, mean removed.
    import torchaudio.compliance.kaldi as kaldi
    speech = signal(16000, 2.13, gen)[None]
    feat = kaldi.fbank(speech, num_mel_bins=80, dither=0, sample_frequency=16000)
    tensors["fbank.in"] = speech[0].contiguous()
    tensors["fbank.out"] = (feat - feat.mean(dim=0, keepdim=True)).contiguous()
    tensors["fbank.raw"] = feat.contiguous()
    # The same in float64: the reference's float32 rounding alone moves it by ≈ 3e-4.
    feat64 = kaldi.fbank(speech.double(), num_mel_bins=80, dither=0, sample_frequency=16000)
    tensors["fbank.raw64"] = feat64.contiguous()
    tensors["fbank.out64"] = (feat64 - feat64.mean(dim=0, keepdim=True)).contiguous()
    # The flow's prompt mel (frontend._extract_speech_feat): the reference package's own
    # matcha.utils.audio.mel_spectrogram, loaded from its file (the package's __init__ wants hydra).
    # librosa is not installed: its Slaney filter bank comes from torchaudio's documented
    # equivalent (melscale_fbanks, norm and scale "slaney").
    mel_spectrogram = reference_mel_spectrogram()
    speech24 = signal(24000, 1.91, gen)[None]
    args = dict(n_fft=1920, num_mels=80, sampling_rate=24000, hop_size=480, win_size=1920, fmin=0, fmax=8000, center=False)
    tensors["mel.in"] = speech24[0].contiguous()
    tensors["mel.out"] = mel_spectrogram(speech24, **args).squeeze(0).transpose(0, 1).contiguous()
    # The speech tokenizer's input (frontend._extract_speech_token): whisper.log_mel_spectrogram,
    # 128 bins — s3tokenizer's copy, with its librosa-made filter bank (mel_filters.npz).
    log_mel_spectrogram = reference_log_mel_spectrogram()
    speech16 = signal(16000, 2.57, gen)
    tensors["whisper.in"] = speech16.contiguous()
    tensors["whisper.out"] = log_mel_spectrogram(speech16, n_mels=128).transpose(0, 1).contiguous()
    os.makedirs(a.out, exist_ok=True)
    save_file(tensors, os.path.join(a.out, "voice_parity.safetensors"))
    print(f"wrote {a.out}/voice_parity.safetensors: {len(RESAMPLES)} resamplings (torchaudio {torchaudio.__version__})")


if __name__ == "__main__":
    main()
