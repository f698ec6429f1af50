"""How a compiled stage computes what the reference computes, beside the reference's own way: the
forms `--layout`, `--mish`, `--qkv`, `--ff-gelu`, `--hift-channel-multiple` and `--hift-dilation`
choose (a family's stages compose them: families/cosyvoice2/). Same inputs, outputs and weights
in every form; `--eager-check` prints each form's difference from the reference's modules.

**Time-major** (`--layout time-major…`): every stage's activations kept time-major — each frame's
channels contiguous. The flow estimator is the reference `CausalConditionalDecoder` (PyPI
`token2wav-cosyvoice`, cosyvoice/flow/decoder.py) computed on `[B, T, C]` from its first layer to
its last, with the reference module's own weights and submodules (`TimeMajorDecoder`); the vocoder
body runs on channels-last `[B, C, 1, T]` tensors (no cuDNN layout conversions around its
convolutions). `--layout reference` keeps the reference's channel-major modules (every package
before 2026-12-04 used them).

Why: the reference keeps its ResNet blocks channel-major (`[B, C, T]`, cuDNN convolutions) and
turns every block's activations around twice — a transpose into and out of each LayerNorm over
channels, and a `rearrange(...).contiguous()` around each level's transformer blocks. Compiled on
the H200 (2026-12-04, batch 128), the kernels that fuse those layer norms with the transposes took
≈ 0.4 s of the flow's 1.35 s, and cuDNN added layout conversions around every bf16 convolution.
Here the layer norms run over each frame's contiguous channels, the transformer blocks take the
activations as they are, and each causal convolution (kernel 3, left padding 2) is one matmul over
the three frames it sees laid side by side (`[B, T, 3·C]`), so no transpose remains between the
input and the output. `--check` prints the eager module's difference from the reference layout
(CPU, tiny model: estimator 4e-6, HiFT 7e-7 in fp32; H200, full model: estimator 0.064 at bf16
with FlashAttention, as flash alone gave, HiFT 1.2e-3 at tf32). Measured on the H200 (2026-12-04,
batch 128, same call as eager): token2wav 840.5 audio-s/s against 664.6 with the reference layout
(flow steps 1.35 → 1.10 s, HiFT 0.48 → 0.33 s).

The estimator's convolution windows (`causal_conv`'s paths, `--layout`):
- `time-major`: the three shifted frames laid side by side by a `torch.cat`. Its window kernel
  became the slowest element-wise one (0.84 ms a call; 0.127 s of 1.41 per batch of 128): on CUDA
  inductor lowers the `cat` to one element-wise kernel that, for each output, evaluates every
  input's expression under a mask (`lowering.py`'s `pointwise_cat`) — the block's layer-norm
  output through Mish, the mask and the time embedding, three times for each of a frame's 3·C
  outputs; the kernel's name in the profile lists that Mish.
- `time-major-cudnn` (experimental): cuDNN's convolution given the padded frames as a
  channels-last view instead of matmuls: measured on the H200 (2026-12-04, with the FF epilogue)
  832.8 audio-s/s against 885.0 with matmuls — cuDNN still converts each bf16 convolution's input
  and output between layouts (convolutions 0.28 s against 0.22).
- `time-major-shift` (experimental, compiled but never benched): one matmul of every frame by all
  three taps' weights and a sum of the taps' outputs shifted into place: no window is written.
- `time-major-strided`: the window copied from an overlapping strided view of the padded frames.
  A strided view makes inductor realize the padded producer once (its `as_strided` lowering
  realizes its input), so the window becomes a plain copy; handed that view, the batched matmul
  copies it first with libtorch's generic strided copy (the bf16 `direct_copy_kernel_cuda`,
  0.081 s of 1.298 per batch of 128 on the H200, 2026-12-05).
- `time-major-strided-copy` (the default since 2026-12-05): the window written by an element-wise
  kernel of the package and multiplied by a plain matmul: measured on an H100 (2026-12-05, same
  call) 962.0 audio-s/s at batch 128 against 938.2 for `time-major-strided`, and 976.0 at batch
  256 (docs/PERFORMANCE.md; not yet on an H200).

**Mish** (`--mish exp`; `auto`, the default, with a time-major layout): the estimator's Mish
through one exponential and one division instead of exp, log1p and tanh (`mish_exp`, within a few
fp32 ulps of torch's).

**Fused projections.** `--qkv fused` (`auto`, the default, where the attention is one of
voxbatch's: flash, flex, cudnn) projects each attention's query, key and value in one matmul
(`fuse_qkv`): the profile of the 905.2-audio-s/s package shows the three 256-wide projections as
1,680 matmul calls (0.110 s of a batch of 128); one 768-wide matmul reads the layer-norm output
once and fills the GPU better. `--ff-gelu epilogue` (the default) computes each transformer
block's feed-forward input projection and its GELU as one cuBLASLt matmul with the bias and GELU
in the epilogue (`EpilogueGelu`): with `exact` the profile of the time-major package shows the
FF's GELU as its own kernel, 0.109 s of a 1.48-s batch of 128, reading and writing the 1,024-wide
activations once more. cuBLAS's epilogue computes GELU's tanh approximation, at most 4.7e-4 from
the exact GELU the reference computes (bf16 itself rounds these activations by up to ≈ 4e-3); on
a CPU aten computes the exact GELU. Measured on the H200 (2026-12-04, time-major, batch 128, flow
bf16, HiFT tf32): token2wav 885.0 audio-s/s against 840.5 with `exact`, the GELU kernel gone into a
`gelubias` matmul of 0.086 s; quality against true fp32 unchanged (SNR 13.6 dB mean, as with
`exact`: random weights). `exact` keeps the reference's separate GELU.

**The vocoder body.** `--hift-channel-multiple 4` (the default) pads its 18-channel
convolutions — the source downsamplers' input and conv_post's output — with zero channels to 20
(`pad_channels`): cuDNN's fast TF32 kernels want multiples of 4, and the compiled vocoder's
profile shows slow "analytic" kernels and layout conversions beside its other convolutions. Same
result (the padded channels are zero in, dropped out). 8 (24 channels) measured no faster on an
H100 (2026-12-05): TF32's `align4` kernels are already its widest alignment. `--hift-dilation
phases` (`auto`, the default, with a time-major layout) runs each of its dilated convolutions as an
undilated one over the time axis split into phases (`phase_conv`): the profile's six slow
"analytic" calls match the dilated convolutions of kernel 7 and 11 at the highest resolution.

These defaults together (then with `time-major-strided`), measured on the H200 (2026-12-05, batch
128, flow bf16, HiFT tf32, same call as eager): token2wav 986.0–987.1 audio-s/s against
905.2–911.5 for the packages before them (flow steps 1.010 → 0.917 s, HiFT 0.338 → 0.315 s);
997.7 at batch 256; 1,015.6 there with cuDNN's benchmark mode, a fixed-shape figure and not a
worker setting (docs/PERFORMANCE.md).

Same precisions under autocast as the reference (matmuls in the autocast dtype, layer norms in
fp32, the residual stream fp32). Only the estimator CosyVoice2 ships is covered — one channel
level (its down- and up-sampling are causal convolutions); another shape is refused.
"""
import sys

