"""The flow estimator in a time-major layout, for compiling (issue 16): the reference
`CausalConditionalDecoder` (PyPI `token2wav-cosyvoice`, cosyvoice/flow/decoder.py) computed on
`[B, T, C]` from its first layer to its last, with the reference module's own weights and
submodules. tools/compile_token2wav.py exports this forward (`--layout time-major`) in place of the
reference's.

Why: the reference keeps its ResNet blocks channel-major (`[B, C, T]`, cuDNN convolutions) and
turns every block's activations around twice — a transpose into and out of each LayerNorm over
channels, and a `rearrange(...).contiguous()` around each level's transformer blocks. Compiled on
the H200 (2026-12-04, batch 128), the kernels that fuse those layer norms with the transposes took
≈ 0.4 s of the flow's 1.35 s, and cuDNN added layout conversions around every bf16 convolution.
Here the layer norms run over each frame's contiguous channels, the transformer blocks take the
activations as they are, and each causal convolution (kernel 3, left padding 2) is one matmul over
the three frames it sees laid side by side (`[B, T, 3·C]`), so no transpose remains between the
input and the output. Measured on the H200 (2026-12-04, batch 128, with the channels-last HiFT
body): token2wav 840.5 audio-s/s against 664.6 with the reference's layout, flow steps 1.35 →
1.10 s. The kernel that lays the frames side by side is now the slowest element-wise one (0.84 ms
a call); `TimeMajorDecoder(conv="cudnn")` (`--layout time-major-cudnn`) gives
cuDNN the padded frames as a channels-last view instead: measured slower (832.8 against 885.0
audio-s/s, 2026-12-04 session 12: cuDNN still converts layouts around each bf16 convolution).
That kernel is slow because inductor builds the `torch.cat` of three shifted frames on CUDA as
one element-wise kernel evaluating each input's expression (the block's Mish of its layer norm,
the time embedding) under a mask for every output; `TimeMajorDecoder(conv="strided")`
(`--layout time-major-strided`, session 19's default) copies the window from a strided view of the
padded frames, which inductor writes once — the copy libtorch's own inside the matmul (its generic
strided copy: 0.081 s of 1.298 per batch of 128, H200, 2026-12-05), or with `conv="strided-copy"`
(`--layout time-major-strided-copy`, the default since session 20) a kernel of the package — and
`mish="exp"` (`--mish exp`) computes Mish with one exponential instead of exp, log1p and tanh.

Same computation, same precisions under autocast (matmuls in the autocast dtype, layer norms in
fp32, the residual stream fp32 as in the reference): tools/compile_token2wav.py `--check` prints
its difference from the reference module. Only the estimator CosyVoice2 ships is covered — one
channel level (its down- and up-sampling are causal convolutions); another shape is refused.
"""

import torch
import torch.nn.functional as F


# How causal convolutions of kernel > 1 run: "matmul", the frames side by side then one matmul;
# "strided", the same matmul over a copy of the padded frames' overlapping view; "cudnn", cuDNN's
# convolution given the time-major tensor as a channels-last view; "shift", one matmul of each frame
# by every tap's weights, then each tap's output shifted into place and summed.
CONV_PATHS = ("matmul", "strided", "strided-copy", "cudnn", "shift")

# How Mish is computed: "exact", torch's `x·tanh(softplus(x))`; "exp", the same function through
# one exponential and one division (`mish_exp`).
MISH_FORMS = ("exact", "exp")


def mish_exp(x):
    """Mish as `x · n / (n + 2)`, n = eˣ(eˣ + 2): tanh(log(1 + eˣ)) written out, one exponential
    and one division instead of inductor's exp, log1p and tanh. Above x = 20 (where torch's softplus
    returns x and tanh rounds to 1) n/(n + 2) is 1 in fp32, so the exponent is clamped there and
    large inputs come out as x. Within a few fp32 ulps of `F.mish` (`--check` prints the estimator's
    difference)."""
    e = torch.exp(torch.clamp(x, max=20.0))
    n = e * (e + 2.0)
    return x * (n / (n + 2.0))


