"""The vocoder stage both families compile (`hift`): HiFT's convolutional body (`HiftBody`) — mel
and the harmonic source's STFT in, the 18 log-magnitude/phase channels out — as voxbatch's batched,
masked generator computes it between its source STFT and its iSTFT (src/model/vocoder/generator.rs
`HiftGenerator::body`; the F0 predictor, the source, the STFT and the iSTFT stay eager in the
worker). Its two layouts are the families' (src/model/vocoder/mod.rs `Layout`): `centred`
(CosyVoice2's `HiFTGenerator`) and `causal` (CosyVoice3's `CausalHiFTGenerator`); with the forms
a variant may compute it in (channels-last tensors, padded STFT channels, phase-split dilations:
layouts.py), its example inputs and its dynamic shapes. Each family's hift.py builds it from its
model directory (families/cosyvoice2/hift.py, families/cosyvoice3/hift.py)."""
import torch

from . import layouts
from .layouts import HIFT_DILATIONS

# HiFT's fixed architecture (src/model/vocoder/mod.rs has the same constants).
UPSAMPLE, UP_KERNELS, RES_KERNELS, SOURCE_KERNELS, DILATIONS = [8, 5, 3], [16, 11, 7], [3, 7, 11], [7, 7, 11], [1, 3, 5]
SOURCE_DOWN_RATES, N_FFT = [15, 3, 1], 16
LAYOUTS = ("centred", "causal")