import torch
import torch.nn.functional as F

# --layout values: the reference's channel-major modules, then the time-major ones.
LAYOUTS = ["reference", "time-major", "time-major-strided", "time-major-strided-copy", "time-major-cudnn", "time-major-shift"]

# --ff-gelu values: the reference's Linear then GELU, or both in one matmul's epilogue.
FF_GELUS = ["exact", "epilogue"]

# --hift-dilation values: dilated convolutions as they are, or split into phases (`phase_conv`).
HIFT_DILATIONS = ("dilated", "phases")

# How causal convolutions of kernel > 1 run: "matmul", the frames side by side then one matmul;
# "strided", the same matmul over a copy of the padded frames' overlapping view; "cudnn", cuDNN's
# convolution given the time-major tensor as a channels-last view; "shift", one matmul of each frame
# by every tap's weights, then each tap's output shifted into place and summed.
CONV_PATHS = ("matmul", "strided", "strided-copy", "cudnn", "shift")

# How Mish is computed: "exact", torch's `x·tanh(softplus(x))`; "exp", the same function through
# one exponential and one division (`mish_exp`).
MISH_FORMS = ("exact", "exp")


def conv_path(layout):
    """The `causal_conv` path of a time-major `--layout`."""
    return {"time-major-strided": "strided", "time-major-strided-copy": "strided-copy", "time-major-cudnn": "cudnn",
            "time-major-shift": "shift"}.get(layout, "matmul")


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
        key-padding bias, through the same helpers, so the family's export replacements apply:
        families/cosyvoice2/flow.py)."""
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


class EpilogueGelu(torch.nn.Module):
    """diffusers' `GELU` (its `proj` Linear, then GELU) as one `torch._addmm_activation`, which
    inductor keeps as a call to aten's kernel: on CUDA a cuBLASLt matmul with the bias and GELU
    (tanh approximation) in its epilogue, so the 1,024-wide activations are written once. Under
    autocast it runs in the autocast dtype, as the Linear would (aten does not autocast this op)."""

    def __init__(self, gelu):
        super().__init__()
        self.proj = gelu.proj

    def forward(self, x):
        kind = x.device.type
        dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else x.dtype
        weight, bias = self.proj.weight.to(dtype), self.proj.bias.to(dtype)
        out = torch._addmm_activation(bias, x.to(dtype).reshape(-1, x.shape[-1]), weight.t(), use_gelu=True)
        return out.reshape(*x.shape[:-1], weight.shape[0])


def fuse_ff_gelus(estimator):
    """Every transformer block's FF input projection + GELU → `EpilogueGelu` (`--ff-gelu epilogue`)."""
    from diffusers.models.activations import GELU
    fused = 0
    for module in estimator.modules():
        net = getattr(module, "net", None)
        if isinstance(net, torch.nn.ModuleList) and net and isinstance(net[0], GELU) and net[0].proj.bias is not None:
            net[0] = EpilogueGelu(net[0])
            fused += 1
    if not fused:
        sys.exit("--ff-gelu epilogue: the estimator has no feed-forward GELU to fuse")
    return fused