def causal_conv(conv, x, path="matmul"):
    """`conv` (a `CausalConv1d`, padded on the left by kernel−1, or a kernel-1 `Conv1d`) over the
    time-major `x` `[B, T, C_in]` → `[B, T, C_out]`: frames t−k+1 … t side by side, one matmul
    (`path` "matmul"), or cuDNN's convolution on the padded frames seen as `[B, C, T]` with the
    channel fastest ("cudnn": its channels-last kernels take that layout as it is), or ("shift")
    each frame times every tap's weights in one matmul (`[B, T, kernel·C_out]`), tap k's outputs
    delayed by kernel−1−k frames and summed: no window of frames is written, and the sum is
    element-wise work inductor can fuse into the consumer (the block's layer norm), or ("strided")
    the window of "matmul" copied from an overlapping view of the padded frames (row t of the
    window is the padded tensor's 3·C values from frame t on): the view makes inductor write the
    padded producer once, in the matmul's dtype, and the window is a plain copy — made by the
    matmul itself (libtorch's generic strided copy, as cuBLAS cannot read overlapping rows), or
    ("strided-copy") by an element-wise kernel of the package before the matmul. With "matmul"
    inductor on CUDA builds the window as one element-wise kernel that evaluates the producer
    (the block's Mish, the time embedding) once per tap for each of the 3·C outputs of a frame —
    the time-major package's slowest element-wise kernel (0.128 s for 140 calls in a batch of 128,
    H200, 2026-12-05)."""
    kernel = conv.kernel_size[0]
    weight = conv.weight  # [C_out, C_in, kernel]
    if kernel == 1:
        return F.linear(x, weight[:, :, 0], conv.bias)
    assert getattr(conv, "causal_padding", None) == kernel - 1 and conv.stride == (1,) and conv.dilation == (1,)
    frames = x.shape[1]
    if path == "shift":
        c_out = weight.shape[0]
        taps = F.linear(x, weight.permute(2, 0, 1).reshape(kernel * c_out, weight.shape[1]))  # [B, T, kernel·C_out]
        out = None
        for k in range(kernel):
            delay = kernel - 1 - k  # tap k sees frame t − delay
            tap = taps[..., k * c_out:(k + 1) * c_out]
            if delay:
                tap = F.pad(tap[:, :frames - delay], (0, 0, delay, 0))
            out = tap if out is None else out + tap
        return out + conv.bias if conv.bias is not None else out
    if path in ("strided", "strided-copy"):
        # Cast before the pad, as autocast would cast the window: the padded frames are written once, small.
        kind = x.device.type
        if torch.is_autocast_enabled(kind):
            x = x.to(torch.get_autocast_dtype(kind))
        padded = F.pad(x, (0, 0, kernel - 1, 0))
        batch, padded_frames, channels = padded.shape
        window = padded.as_strided((batch, frames, kernel * channels), (padded_frames * channels, channels, 1))
        if path == "strided-copy":
            # The window written by a kernel of the package: handed the overlapping view itself,
            # the matmul copies it with libtorch's generic strided copy (one launch per
            # convolution, ≈ 0.25 ms each at batch 128, H200, 2026-12-05).
            window = window.contiguous()
        return F.linear(window, weight.permute(0, 2, 1).reshape(weight.shape[0], -1), conv.bias)
    padded = F.pad(x, (0, 0, kernel - 1, 0))
    if path == "cudnn":
        return F.conv1d(padded.transpose(1, 2), weight, conv.bias).transpose(1, 2)
    window = torch.cat([padded[:, k:k + frames] for k in range(kernel)], dim=-1)  # [B, T, kernel·C_in]
    # Column k·C_in + c of the window holds input channel c at tap k.
    return F.linear(window, weight.permute(0, 2, 1).reshape(weight.shape[0], -1), conv.bias)