class HiftBody(torch.nn.Module):
    """voxbatch's batched HiFT between the source STFT and the iSTFT (generator.rs
    `HiftGenerator::decode`): mel `[B, 80, T]`, the source's STFT `[B, 18, 120·T + 1]` and each
    item's mel frames `[B]` (int64) → conv_post's 18 channels `[B, 18, 120·T + 1]`, fp32. After
    every convolution the positions past an item's length are zeroed, as the eager port does, so a
    padded batch equals unbatched runs. Weights are the model's `hift.*` (weight norm already
    folded by the converter).

    `layout` (the family's): `centred` — CosyVoice2's convolutions padded on both sides, `conv_pre`
    of kernel 7, transposed-convolution upsampling, source downsampling padded `u/2` each side; or
    `causal` — CosyVoice3's, every convolution padded on the left only except `conv_pre` (kernel
    `conv_pre_look_right + 1`, looking that many frames ahead), upsampling by nearest repetition
    then a causal convolution, source downsampling padded `u − 1` on the left.

    `time_major` (`--layout` other than reference): the same computation on `[B, C, 1, T]`
    tensors in channels-last memory (each frame's channels contiguous, the layout cuDNN's
    convolution kernels take), the convolutions as 2-D ones of height 1 — so cuDNN does not convert
    every convolution's input and output between layouts (≈ 0.1 s of CosyVoice2's compiled vocoder's
    0.48 s per batch of 128 on the H200, 2026-12-04). Inputs and output keep the channel-major
    `[B, C, T]` interface.

    `channel_multiple` (`--hift-channel-multiple`; 4, the default since 2026-12-05; 8 measured no
    faster on an H100): the convolutions on the 18 STFT channels — the source downsamplers' input
    and conv_post's output — padded with zero channels to a multiple of this (4 → 20,
    `layouts.pad_channels`), the padded outputs dropped: same result. cuDNN's fast TF32 kernels
    want channel counts in multiples of 4 (16 bytes); the profile of CosyVoice2's compiled vocoder
    (H200, 2026-12-05, batch 128) shows six calls of a slow "analytic" TF32 kernel (6 ms each) and
    70 layout conversions beside its other convolutions.

    `dilation="phases"` (`--hift-dilation phases`, the default with a time-major layout since
    2026-12-05; time-major only): each dilated convolution (the resblocks' first convolutions
    at dilations 3 and 5) as an undilated one over the time axis split into `dilation` phases
    (`layouts.phase_conv`, centred or causal as the layout pads): same products and sums. The six
    slow "analytic" calls above are as many as the dilated convolutions of kernel 7 and 11 at the
    highest resolution; the other high-resolution convolutions take ≈ 2.1 ms a call there."""

    def __init__(self, weights, channels, device_type, dtype, time_major=False, channel_multiple=1, dilation="dilated",
                 layout="centred", conv_pre_look_right=0):
        super().__init__()
        if layout not in LAYOUTS:
            raise ValueError(f"vocoder layout {layout!r}: one of {LAYOUTS}")
        self.causal, self.look_right = layout == "causal", conv_pre_look_right
        self.names = {}
        stft = N_FFT + 2
        self.stft_padding = -stft % channel_multiple
        for k, v in weights.items():
            name = k.replace(".", "__")
            v = v.float()
            if self.stft_padding and k.startswith("source_downs.") and k.endswith(".weight"):
                v = layouts.pad_channels(v, 1, channel_multiple)  # [C_out, 18 + pad, kernel]
            elif self.stft_padding and k.startswith("conv_post."):
                v = layouts.pad_channels(v, 0, channel_multiple)  # 18 + pad outputs
            if time_major and v.dim() == 3:  # convolution weights as 2-D kernels of height 1
                v = v.unsqueeze(2).contiguous(memory_format=torch.channels_last)
            self.register_buffer(name, v)
            self.names[k] = name
        self.channels, self.device_type, self.dtype, self.time_major = channels, device_type, dtype, time_major
        if dilation not in HIFT_DILATIONS or (dilation == "phases" and not time_major):
            raise ValueError(f"--hift-dilation {dilation}: one of {HIFT_DILATIONS}, phases with a time-major layout")
        self.phase_dilation = dilation == "phases"

    def w(self, key):
        return getattr(self, self.names[key])

    def conv(self, x, prefix, stride=1, dilation=1, padding=None):
        """A convolution with `padding` zeros on both sides, or `(left, right)`; by default the
        layout's: centred, or `dilation · (kernel − 1)` on the left (causal) — a dilated one of
        those split into phases with `dilation="phases"`."""
        weight, bias = self.w(f"{prefix}.weight"), self.w(f"{prefix}.bias")
        kernel = weight.shape[-1]
        if padding is None:
            if self.time_major and self.phase_dilation and dilation > 1 and stride == 1:
                return layouts.phase_conv(x, weight, bias, dilation, causal=self.causal)
            padding = (dilation * (kernel - 1), 0) if self.causal else dilation * (kernel - 1) // 2
        if isinstance(padding, tuple):
            left, right = padding
            if left != right:
                x, padding = torch.nn.functional.pad(x, (left, right)), 0
            else:
                padding = left
        if self.time_major:
            return torch.nn.functional.conv2d(x, weight, bias, (1, stride), (0, padding), (1, dilation))
        return torch.nn.functional.conv1d(x, weight, bias, stride, padding, dilation)

    def upsample(self, x, i, stride, kernel):
        bias = self.w(f"ups.{i}.bias")
        if self.causal:  # nearest repetition, then a causal convolution
            scale = (1.0, float(stride)) if self.time_major else float(stride)
            return self.conv(torch.nn.functional.interpolate(x, scale_factor=scale, mode="nearest"), f"ups.{i}")
        weight, padding = self.w(f"ups.{i}.weight"), (kernel - stride) // 2
        if self.time_major:
            return torch.nn.functional.conv_transpose2d(x, weight, bias, (1, stride), (0, padding))
        return torch.nn.functional.conv_transpose1d(x, weight, bias, stride, padding)

    def snake(self, x, alpha):
        alpha = alpha.view(1, -1, 1, 1) if self.time_major else alpha.view(1, -1, 1)
        return x + (alpha + 1e-9).reciprocal() * torch.sin(x * alpha).pow(2)

    def resblock(self, x, prefix, mask):
        for i, d in enumerate(DILATIONS):
            xt = self.conv(self.snake(x, self.w(f"{prefix}.activations1.{i}.alpha")), f"{prefix}.convs1.{i}", dilation=d) * mask
            xt = self.conv(self.snake(xt, self.w(f"{prefix}.activations2.{i}.alpha")), f"{prefix}.convs2.{i}") * mask
            x = xt + x
        return x

    def source_down(self, s_stft, i):
        r = SOURCE_DOWN_RATES[i]
        if r == 1:
            return self.conv(s_stft, f"source_downs.{i}", padding=0)
        return self.conv(s_stft, f"source_downs.{i}", stride=r, padding=(r - 1, 0) if self.causal else r // 2)

    def body(self, mel, s_stft, frames):
        t = mel.shape[-1]

        def mask(scale, extra):
            positions = torch.arange(t * scale + extra, device=mel.device).unsqueeze(0)
            valid = (positions < (frames * scale + extra).unsqueeze(1)).float().unsqueeze(1)
            return valid.unsqueeze(2) if self.time_major else valid

        mel_mask = mask(1, 0)
        pre = (0, self.look_right) if self.causal else None
        x = self.conv(mel * mel_mask, "conv_pre", padding=pre) * mel_mask
        scale = 1
        for i, (u, k) in enumerate(zip(UPSAMPLE, UP_KERNELS)):
            x = torch.maximum(x, x * 0.1)
            x = self.upsample(x, i, u, k)
            scale *= u
            extra = 1 if i == 2 else 0
            if i == 2:
                x = torch.nn.functional.pad(x, (1, 0, 0, 0) if self.time_major else (1, 0), mode="reflect")
            m = mask(scale, extra)
            x = x * m
            x = x + self.resblock(self.source_down(s_stft, i) * m, f"source_resblocks.{i}", m)
            xs = self.resblock(x, f"resblocks.{3 * i}", m)
            for j in (1, 2):
                xs = xs + self.resblock(x, f"resblocks.{3 * i + j}", m)
            x = xs / 3.0
        out = self.conv(torch.nn.functional.leaky_relu(x), "conv_post").float()
        if self.stft_padding:
            out = out[:, :N_FFT + 2]
        return out.squeeze(2).contiguous() if self.time_major else out

    def forward(self, mel, s_stft, frames):
        if self.stft_padding:
            s_stft = torch.nn.functional.pad(s_stft, (0, 0, 0, self.stft_padding))
        if self.time_major:
            mel, s_stft = (x.unsqueeze(2).contiguous(memory_format=torch.channels_last) for x in (mel, s_stft))
        if self.dtype is None:
            return self.body(mel, s_stft, frames)
        with torch.autocast(self.device_type, dtype=self.dtype):
            return self.body(mel, s_stft, frames)


def hift_inputs(batch, frames, device, seed=0):
    """Example inputs of the body: `batch` mels of `frames` frames, the last one shorter (zero past
    its end, as the worker pads), and random STFT channels."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.full((batch,), frames, dtype=torch.int64)
    lengths[-1] = frames * 3 // 4  # one shorter item
    mel = torch.randn(batch, 80, frames, generator=g)
    mel[-1, :, lengths[-1]:] = 0
    s_stft = torch.randn(batch, N_FFT + 2, 120 * frames + 1, generator=g)
    s_stft[-1, :, 120 * lengths[-1] + 1:] = 0
    return mel.to(device), s_stft.to(device), lengths.to(device)


def hift_shapes(max_batch, max_frames, bounded=True):
    batch = torch.export.Dim("batch", min=1, max=max_batch)
    if not bounded:
        # `--hift-dilation phases`: the phase split's floor divisions make guards that hold for every
        # length but cannot be proven within a bounded Dim; DYNAMIC keeps them as runtime checks (the
        # worker keeps to voxbatch.max_frames itself).
        return {"mel": {0: batch, 2: torch.export.Dim.DYNAMIC}, "s_stft": {0: batch, 2: torch.export.Dim.DYNAMIC},
                "frames": {0: batch}}
    frames = torch.export.Dim("frames", min=2, max=max_frames)
    return {"mel": {0: batch, 2: frames}, "s_stft": {0: batch, 2: 120 * frames + 1}, "frames": {0: batch}}
