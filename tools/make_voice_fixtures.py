"""Parity fixtures for voxbatch's prompt-recording pipeline (src/voice/, issue 15): signals and what
the reference's own tools make of them — `torchaudio.transforms.Resample` (CosyVoice's `load_wav`
resamples with it) at the rates prompts arrive in, and the speaker embedding's input (Kaldi fbank,
80 bins, mean removed, `frontend._extract_spk_embedding`), the speech tokenizer's input (Whisper's
128-bin log-mel, s3tokenizer's copy) and the flow's prompt mel (the reference package's matcha
`mel_spectrogram`). Needs torchaudio and s3tokenizer (both `--no-deps`; bootstrap installs them). Written to OUT/voice_parity.safetensors for
tests/voice.rs; deterministic for a seed.

Also writes small random stand-ins for the checkpoint's two ONNX models with the official files'
names, inputs and outputs — OUT/speech_tokenizer_v2.onnx (and a copy as CosyVoice3's
speech_tokenizer_v3.onnx, whose inputs and outputs are the same) (feats float[1,128,T], feats_length
int32[1] -> int32[1,ceil(T/4)] tokens below --vocab, 25 Hz as v2's two stride-2 convolutions make
them) and OUT/campplus.onnx (float[1,T,80] fbank -> float[1,192]) — and what the reference frontend
(`frontend_zero_shot`'s prompt half, run with onnxruntime as the reference runs them) makes of a
22.05 kHz recording: speech tokens, x-vector and prompt mel, trimmed to two frames per token —
CosyVoice2's (`prompt.*`) and CosyVoice3's (`prompt3.*`: the v3 file, a mel without fmax).
Random weights: the tokens and x-vector mean nothing; they check the plumbing. Needs onnx and
onnxruntime (bootstrap installs both).

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
        # librosa's default: no fmax is half the sampling rate (CosyVoice3's feat_extractor).
        fmax = sr / 2 if fmax is None else fmax
        fb = torchaudio.functional.melscale_fbanks(n_fft // 2 + 1, float(fmin), float(fmax), n_mels, sr, norm="slaney", mel_scale="slaney")
        return fb.T.numpy()

    filters.mel = mel
    sys.modules.setdefault("librosa", types.ModuleType("librosa"))
    sys.modules["librosa.filters"] = filters
    spec = importlib.util.spec_from_file_location("matcha_audio", os.path.join(root, "utils", "audio.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.mel_spectrogram


def write_prompt_models(out, vocab, seed):
    """Random stand-ins for speech_tokenizer_v2.onnx and campplus.onnx (official I/O)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(seed)
    w1 = numpy_helper.from_array((rng.standard_normal((16, 128, 3)) * 0.1).astype(np.float32), "conv1.weight")
    w2 = numpy_helper.from_array((rng.standard_normal((vocab, 16, 3)) * 0.3).astype(np.float32), "conv2.weight")
    zero = numpy_helper.from_array(np.zeros((1,), dtype=np.int64), "zero")
    nodes = [
        helper.make_node("Conv", ["feats", "conv1.weight"], ["h1"], strides=[2], pads=[1, 1], kernel_shape=[3]),
        helper.make_node("Tanh", ["h1"], ["a1"]),
        helper.make_node("Conv", ["a1", "conv2.weight"], ["logits"], strides=[2], pads=[1, 1], kernel_shape=[3]),
        helper.make_node("ArgMax", ["logits"], ["ids"], axis=1, keepdims=0),
        # The length input is read (as the real model reads it) without changing the result.
        helper.make_node("Cast", ["feats_length"], ["len64"], to=TensorProto.INT64),
        helper.make_node("Mul", ["len64", "zero"], ["nothing"]),
        helper.make_node("Add", ["ids", "nothing"], ["ids_plus"]),
        helper.make_node("Cast", ["ids_plus"], ["indices"], to=TensorProto.INT32),
    ]
    graph = helper.make_graph(
        nodes, "speech_tokenizer_v2_stand_in",
        [helper.make_tensor_value_info("feats", TensorProto.FLOAT, [1, 128, "T"]),
         helper.make_tensor_value_info("feats_length", TensorProto.INT32, [1])],
        [helper.make_tensor_value_info("indices", TensorProto.INT32, [1, "L"])],
        [w1, w2, zero])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    onnx.save(model, os.path.join(out, "speech_tokenizer_v2.onnx"))

    w = numpy_helper.from_array((rng.standard_normal((80, 192)) * 0.2).astype(np.float32), "proj.weight")
    b = numpy_helper.from_array((rng.standard_normal((192,)) * 0.1).astype(np.float32), "proj.bias")
    nodes = [
        helper.make_node("ReduceMean", ["input"], ["pooled"], axes=[1], keepdims=0),
        helper.make_node("MatMul", ["pooled", "proj.weight"], ["projected"]),
        helper.make_node("Add", ["projected", "proj.bias"], ["output"]),
    ]
    graph = helper.make_graph(
        nodes, "campplus_stand_in",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, "T", 80])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 192])],
        [w, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    onnx.save(model, os.path.join(out, "campplus.onnx"))


def reference_prompt(out, speech, rate, log_mel_spectrogram, mel_spectrogram, tokenizer_file="speech_tokenizer_v2.onnx", fmax=8000, key="prompt"):
    """frontend_zero_shot's prompt half on `speech` (mono, `rate` Hz): load_wav's resampling,
    _extract_speech_token, _extract_spk_embedding, _extract_speech_feat and the 2-frames-per-token
    trim, with onnxruntime as the reference configures it. CosyVoice2's speech tokenizer and mel
    (fmax 8000) by default; CosyVoice3's: speech_tokenizer_v3.onnx, fmax None."""
    import numpy as np
    import onnxruntime
    import torchaudio.compliance.kaldi as kaldi
    option = onnxruntime.SessionOptions()
    option.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    option.intra_op_num_threads = 1
    tokenizer = onnxruntime.InferenceSession(os.path.join(out, tokenizer_file), sess_options=option, providers=["CPUExecutionProvider"])
    campplus = onnxruntime.InferenceSession(os.path.join(out, "campplus.onnx"), sess_options=option, providers=["CPUExecutionProvider"])
    speech16 = torchaudio.transforms.Resample(orig_freq=rate, new_freq=16000)(speech[None])
    speech24 = torchaudio.transforms.Resample(orig_freq=rate, new_freq=24000)(speech[None])
    feat = log_mel_spectrogram(speech16, n_mels=128)
    tokens = tokenizer.run(None, {tokenizer.get_inputs()[0].name: feat.detach().cpu().numpy(),
                                  tokenizer.get_inputs()[1].name: np.array([feat.shape[2]], dtype=np.int32)})[0].flatten().tolist()
    fbank = kaldi.fbank(speech16, num_mel_bins=80, dither=0, sample_frequency=16000)
    fbank = fbank - fbank.mean(dim=0, keepdim=True)
    embedding = campplus.run(None, {campplus.get_inputs()[0].name: fbank.unsqueeze(dim=0).cpu().numpy()})[0].flatten().tolist()
    args = dict(n_fft=1920, num_mels=80, sampling_rate=24000, hop_size=480, win_size=1920, fmin=0, fmax=fmax, center=False)
    speech_feat = mel_spectrogram(speech24, **args).squeeze(dim=0).transpose(0, 1)
    token_len = min(int(speech_feat.shape[0] / 2), len(tokens))
    return {
        f"{key}.in": speech.clone().contiguous(),
        f"{key}.tokens": torch.tensor(tokens[:token_len], dtype=torch.int64),
        f"{key}.embedding": torch.tensor(embedding, dtype=torch.float32),
        f"{key}.mel": speech_feat[: 2 * token_len].contiguous(),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--vocab", type=int, default=64, help="speech tokens of the stand-in tokenizer (the tiny model's 64)")
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
    tensors["mel.cv3.out"] = mel_spectrogram(speech24, **dict(args, fmax=None)).squeeze(0).transpose(0, 1).contiguous()
    # The speech tokenizer's input (frontend._extract_speech_token): whisper.log_mel_spectrogram,
    # 128 bins — s3tokenizer's copy, with its librosa-made filter bank (mel_filters.npz).
    log_mel_spectrogram = reference_log_mel_spectrogram()
    speech16 = signal(16000, 2.57, gen)
    tensors["whisper.in"] = speech16.contiguous()
    tensors["whisper.out"] = log_mel_spectrogram(speech16, n_mels=128).transpose(0, 1).contiguous()
    os.makedirs(a.out, exist_ok=True)
    write_prompt_models(a.out, a.vocab, a.seed)
    prompt_speech = signal(22050, 2.61, gen)
    tensors.update(reference_prompt(a.out, prompt_speech, 22050, log_mel_spectrogram, mel_spectrogram))
    # CosyVoice3's prompt half: its speech tokenizer's file (the stand-in: the same random model,
    # since v3's inputs and outputs are v2's) and its mel without fmax.
    import shutil
    shutil.copyfile(os.path.join(a.out, "speech_tokenizer_v2.onnx"), os.path.join(a.out, "speech_tokenizer_v3.onnx"))
    tensors.update(reference_prompt(a.out, prompt_speech, 22050, log_mel_spectrogram, mel_spectrogram,
                                    tokenizer_file="speech_tokenizer_v3.onnx", fmax=None, key="prompt3"))
    save_file(tensors, os.path.join(a.out, "voice_parity.safetensors"))
    print(f"wrote {a.out}/voice_parity.safetensors: {len(RESAMPLES)} resamplings (torchaudio {torchaudio.__version__})")


if __name__ == "__main__":
    main()