def causal_block(block, x, mask, path, mish="exact"):
    """`CausalBlock1D`: convolution, LayerNorm over channels, Mish (`mish`: MISH_FORMS), masked
    before and after."""
    conv, _, norm, _, exact_mish = block.block
    h = norm(causal_conv(conv, x * mask, path))
    return (mish_exp(h) if mish == "exp" else exact_mish(h)) * mask


def causal_resnet(resnet, x, mask, time_emb, path, mish="exact"):
    """`CausalResnetBlock1D` (matcha's `ResnetBlock1D.forward`)."""
    h = causal_block(resnet.block1, x, mask, path, mish)
    h = h + resnet.mlp(time_emb).unsqueeze(1)
    h = causal_block(resnet.block2, h, mask, path, mish)
    return h + causal_conv(resnet.res_conv, x * mask)


class TimeMajorDecoder(torch.nn.Module):
    """`CausalConditionalDecoder.forward(x, mask, mu, t, spks, cond, streaming=False)` on
    time-major activations: same arguments (`[B, 80, T]` in and out), same weights."""

    def __init__(self, reference, conv="matmul", mish="exact"):
        super().__init__()
        assert conv in CONV_PATHS and mish in MISH_FORMS, (conv, mish)
        self.conv, self.mish = conv, mish
        from cosyvoice.flow.decoder import CausalConv1d
        if len(reference.down_blocks) != 1 or not isinstance(reference.down_blocks[0][2], CausalConv1d) \
                or not isinstance(reference.up_blocks[0][2], CausalConv1d):
            raise ValueError("the time-major estimator covers CosyVoice2's one channel level only")
        self.reference = reference

    def attention_bias(self, mask, frames, dtype):
        """The reference's non-streaming bias for a level's transformer blocks (its `[B, T, T]`
        key-padding bias, through the same helpers, so compile_token2wav.py's replacements apply)."""
        import cosyvoice.flow.decoder as decoder_module
        keys = decoder_module.add_optional_chunk_mask(None, mask.bool(), False, False, 0, 0, -1).repeat(1, frames, 1)
        return decoder_module.mask_to_bias(keys, dtype)

    def transformers(self, blocks, x, bias, time_emb):
        for block in blocks:
            x = block(hidden_states=x, attention_mask=bias, timestep=time_emb)
        return x

    def forward(self, x, mask, mu, t, spks=None, cond=None, streaming=False):
        assert not streaming, "only the non-streaming path is compiled"
        ref = self.reference
        time_emb = ref.time_mlp(ref.time_embeddings(t).to(t.dtype))
        frames = x.shape[-1]
        parts = [x, mu] + ([spks.unsqueeze(-1).expand(-1, -1, frames)] if spks is not None else []) \
            + ([cond] if cond is not None else [])
        h = torch.cat(parts, dim=1).transpose(1, 2)  # [B, T, 320]
        time_mask = mask.transpose(1, 2)  # [B, T, 1]

        resnet, blocks, downsample = ref.down_blocks[0]
        h = causal_resnet(resnet, h, time_mask, time_emb, self.conv, self.mish)
        h = self.transformers(blocks, h, self.attention_bias(mask, frames, h.dtype), time_emb)
        skip = h
        h = causal_conv(downsample, h * time_mask, self.conv)

        for resnet, blocks in ref.mid_blocks:
            h = causal_resnet(resnet, h, time_mask, time_emb, self.conv, self.mish)
            h = self.transformers(blocks, h, self.attention_bias(mask, frames, h.dtype), time_emb)

        resnet, blocks, upsample = ref.up_blocks[0]
        h = torch.cat([h[:, :skip.shape[1]], skip], dim=-1)
        h = causal_resnet(resnet, h, time_mask, time_emb, self.conv, self.mish)
        h = self.transformers(blocks, h, self.attention_bias(mask, frames, h.dtype), time_emb)
        h = causal_conv(upsample, h * time_mask, self.conv)

        h = causal_block(ref.final_block, h, time_mask, self.conv, self.mish)
        out = causal_conv(ref.final_proj, h * time_mask)
        return (out * time_mask).transpose(1, 2)