def fuse_qkv(attn):
    """One `[q + k + v, C]` weight (and bias, where the projections have one) for an `Attention`'s
    query, key and value projections, registered on it as buffers (`--qkv fused`): the three
    256-wide matmuls over the same input become one 768-wide matmul, the input read once.
    `attention.SelfAttention` then splits the result into views."""
    projections = (attn.to_q, attn.to_k, attn.to_v)
    attn.register_buffer("qkv_weight", torch.cat([p.weight.detach() for p in projections]))
    biases = [p.bias for p in projections]
    attn.register_buffer("qkv_bias", None if all(b is None for b in biases) else torch.cat(
        [b.detach() if b is not None else torch.zeros(p.out_features) for b, p in zip(biases, projections)]))
    attn.qkv_sizes = [p.out_features for p in projections]


def pad_channels(weight, dim, multiple):
    """`weight` with zero channels added along `dim` up to a multiple of `multiple`
    (`--hift-channel-multiple`): a convolution reading zero channels in, or writing channels that
    are dropped, computes what it did."""
    padding = -weight.shape[dim] % multiple
    if not padding:
        return weight
    pad = [0, 0] * (weight.dim() - 1 - dim) + [0, padding]
    return F.pad(weight, pad)


def phase_conv(x, weight, bias, dilation, causal=False):
    """A "same"-padded convolution of dilation d over channels-last `[B, C, 1, T]` as an
    undilated one: output t = d·s + r sums the inputs d·(s + j − c) + r, i.e. phase r's own
    sequence s ↦ x[d·s + r] convolved without dilation. The time axis (zero-padded to a
    multiple of d: zeros, as the convolution's own padding) is read as `[B, C, T/d, d]` — the
    same memory, each phase a column — and convolved along the rows with the kernel stood
    upright (`[k, 1]`), then read back and cut to T. No copy but the pad, which inductor fuses
    into the producer. The pad is 1 to d frames, never none: an export traced with a pad keeps
    that branch, and a length that needed none would fail its guard.

    `causal` (CosyVoice3's vocoder): the convolution padded `d·(k − 1)` on the left only instead,
    output t summing the inputs t − d·(k − 1 − j): each phase's sequence convolved after k − 1 zero
    rows on top, none below (the zeros past T reach only outputs past T, which are cut)."""
    b, c, _, t = x.shape
    padded = (t // dilation + 1) * dilation
    x = F.pad(x, (0, padded - t))
    phases = x.permute(0, 2, 3, 1).reshape(b, padded // dilation, dilation, c).permute(0, 3, 1, 2)
    kernel = weight.shape[-1]
    if causal:
        out = F.conv2d(F.pad(phases, (0, 0, kernel - 1, 0)), weight.transpose(2, 3), bias, 1, 0)
    else:
        out = F.conv2d(phases, weight.transpose(2, 3), bias, 1, ((kernel - 1) // 2, 0))
    out = out.permute(0, 2, 3, 1).reshape(b, 1, padded, out.shape[1]).permute(0, 3, 1, 2)
    return out[..., :t]
