#!/usr/bin/env python3
"""Compiles CosyVoice2's token2wav stages of a converted voxbatch model directory into
AOTInductor packages (issue 16), each exported with a dynamic batch and length and compiled by
`torch._inductor.aoti_compile_and_package` for one device and precision:

- `encoder`: the flow's encoder stage, the reference `UpsampleConformerEncoder` and `encoder_proj`
  (`FlowEncoder` below) over the masked token embeddings, with the model's `flow.encoder.*` and
  `flow.encoder_proj.*` weights, at the flow's precision; its length is tokens (`--max-frames`/2,
  at most 2,500). Not in the default `--stages`: on the H200 (session 19) it took 0.25 s of a
  batch of 256 ten-second utterances where the eager port's fused encoder takes 0.08 s (its
  attention is the reference's softmax and matmuls). In session 18 its package crashed an H100
  bench (SIGSEGV): the export held CPU tensors in a CUDA program (position tables `Module.to` does
  not move, the look-ahead's default context), now moved, and `require_on_device` refuses any such
  export; on the H200 it then ran, 47.2 dB from the eager port (tiny model);
- `estimator`: the flow's estimator, the reference `CausalConditionalDecoder` (PyPI
  `token2wav-cosyvoice`) built at the model's `[cosyvoice2]` dimensions with the model's own
  `flow.decoder.estimator.*` weights (frames even, as two mel frames per token make them), at the
  flow's precision (`--precision`), computed time-major (`--layout`, below);
- `hift`: the vocoder's convolutional body — mel and the harmonic source's STFT in, the 18
  log-magnitude/phase channels out (`HiftBody` below: voxbatch's batched, masked HiFT of
  src/model/cosyvoice2/hift.rs between its source STFT and its iSTFT, which stay eager in fp32) —
  at the vocoder's precision (`--vocoder-precision`, default model.toml's `vocoder_precision`),
  on channels-last tensors (`--layout`).

Written to DIR/compiled/<key>/<stage>.pt2, key = <device arch>-torch<version>-<precision>
(e.g. sm90-torch2.11.0-bf16, cpu-torch2.11.0-fp32; on a CPU tf32 is fp32), with the same facts in
the package's metadata (`voxbatch.*`), so that a worker on another GPU, torch or precision finds no
package of its key and runs the eager port (a warning, not a failure). Needs the project venv's
torch and the reference code (bootstrap installs both; on the GPU machine scripts/device/*.sh carry
them as wheels).

For export only, two helpers are replaced by exportable equivalents: the reference's
`add_optional_chunk_mask` by its non-streaming meaning without the data-dependent `.item()` check
(a row with no valid key attends to every key: what the reference does after printing a warning),
and diffusers' `Attention.prepare_attention_mask` by the same per-head repeat without the
`output_size` argument that pins the batch size. `--attention flex` (experimental, not yet
measured on a GPU) runs the estimator's self-attention through FlexAttention instead
(`FlexSelfAttention`): padded keys masked inside the kernel, no bias in memory; its eager module
equals the SDPA one (4e-6 on the tiny model), but inductor's CPU backend refuses to compile it
(torch 2.11), so on a CPU it serves only that comparison. `--attention flash` calls
FlashAttention's varlen kernel on the padded layout with each item's key count
(`FlashSelfAttention`; AOTInductor keeps it as a call to aten's kernel): no bias, padded keys never
read; on a CPU or in fp32 it is SDPA with a boolean key mask. Measured on the H200 (2026-12-04, bf16,
batch 128): token2wav 664.6 audio-s/s with it against 576.3 with SDPA, so `--attention auto` (the
default) is flash on CUDA at bf16/fp16 and sdpa elsewhere. `--attention cudnn` calls cuDNN's fused attention
(`CudnnSelfAttention`): measured on the H200 (2026-12-04 session 12, with the FF epilogue) token2wav
647.4 audio-s/s — attention 0.90 s against FlashAttention's 0.31 (cuDNN with a key bias) — so it
stays an experiment. `--check` compares the package with the
eager reference on random inputs and prints the worst difference; the package is loaded in a child
process, because loading one into Python has killed the process on the H200 host (a segfault,
which then cost the stages after it their compile): a crash there is reported and the next stage
still compiles.

`--tuning` asks inductor to search kernel configurations at compile time: `coordinate-descent`
tunes each generated kernel's block sizes, `max-autotune` also tries Triton matmul templates (not
yet measured), which can take the FF's GELU into the matmul's epilogue. Both lengthen the compile.
Measured on the H200 (2026-12-04, time-major, batch 128): coordinate-descent made token2wav
*slower*, 744.6 against 840.5 — the FF's GELU kernel took 0.35 s instead of 0.11 (the search tunes
at the export's small example shapes, the package runs at batch 256 × 500 frames) — so `none`
stays the default.

`--layout time-major` keeps every stage's activations time-major — each frame's
channels contiguous: the estimator as tools/time_major_estimator.py computes it (no transposes
around its layer norms and transformer levels, causal convolutions as matmuls), the vocoder body on
channels-last `[B, C, 1, T]` tensors (no cuDNN layout conversions around its convolutions). Same
inputs, outputs and weights as `--layout reference` (the reference's channel-major modules, what
every package before 2026-12-04 session 11 used); `--check` prints the eager module's difference
from the reference layout (CPU, tiny model: estimator 4e-6, HiFT 7e-7 in fp32; H200, full model:
estimator 0.064 at bf16 with FlashAttention, as flash alone gave, HiFT 1.2e-3 at tf32). Measured on
the H200 (2026-12-04, batch 128, same call as eager): token2wav 840.5 audio-s/s against 664.6 with
the reference layout (flow steps 1.35 → 1.10 s, HiFT 0.48 → 0.33 s). `--layout time-major-cudnn`
is time-major with the estimator's causal convolutions through cuDNN
(`time_major_estimator.causal_conv`'s "cudnn" path) instead of matmuls: measured on the H200
(2026-12-04 session 12, with the FF epilogue) 832.8 audio-s/s against 885.0 with matmuls — cuDNN
still converts each bf16 convolution's input and output between layouts (convolutions 0.28 s
against 0.22) — so it stays an experiment. `--layout time-major-shift` (experimental, compiled
but never benched) computes each causal convolution as one matmul of every frame by all three
taps' weights and a sum of the taps' outputs shifted into place (`causal_conv`'s "shift" path): no
window of frames is written — the time-major package's slowest element-wise kernel (0.127 s of 1.41
per batch of 128) builds those windows. `--layout time-major-strided` (session 19's default)
keeps the window but copies it from an overlapping strided view of the padded frames
(`causal_conv`'s "strided" path); handed that view, the batched matmul copies it first with
libtorch's generic strided copy (the bf16 `direct_copy_kernel_cuda`, 0.081 s of 1.298 per batch of
128 on the H200, 2026-12-05), so `--layout time-major-strided-copy` (the default since session 20)
writes each window with an element-wise kernel of the package and multiplies it with a plain
matmul: measured on an H100 (2026-12-05 session 20, same call) 962.0 audio-s/s at batch 128
against 938.2, and 976.0 at batch 256 (docs/PERFORMANCE.md; not yet on an H200). Why the window
kernel is slow: on CUDA inductor lowers the `torch.cat` of the three shifted frames to one
element-wise kernel that, for each output, evaluates every input's expression under a mask
(`lowering.py`'s `pointwise_cat`) — the block's layer-norm output through Mish, the mask and the
time embedding, three times for each of a frame's 3·C outputs; the kernel's name in the profile
lists that Mish. A strided view makes inductor realize the padded producer once (its `as_strided`
lowering realizes its input), so the window becomes a plain copy. `--mish exp` (`auto`, the
default, with a time-major layout) computes the estimator's Mish through one exponential and one
division instead of exp, log1p and tanh (`time_major_estimator.mish_exp`, within a few fp32 ulps of
torch's).

Session 19's defaults together (time-major-strided — session 20 made it time-major-strided-copy —,
Mish exp, q/k/v fused, the estimator frozen, the vocoder's channels padded to 20 and its dilations
as phases), measured on the H200 (2026-12-05, batch 128, flow bf16, HiFT tf32, same call as eager):
token2wav 986.0–987.1 audio-s/s against 905.2–911.5 for session 15's packages (flow steps 1.010 →
0.917 s, HiFT 0.338 → 0.315 s); 997.7 at batch 256; 1,015.6 there with cuDNN's benchmark mode, a
fixed-shape figure and not a worker setting (docs/PERFORMANCE.md).

`--hift-channel-multiple 4` (the default) pads the vocoder body's 18-channel convolutions — the
source downsamplers' input and conv_post's output — with zero channels to 20 (`HiftBody`): cuDNN's
fast TF32 kernels want multiples of 4, and the compiled vocoder's profile shows slow "analytic"
kernels and layout conversions beside its other convolutions. Same result (the padded channels are
zero in, dropped out). 8 (24 channels) measured no faster on an H100 (session 20): TF32's `align4`
kernels are already its widest alignment. `--hift-dilation phases` (`auto`, the default, with a
time-major layout) runs each of its dilated convolutions as an undilated one over the time axis
split into phases (`HiftBody.phase_conv`): the profile's six slow "analytic" calls match the
dilated convolutions of kernel 7 and 11 at the highest resolution.

`--qkv fused` (`auto`, the default, where the attention is one of voxbatch's: flash, flex, cudnn)
projects each attention's query, key and
value in one matmul (`fuse_qkv`): the profile of the 905.2-audio-s/s package shows the three
256-wide projections as 1,680 matmul calls (0.110 s of a batch of 128); one 768-wide matmul reads
the layer-norm output once and fills the GPU better.

`--ff-gelu epilogue` (the default) computes each transformer block's feed-forward input projection
and its GELU as one cuBLASLt matmul with the bias and GELU in the epilogue (`EpilogueGelu`): with
`exact` the profile of the time-major package shows the FF's GELU as its own kernel, 0.109 s of a
1.48-s batch of 128, reading and writing the 1,024-wide activations once more. cuBLAS's epilogue
computes GELU's tanh approximation, at most 4.7e-4 from the exact GELU the reference computes (bf16
itself rounds these activations by up to ≈ 4e-3); on a CPU aten computes the exact GELU. Measured on
the H200 (2026-12-04 session 12, time-major, batch 128, flow bf16, HiFT tf32): token2wav 885.0
audio-s/s against 840.5 with `exact` (session 11), the GELU kernel gone into a `gelubias` matmul of
0.086 s; quality against true fp32 unchanged (SNR 13.6 dB mean, as with `exact`: random weights).
`exact` keeps the reference's separate GELU.

`--inductor-option [STAGE:]KEY=VALUE` (repeatable) passes one of inductor's settings to the
compile (with a stage prefix, e.g. `estimator:freezing=True`, to that stage's alone), after the
defaults (`DEFAULT_INDUCTOR_OPTIONS`: `estimator:freezing=True`, the estimator's weights folded into
its package at the autocast dtype; a later setting of the same key overrides it), and records them
in the package's metadata (`voxbatch.inductor_options`): e.g.
`realize_reads_threshold=2`, so that a producer read by three consumers (the time-major
estimator's side-by-side frames) is written once rather than recomputed in each.

Usage: compile_token2wav.py --model DIR [--device cuda:0|cpu] [--stages estimator,hift] [--attention auto|sdpa|flex|flash|cudnn]
                            [--precision bf16|fp16|fp32] [--vocoder-precision tf32|fp32|bf16|fp16]
                            [--max-frames 3000] [--max-batch 1024] [--tuning none|coordinate-descent|max-autotune]
                            [--layout reference|time-major|time-major-strided|time-major-strided-copy|time-major-cudnn|time-major-shift]
                            [--ff-gelu epilogue|exact] [--mish auto|exp|exact] [--qkv auto|separate|fused] [--hift-channel-multiple K]
                            [--hift-dilation auto|phases|dilated]
                            [--inductor-option [STAGE:]KEY=VALUE]... [--check | --eager-check | --cuda-kernels]
"""
import argparse
import dataclasses
import functools
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_parity_fixtures as mpf  # noqa: E402

PRECISIONS = {"fp32": None, "tf32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def package_key(device, precision):
    """The key a worker looks a package up by (src/model/compiled.rs builds the same)."""
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        arch = f"sm{major}{minor}"
    else:
        arch = "cpu"
        precision = "fp32" if precision == "tf32" else precision
    return f"{arch}-torch{torch.__version__.split('+')[0]}-{precision}"


def read_dims(model_dir):
    import tomllib
    with open(os.path.join(model_dir, "model.toml"), "rb") as f:
        manifest = tomllib.load(f)
    dims = manifest.get("cosyvoice2")
    if not dims:
        sys.exit(f"{model_dir}/model.toml has no [cosyvoice2] section: not a converted CosyVoice2 model")
    return manifest, dims


def exportable_prepare_attention_mask(self, attention_mask, target_length, batch_size, out_dim=3):
    """diffusers' `Attention.prepare_attention_mask` for the estimator's masks (3-D, already
    `target_length` long): each item's mask repeated per head, without the `output_size` argument
    whose concrete value pins the exported batch size. (A broadcast view of the first query row
    instead of the copy, which the masks allow, measured 6 % slower on the H200 on 2026-12-04:
    541 against 576 audio-s/s; docs/PERFORMANCE.md.)"""
    if attention_mask is None:
        return None
    assert out_dim == 3 and attention_mask.shape[-1] == target_length, "the estimator passes full-length 3-D masks"
    b, q, k = attention_mask.shape
    return attention_mask.unsqueeze(1).expand(b, self.heads, q, k).reshape(b * self.heads, q, k)


class SelfAttention:
    """diffusers' `AttnProcessor2_0` as the estimator's self-attention uses it (no cross-attention,
    norms, residual or rescale), with the attention itself left to `attend`: query, key and value
    `[B, T, heads·d]` and each item's valid keys `[B, T]` (the first row of the decoder's bias:
    every row of a non-streaming bias is the same key-padding mask) → `[B, T, heads·d]`. An
    `Attention` given `fuse_qkv` projects query, key and value in one matmul (`--qkv fused`)."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, temb=None, *args, **kwargs):
        assert encoder_hidden_states is None and attn.spatial_norm is None and attn.group_norm is None
        assert attn.norm_q is None and attn.norm_k is None and not attn.residual_connection
        b, t, _ = hidden_states.shape
        if hasattr(attn, "qkv_weight"):
            qkv = torch.nn.functional.linear(hidden_states, attn.qkv_weight, attn.qkv_bias)
            query, key, value = qkv.split(attn.qkv_sizes, dim=-1)
        else:
            query, key, value = attn.to_q(hidden_states), attn.to_k(hidden_states), attn.to_v(hidden_states)
        if attention_mask is None:
            valid = torch.ones(b, t, dtype=torch.bool, device=query.device)
        else:
            valid = attention_mask[:, 0, :] > -1.0
        out = self.attend(query, key, value, valid, attn.heads).to(query.dtype)
        return attn.to_out[1](attn.to_out[0](out)) / attn.rescale_output_factor


class FlexSelfAttention(SelfAttention):
    """Through FlexAttention (`--attention flex`): padded keys are masked inside the kernel by a
    score modifier reading each item's key mask — no `B·heads·T²` bias is copied or read — and the
    compiled kernel is FlashAttention-like. Same result as SDPA with the bias: a masked key gets
    −inf instead of −1e10 (identical after softmax: no row is fully masked, exportable_chunk_mask
    sees to that)."""

    def attend(self, query, key, value, valid, heads):
        from torch.nn.attention.flex_attention import flex_attention
        b, t, inner = query.shape
        query, key, value = (x.view(b, t, heads, inner // heads).transpose(1, 2) for x in (query, key, value))
        if query.device.type == "cpu":  # inductor's CPU template takes dense heads only
            query, key, value = query.contiguous(), key.contiguous(), value.contiguous()

        def padded_keys_out(score, item, head, q_index, kv_index):
            return torch.where(valid[item, kv_index], score, -float("inf"))

        return flex_attention(query, key, value, score_mod=padded_keys_out).transpose(1, 2).reshape(b, t, inner)


class FlashSelfAttention(SelfAttention):
    """Through FlashAttention on the padded layout (`--attention flash`): `[B·T, heads, d]` as B
    sequences of T frames laid end to end, each reading only its first `length` keys
    (`seqused_k`) — no bias in memory, no gather of valid frames, padded keys never read. Padded
    query rows attend to the valid keys as they do in the reference (their output is masked later).
    Needs CUDA and bf16/fp16 (the flow's autocast); elsewhere SDPA with the same key-padding mask
    as a broadcast boolean, the same result (the CPU's check of this processor against the bias)."""

    def attend(self, query, key, value, valid, heads):
        b, t, inner = query.shape
        lengths = valid.sum(dim=-1, dtype=torch.int32)
        # An item with no valid frame attends to every key, as exportable_chunk_mask makes the reference do.
        lengths = torch.where(lengths == 0, torch.full_like(lengths, t), lengths)
        if query.device.type == "cuda" and query.dtype in (torch.bfloat16, torch.float16):
            q, k, v = (x.reshape(b * t, heads, inner // heads) for x in (query, key, value))
            offsets = torch.arange(b + 1, device=query.device, dtype=torch.int32) * t
            out = torch.ops.aten._flash_attention_forward(q, k, v, offsets, offsets, t, t, 0.0, False, False,
                                                          seqused_k=lengths)[0]
            return out.reshape(b, t, inner)
        keys = torch.arange(t, device=query.device).unsqueeze(0) < lengths.unsqueeze(1)
        q, k, v = (x.view(b, t, heads, inner // heads).transpose(1, 2) for x in (query, key, value))
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=keys[:, None, None, :])
        return out.transpose(1, 2).reshape(b, t, inner)


class CudnnSelfAttention(SelfAttention):
    """Through cuDNN's fused attention (`--attention cudnn`, experimental, not yet measured): aten's
    cuDNN SDPA kernel called directly (AOTInductor keeps it as a call), each item's padded keys out
    through an additive bias broadcast over heads and query rows (`[B, 1, 1, T]` expanded, no
    `[B·heads, T, T]` copy). cuDNN's Hopper kernels use the wgmma/TMA instructions FlashAttention 2
    (`flash`) does not. On a CPU or in fp32 it is `FlashSelfAttention`'s fallback (SDPA with a
    boolean key mask)."""

    def attend(self, query, key, value, valid, heads):
        if not (query.device.type == "cuda" and query.dtype in (torch.bfloat16, torch.float16)):
            return FlashSelfAttention.attend(self, query, key, value, valid, heads)
        b, t, inner = query.shape
        # An item with no valid frame attends to every key, as exportable_chunk_mask makes the reference do.
        valid = valid | (valid.sum(dim=-1, keepdim=True) == 0)
        bias = torch.zeros(b, 1, 1, t, dtype=query.dtype, device=query.device).masked_fill(~valid[:, None, None, :], float("-inf"))
        q, k, v = (x.view(b, t, heads, inner // heads).transpose(1, 2) for x in (query, key, value))
        out = torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, bias.expand(b, heads, t, t), False)[0]
        return out.transpose(1, 2).reshape(b, t, inner)


def exportable_chunk_mask(xs, masks, use_dynamic_chunk, use_dynamic_left_chunk, decoding_chunk_size,
                          static_chunk_size, num_decoding_left_chunks, enable_full_context=True):
    """`add_optional_chunk_mask` as the non-streaming estimator calls it, without `.item()`."""
    assert not use_dynamic_chunk and static_chunk_size == 0, "only the non-streaming path is exported"
    return masks | (masks.sum(dim=-1, keepdim=True) == 0)


class Estimator(torch.nn.Module):
    """The estimator's forward as the flow's Euler steps call it, under the precision's autocast;
    fp32 out."""

    def __init__(self, inner, device_type, dtype):
        super().__init__()
        self.inner, self.device_type, self.dtype = inner, device_type, dtype

    def forward(self, x, mask, mu, t, spks, cond):
        if self.dtype is None:
            return self.inner(x, mask, mu, t, spks, cond, streaming=False).float()
        with torch.autocast(self.device_type, dtype=self.dtype):
            return self.inner(x, mask, mu, t, spks, cond, streaming=False).float()


def weights_digest(model_dir):
    """The first 16 hex digits of token2wav.safetensors' sha256: a worker uses a package only with
    the weights file it was made from (src/model/compiled.rs computes the same)."""
    digest = hashlib.sha256()
    with open(os.path.join(model_dir, "token2wav.safetensors"), "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def stage_weights(model_dir, prefix):
    from safetensors.torch import load_file
    weights = load_file(os.path.join(model_dir, "token2wav.safetensors"))
    return {k[len(prefix):]: v for k, v in weights.items() if k.startswith(prefix)}


# --layout values: the reference's channel-major modules, then the time-major ones.
LAYOUTS = ["reference", "time-major", "time-major-strided", "time-major-strided-copy", "time-major-cudnn", "time-major-shift"]

# --ff-gelu values: the reference's Linear then GELU, or both in one matmul's epilogue.
FF_GELUS = ["exact", "epilogue"]


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


def fuse_qkv(attn):
    """One `[q + k + v, C]` weight (and bias, where the projections have one) for an `Attention`'s
    query, key and value projections, registered on it as buffers (`--qkv fused`): the three
    256-wide matmuls over the same input become one 768-wide matmul, the input read once.
    `SelfAttention` then splits the result into views."""
    projections = (attn.to_q, attn.to_k, attn.to_v)
    attn.register_buffer("qkv_weight", torch.cat([p.weight.detach() for p in projections]))
    biases = [p.bias for p in projections]
    attn.register_buffer("qkv_bias", None if all(b is None for b in biases) else torch.cat(
        [b.detach() if b is not None else torch.zeros(p.out_features) for b, p in zip(biases, projections)]))
    attn.qkv_sizes = [p.out_features for p in projections]


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


def build_estimator(model_dir, device, precision, attention="sdpa", layout="reference", ff_gelu="exact", mish="exact",
                    qkv="separate"):
    ref = mpf.import_reference()
    import cosyvoice.flow.decoder as decoder_module
    decoder_module.add_optional_chunk_mask = exportable_chunk_mask
    from diffusers.models.attention_processor import Attention
    Attention.prepare_attention_mask = exportable_prepare_attention_mask
    _, d = read_dims(model_dir)
    estimator = mpf.flow_estimator(ref, d["decoder_channels"], d["decoder_head_dim"], d["decoder_blocks"],
                                   d["decoder_mid_blocks"], d["decoder_heads"])
    missing, unexpected = estimator.load_state_dict(stage_weights(model_dir, "flow.decoder.estimator."), strict=False)
    if missing or unexpected:
        sys.exit(f"token2wav.safetensors does not fit the estimator: missing {missing[:5]}, unexpected {unexpected[:5]}")
    if attention != "sdpa":
        processor = {"flex": FlexSelfAttention, "flash": FlashSelfAttention, "cudnn": CudnnSelfAttention}[attention]
        for module in estimator.modules():
            if isinstance(module, Attention):
                module.set_processor(processor())
                if qkv == "fused":
                    fuse_qkv(module)
    elif qkv == "fused":
        sys.exit("--qkv fused needs one of voxbatch's attention processors (--attention flash, flex or cudnn)")
    if ff_gelu == "epilogue":
        fuse_ff_gelus(estimator)
    if layout != "reference":
        from time_major_estimator import TimeMajorDecoder
        conv = {"time-major-strided": "strided", "time-major-strided-copy": "strided-copy", "time-major-cudnn": "cudnn",
                "time-major-shift": "shift"}.get(layout, "matmul")
        estimator = TimeMajorDecoder(estimator, conv, mish)
    elif mish != "exact":
        sys.exit("--mish exp needs a time-major --layout (the reference's modules keep torch's Mish)")
    return Estimator(estimator.eval().to(device), device.type, PRECISIONS[precision])


def estimator_inputs(batch, frames, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g).to(device)  # noqa: E731
    mask = torch.ones(batch, 1, frames, device=device)
    mask[-1, :, frames * 3 // 4:] = 0  # one shorter item
    mask[0, :, frames - 5:] = 0  # and one a few frames short of the padded length
    return (r(batch, 80, frames), mask, r(batch, 80, frames), torch.rand(batch, generator=g).to(device), r(batch, 80), r(batch, 80, frames))


# The estimator package takes mel lengths in multiples of 8 frames (the flow pads to them,
# src/model/cosyvoice2/flow.rs FRAME_MULTIPLE): attention bias rows then meet SDPA's 8-element
# alignment, so the memory-efficient kernel needs no padded copy of the bias.
FRAME_MULTIPLE = 8


def estimator_shapes(max_batch, max_frames):
    blocks = torch.export.Dim("frame_blocks", min=2, max=max_frames // FRAME_MULTIPLE)
    batch = torch.export.Dim("batch", min=2, max=max_batch)
    frames = FRAME_MULTIPLE * blocks
    return {"x": {0: batch, 2: frames}, "mask": {0: batch, 2: frames}, "mu": {0: batch, 2: frames},
            "t": {0: batch}, "spks": {0: batch}, "cond": {0: batch, 2: frames}}


# HiFT's fixed architecture (src/model/cosyvoice2/hift.rs has the same constants).
UPSAMPLE, UP_KERNELS, RES_KERNELS, SOURCE_KERNELS, DILATIONS = [8, 5, 3], [16, 11, 7], [3, 7, 11], [7, 7, 11], [1, 3, 5]
SOURCE_DOWN_RATES, N_FFT = [15, 3, 1], 16


class HiftBody(torch.nn.Module):
    """voxbatch's batched HiFT between the source STFT and the iSTFT (hift.rs `Hift::decode`):
    mel `[B, 80, T]`, the source's STFT `[B, 18, 120·T + 1]` and each item's mel frames `[B]` (int64)
    → conv_post's 18 channels `[B, 18, 120·T + 1]`, fp32. After every convolution the positions
    past an item's length are zeroed, as the eager port does, so a padded batch equals unbatched
    runs. Weights are the model's `hift.*` (weight norm already folded by the converter).

    `time_major` (`--layout time-major`): the same computation on `[B, C, 1, T]` tensors in
    channels-last memory (each frame's channels contiguous, the layout cuDNN's convolution kernels
    take), the convolutions as 2-D ones of height 1 — so cuDNN does not convert every convolution's
    input and output between layouts (≈ 0.1 s of the compiled vocoder's 0.48 s per batch of 128 on
    the H200, 2026-12-04). Inputs and output keep the channel-major `[B, C, T]` interface.

    `channel_multiple` (`--hift-channel-multiple`; 4, the default, measured in session 19's
    defaults; 8 measured no faster on an H100, session 20): the convolutions on the 18 STFT
    channels — the source downsamplers' input and conv_post's output — padded with zero
    channels to a multiple of this (4 → 20), the padded outputs dropped: same result. cuDNN's
    fast TF32 kernels want channel counts in multiples of 4 (16 bytes); the profile of the
    compiled vocoder (H200, 2026-12-05, batch 128) shows six calls of a slow "analytic" TF32
    kernel (6 ms each) and 70 layout conversions beside its other convolutions.

    `dilation="phases"` (`--hift-dilation phases`, the default with a time-major layout since
    session 19; time-major only): each dilated convolution (the resblocks' first convolutions
    at dilations 3 and 5) as an undilated one over the time axis split into `dilation` phases
    (`phase_conv`): same products and sums. The six slow "analytic" calls above are as many as
    the dilated convolutions of kernel 7 and 11 at the highest resolution; the other
    high-resolution convolutions take ≈ 2.1 ms a call there."""

    def __init__(self, weights, channels, device_type, dtype, time_major=False, channel_multiple=1, dilation="dilated"):
        super().__init__()
        self.names = {}
        stft = N_FFT + 2
        self.stft_padding = -stft % channel_multiple
        for k, v in weights.items():
            name = k.replace(".", "__")
            v = v.float()
            if self.stft_padding and k.startswith("source_downs.") and k.endswith(".weight"):
                v = torch.nn.functional.pad(v, (0, 0, 0, self.stft_padding))  # [C_out, 18 + pad, kernel]
            elif self.stft_padding and k.startswith("conv_post."):
                v = torch.nn.functional.pad(v, (0, 0) * (v.dim() - 1) + (0, self.stft_padding))  # 18 + pad outputs
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
        weight = self.w(f"{prefix}.weight")
        if padding is None:
            padding = dilation * (weight.shape[-1] - 1) // 2
        if self.time_major:
            if self.phase_dilation and dilation > 1 and stride == 1 and padding == dilation * (weight.shape[-1] - 1) // 2:
                return self.phase_conv(x, weight, self.w(f"{prefix}.bias"), dilation)
            return torch.nn.functional.conv2d(x, weight, self.w(f"{prefix}.bias"), (1, stride), (0, padding), (1, dilation))
        return torch.nn.functional.conv1d(x, weight, self.w(f"{prefix}.bias"), stride, padding, dilation)

    @staticmethod
    def phase_conv(x, weight, bias, dilation):
        """A "same"-padded convolution of dilation d over channels-last `[B, C, 1, T]` as an
        undilated one: output t = d·s + r sums the inputs d·(s + j − c) + r, i.e. phase r's own
        sequence s ↦ x[d·s + r] convolved without dilation. The time axis (zero-padded to a
        multiple of d: zeros, as the convolution's own padding) is read as `[B, C, T/d, d]` — the
        same memory, each phase a column — and convolved along the rows with the kernel stood
        upright (`[k, 1]`), then read back and cut to T. No copy but the pad, which inductor fuses
        into the producer. The pad is 1 to d frames, never none: an export traced with a pad keeps
        that branch, and a length that needed none would fail its guard."""
        b, c, _, t = x.shape
        padded = (t // dilation + 1) * dilation
        x = torch.nn.functional.pad(x, (0, padded - t))
        phases = x.permute(0, 2, 3, 1).reshape(b, padded // dilation, dilation, c).permute(0, 3, 1, 2)
        kernel = weight.shape[-1]
        out = torch.nn.functional.conv2d(phases, weight.transpose(2, 3), bias, 1, ((kernel - 1) // 2, 0))
        out = out.permute(0, 2, 3, 1).reshape(b, 1, padded, out.shape[1]).permute(0, 3, 1, 2)
        return out[..., :t]

    def upsample(self, x, i, stride, kernel):
        weight, bias, padding = self.w(f"ups.{i}.weight"), self.w(f"ups.{i}.bias"), (kernel - stride) // 2
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

    def body(self, mel, s_stft, frames):
        t = mel.shape[-1]

        def mask(scale, extra):
            positions = torch.arange(t * scale + extra, device=mel.device).unsqueeze(0)
            valid = (positions < (frames * scale + extra).unsqueeze(1)).float().unsqueeze(1)
            return valid.unsqueeze(2) if self.time_major else valid

        mel_mask = mask(1, 0)
        x = self.conv(mel * mel_mask, "conv_pre") * mel_mask
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
            r = SOURCE_DOWN_RATES[i]
            down = self.conv(s_stft, f"source_downs.{i}", stride=r, padding=r // 2) if r > 1 else self.conv(s_stft, f"source_downs.{i}", padding=0)
            x = x + self.resblock(down * m, f"source_resblocks.{i}", m)
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


# --hift-dilation values: dilated convolutions as they are, or split into phases (HiftBody.phase_conv).
HIFT_DILATIONS = ("dilated", "phases")


def build_hift(model_dir, device, precision, layout="reference", channel_multiple=1, dilation="dilated"):
    _, d = read_dims(model_dir)
    try:
        return HiftBody(stage_weights(model_dir, "hift."), d["hift_channels"], device.type, PRECISIONS[precision],
                        time_major=layout != "reference", channel_multiple=channel_multiple, dilation=dilation).eval().to(device)
    except ValueError as e:
        sys.exit(str(e))


def hift_inputs(batch, frames, device, seed=0):
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


class MaskedEmbed(torch.nn.Module):
    """The encoder's input embedding (linear, layer norm, positions) with padded positions set to
    zero after it, as src/model/cosyvoice2/encoder.rs does: the look-ahead convolution after it sees
    the three next positions, so without this a shorter item's last tokens would see the batch's
    padding embedded (a bias and a layer norm make it non-zero) where the official code, one
    utterance at a time, sees zeros. Nothing else in the encoder lets padding reach valid positions
    (its attention masks padded keys, its upsampling convolution looks back only)."""

    def __init__(self, embed):
        super().__init__()
        self.embed = embed

    def forward(self, xs, masks, offset=0):
        xs, pos_emb, masks = self.embed(xs, masks, offset)
        return xs * masks.transpose(1, 2).to(xs.dtype), pos_emb, masks


class FlowEncoder(torch.nn.Module):
    """The flow's encoder stage as the reference flow runs it (`CausalMaskedDiffWithXvec.inference`
    between the token embedding and the decoder): the `UpsampleConformerEncoder` over the masked
    token embeddings `[B, T, 512]` and their lengths `[B]` (int64), then `encoder_proj` → mu
    `[B, 2·T, 80]` under the flow's autocast, in its dtype as the reference's projection gives it
    (the flow rounds its noise to mu's dtype, as the reference does). The embedding lookup stays
    with the caller (src/model/cosyvoice2/flow.rs `Flow::encode`)."""

    def __init__(self, encoder, proj, device_type, dtype):
        super().__init__()
        self.encoder, self.proj, self.device_type, self.dtype = encoder, proj, device_type, dtype

    def run(self, tokens, lengths):
        # The empty look-ahead context made here, on the tokens' device: the reference's default
        # argument is a CPU tensor, which an export would lift into a CUDA program as a constant.
        out, _ = self.encoder(tokens, lengths, context=tokens.new_zeros(0, 0, 0), streaming=False)
        return self.proj(out)

    def forward(self, tokens, lengths):
        if self.dtype is None:
            return self.run(tokens, lengths)
        with torch.autocast(self.device_type, dtype=self.dtype):
            return self.run(tokens, lengths)


def build_encoder(model_dir, device, precision, **_):
    ref = mpf.import_reference()
    import cosyvoice.transformer.upsample_encoder as encoder_module
    encoder_module.add_optional_chunk_mask = exportable_chunk_mask
    _, d = read_dims(model_dir)
    if d.get("encoder_up_blocks", 4) != 4:
        sys.exit(f"the reference encoder has 4 layers after its upsampling; model.toml says {d['encoder_up_blocks']}")
    encoder = mpf.flow_encoder(ref, d["encoder_heads"], d["encoder_units"], d["encoder_blocks"])  # eval() below: no dropout
    missing, unexpected = encoder.load_state_dict(stage_weights(model_dir, "flow.encoder."), strict=False)
    if missing or unexpected:
        sys.exit(f"token2wav.safetensors does not fit the encoder: missing {missing[:5]}, unexpected {unexpected[:5]}")
    encoder.embed = MaskedEmbed(encoder.embed)
    proj = torch.nn.Linear(512, 80)
    proj.load_state_dict(stage_weights(model_dir, "flow.encoder_proj."))
    return mpf.move_plain_tensors(FlowEncoder(encoder.eval(), proj.eval(), device.type, PRECISIONS[precision]).to(device), device)


def encoder_inputs(batch, tokens, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.full((batch,), tokens, dtype=torch.int64)
    lengths[-1] = tokens * 3 // 4  # one shorter item
    h = torch.randn(batch, tokens, 512, generator=g)
    h[-1, lengths[-1]:] = 0  # masked, as the flow's embeddings are
    return h.to(device), lengths.to(device)


# The reference encoder's relative position table (5,000 positions) covers 2,500 tokens.
ENCODER_MAX_TOKENS = 2500


def encoder_shapes(max_batch, max_tokens):
    # The token count is DYNAMIC, not a Dim with bounds: the relative position encoding's guards
    # ((2T − 1) mod T ≠ 0 …) hold for every T ≥ 2 but cannot be proven, and a bounded Dim refuses
    # them; they stay in the package as runtime checks (the worker calls it with T ≥ 2, `fits`).
    batch = torch.export.Dim("batch", min=1, max=max_batch)
    return {"tokens": {0: batch, 1: torch.export.Dim.DYNAMIC}, "lengths": {0: batch}}


STAGES = {
    "encoder": (build_encoder, encoder_inputs, encoder_shapes),
    "estimator": (build_estimator, estimator_inputs, estimator_shapes),
    "hift": (build_hift, hift_inputs, hift_shapes),
}


@dataclasses.dataclass(frozen=True)
class Variant:
    """How a stage is computed beside its weights and precision: the estimator's attention,
    layout, feed-forward GELU and Mish, the vocoder's layout and STFT channel multiple. The
    defaults are the reference's own computation (what `--check` compares a variant with)."""
    attention: str = "sdpa"
    layout: str = "reference"
    ff_gelu: str = "exact"
    mish: str = "exact"
    qkv: str = "separate"
    hift_channel_multiple: int = 1
    hift_dilation: str = "dilated"

    def for_stage(self, stage):
        """The fields that shape `stage` (the others left at their defaults; the encoder has none)."""
        if stage == "estimator":
            return dataclasses.replace(self, hift_channel_multiple=1, hift_dilation="dilated")
        if stage == "encoder":
            return Variant()
        return Variant(layout=self.layout, hift_channel_multiple=self.hift_channel_multiple, hift_dilation=self.hift_dilation)

    def is_reference(self, stage):
        return self.for_stage(stage) == Variant()

    def metadata(self, stage):
        """The package metadata that records the variant (`voxbatch.*`)."""
        v = self.for_stage(stage)
        if stage == "estimator":
            return {"voxbatch.attention": v.attention, "voxbatch.ff_gelu": v.ff_gelu, "voxbatch.mish": v.mish,
                    "voxbatch.qkv": v.qkv, "voxbatch.layout": v.layout}
        if stage == "encoder":
            return {}
        return {"voxbatch.layout": v.layout, "voxbatch.hift_channel_multiple": str(v.hift_channel_multiple),
                "voxbatch.hift_dilation": v.hift_dilation}

    def cli_args(self):
        return ["--attention", self.attention, "--layout", self.layout, "--ff-gelu", self.ff_gelu, "--mish", self.mish,
                "--qkv", self.qkv, "--hift-channel-multiple", str(self.hift_channel_multiple), "--hift-dilation", self.hift_dilation]


def stage_parts(stage, variant):
    """A stage's (build, example inputs, dynamic shapes), built as `variant` says."""
    build, example, shapes = STAGES[stage]
    v = variant
    if stage == "estimator":
        build = functools.partial(build, attention=v.attention, layout=v.layout, ff_gelu=v.ff_gelu, mish=v.mish, qkv=v.qkv)
    elif stage == "hift":
        build = functools.partial(build, layout=v.layout, channel_multiple=v.hift_channel_multiple, dilation=v.hift_dilation)
        shapes = functools.partial(shapes, bounded=v.hift_dilation != "phases")
    return build, example, shapes


def set_tf32(device, precision):
    """TF32 matmuls and convolutions on for precision tf32 on CUDA, off otherwise."""
    on = precision == "tf32" and device.type == "cuda"
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on


def resolve_attention(attention, device, precision):
    """`auto`: FlashAttention where its kernel runs (CUDA, bf16/fp16), else SDPA."""
    if attention != "auto":
        return attention
    return "flash" if device.type == "cuda" and precision in ("bf16", "fp16") else "sdpa"


# inductor settings per `--tuning`.
TUNINGS = {
    "none": {},
    "coordinate-descent": {"coordinate_descent_tuning": True},
    "max-autotune": {"max_autotune": True, "coordinate_descent_tuning": True},
}


def require_on_device(exported, device_type, stage):
    """Refuses an exported program that holds a weight, buffer or lifted constant off the device it
    is compiled for: AOTInductor loads every constant onto the package's device, so a CPU constant
    in a CUDA program (a position table `Module.to` did not move, a default argument's
    `torch.zeros`) is code for one device reading another's memory — a crash at run time, where
    it cannot say why (docs/PERFORMANCE.md, session 18's SIGSEGV)."""
    tensors = {**exported.state_dict, **exported.constants}
    off = sorted(f"{name} ({t.device})" for name, t in tensors.items()
                 if isinstance(t, torch.Tensor) and t.device.type != device_type)
    if off:
        raise RuntimeError(f"the {stage} export holds {len(off)} tensor(s) off {device_type}: {', '.join(off[:5])}")


def compile_stage(stage, model_dir, device, precision, max_batch, max_frames, check, variant=Variant(), tuning="none",
                  inductor_options=None):
    """Exports and packages one stage; prints its report, then (`check`) the worst difference
    between the package and the eager module on two random batches (and, for an estimator with
    another attention or layout, between its eager module and the reference's SDPA one)."""
    build, example, shapes = stage_parts(stage, variant)
    set_tf32(device, precision)
    key = package_key(device, precision)
    module = build(model_dir, device, precision)
    started = time.time()
    with torch.no_grad():
        # The encoder's lengths are tokens (two mel frames each), at most what its position table covers.
        limit = min(max_frames // 2, ENCODER_MAX_TOKENS) if stage == "encoder" else max_frames
        exported = torch.export.export(module, example(4, 104, device), dynamic_shapes=shapes(max_batch, limit))
        require_on_device(exported, device.type, stage)
        # Which attention the graph holds (a fused SDPA kernel, or softmax and matmuls): the report says.
        attention_ops = {}
        for graph_module in exported.graph_module.modules():  # autocast regions are submodules
            if not isinstance(graph_module, torch.fx.GraphModule):
                continue
            for node in graph_module.graph.nodes:
                name = str(node.target)
                if node.op == "call_function" and ("attention" in name or "softmax" in name):
                    attention_ops[name] = attention_ops.get(name, 0) + 1
        out_dir = os.path.join(model_dir, "compiled", key)
        os.makedirs(out_dir, exist_ok=True)
        path = os.path.join(out_dir, f"{stage}.pt2")
        metadata = {"voxbatch.key": key, "voxbatch.stage": stage, "voxbatch.torch": torch.__version__.split("+")[0],
                    "voxbatch.precision": precision, "voxbatch.weights": weights_digest(model_dir),
                    "voxbatch.max_frames": str(limit), "voxbatch.max_batch": str(max_batch)}
        if stage == "estimator":
            metadata["voxbatch.frame_multiple"] = str(FRAME_MULTIPLE)
        metadata.update(variant.metadata(stage))
        metadata["voxbatch.tuning"] = tuning
        if inductor_options:
            metadata["voxbatch.inductor_options"] = json.dumps(inductor_options, sort_keys=True)
        configs = {"aot_inductor.metadata": metadata, **TUNINGS[tuning], **(inductor_options or {})}
        # Written beside its name and renamed once whole: a compile cut off (a time limit, a crash)
        # leaves no `<stage>.pt2` for a worker to load, nor a truncated one over the last good package.
        # (Under its own name in a hidden folder: the archive's root folder is named after the file.)
        partial = os.path.join(out_dir, ".partial", f"{stage}.pt2")
        os.makedirs(os.path.dirname(partial), exist_ok=True)
        torch._inductor.aoti_compile_and_package(exported, package_path=partial, inductor_configs=configs)
        os.replace(partial, path)
    report = {"package": path, "key": key, "compile_seconds": time.time() - started, "attention_ops": attention_ops, **metadata}
    # Said before the check: a failure there must not hide that (and what) the compile wrote.
    print(json.dumps(report), flush=True)
    if check:
        # Another variant's eager module against the reference's own (SDPA, reference layout), then
        # the package against the eager module (in a child process).
        if not variant.is_reference(stage):
            check_eager(stage, model_dir, device, precision, variant, module)
        check_package_in_child(stage, model_dir, device, precision, variant, path)


def list_cuda_kernels(stage, model_dir, precision, variant, inductor_options=None, batch=4, frames=104):
    """Prints the Triton kernels a CUDA compile of `stage` would launch for one call of `batch` rows
    and `frames` (static shapes), generated on this machine without a GPU (tools/fake_cuda.py): each
    kernel's name (the ops it fuses) with its launches, the extern calls, the wrapper's path."""
    import collections
    import fake_cuda
    fake_cuda.patch()
    build, example, _ = stage_parts(stage, variant)
    module = build(model_dir, torch.device("cpu"), precision)
    module.device_type = "cuda"  # its autocast, as on the GPU
    wrapper = os.path.join(tempfile.gettempdir(), f"cuda-kernels-{stage}.py")
    launches, extern, exported = fake_cuda.cuda_kernels(module, example(batch, frames, "cpu"), inductor_options, wrapper)
    require_on_device(exported, "cuda", stage)
    print(json.dumps({"stage": stage, "precision": precision, **variant.metadata(stage), "batch": batch, "frames": frames,
                      "triton_launches": len(launches), "extern_calls": len(extern),
                      "kernels": collections.Counter(launches), "extern": collections.Counter(extern), "wrapper": wrapper}))


def check_eager(stage, model_dir, device, precision, variant, module=None):
    """Prints the worst difference between `variant`'s eager module and the reference's own
    (`--eager-check`: no export, seconds on a CPU; tests/compiled.rs runs it for each variant)."""
    build, example, _ = stage_parts(stage, variant)
    set_tf32(device, precision)
    module = module or build(model_dir, device, precision)
    reference = stage_parts(stage, Variant())[0](model_dir, device, precision)
    worst = worst_difference(module, reference, example, device)
    print(json.dumps({"stage": stage, **variant.metadata(stage), "max_abs_difference_vs_reference_eager": worst}), flush=True)


def check_package_in_child(stage, model_dir, device, precision, variant, path):
    """Runs this script's `--check-package` in a child process (see the module doc: a package
    loaded into Python has killed the process on the H200 host) and says how it ended."""
    args = [sys.executable, os.path.abspath(__file__), "--model", model_dir, "--device", str(device), "--stages", stage,
            "--precision", precision, "--vocoder-precision", precision, *variant.cli_args(), "--check-package", path]
    done = subprocess.run(args, check=False)
    if done.returncode != 0:
        how = f"signal {-done.returncode}" if done.returncode < 0 else f"exit {done.returncode}"
        print(json.dumps({"package": path, "check": f"loading the package in Python failed ({how}); the package stays: "
                          "the worker loads it through libtorch's C++ loader and compares it with the eager port "
                          "(tests/compiled.rs)"}), flush=True)


def check_package(stage, model_dir, device, precision, variant, path):
    """Loads the package at `path` and prints its worst difference from the eager module."""
    build, example, _ = stage_parts(stage, variant)
    set_tf32(device, precision)
    module = build(model_dir, device, precision)
    loaded = torch._inductor.aoti_load_package(path)
    worst = worst_difference(loaded, module, example, device)
    print(json.dumps({"package": path, "max_abs_difference_vs_eager": worst}), flush=True)


def worst_difference(a, b, example, device):
    """The largest absolute difference between `a` and `b` on two random batches of `example`."""
    worst = 0.0
    with torch.no_grad():
        for batch, frames in [(2, 40), (6, 136)]:
            args = example(batch, frames, device, seed=batch)
            worst = max(worst, (a(*args) - b(*args)).abs().max().item())
    return worst


def inductor_option(text):
    """`[STAGE:]KEY=VALUE` → (stage or None, key, value), the value read as a bool, int or float
    where it is one. The key must be one of torch._inductor.config's; a stage prefix (encoder,
    estimator, hift) limits the setting to that stage's compile."""
    stage, colon, rest = text.partition(":")
    if not colon or "=" in stage:
        stage, rest = None, text
    elif stage not in STAGES:
        raise argparse.ArgumentTypeError(f"{text!r}: {stage!r} is not a stage (encoder, estimator or hift)")
    key, sep, value = rest.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r}: [STAGE:]KEY=VALUE")
    import torch._inductor.config as inductor_config
    try:
        inductor_config.get_config_copy()[key]
    except KeyError:
        raise argparse.ArgumentTypeError(f"{key!r} is not an inductor setting") from None
    for read in (lambda v: {"true": True, "false": False}[v.lower()], int, float):
        try:
            return stage, key, read(value)
        except (KeyError, ValueError):
            pass
    return stage, key, value


# Inductor settings every compile starts from (`--inductor-option` adds to them or overrides them):
# freezing folds the estimator's weights into its package at the autocast dtype — without it each
# call casts every fp32 weight to bf16 again (582 of its 888 kernel launches a call). Not the
# encoder's: freezing failed in its CUDA compile in session 18 (a CPU constant, since moved).
DEFAULT_INDUCTOR_OPTIONS = [("estimator", "freezing", True)]


def stage_inductor_options(options, stage):
    """The `--inductor-option` settings that apply to `stage`'s compile, as a dict."""
    return {key: value for only, key, value in options if only in (None, stage)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--stages", default="estimator,hift",
                    help="comma-separated: estimator, hift, encoder (not in the default: measured slower than the "
                         "eager encoder on an H200, docs/PERFORMANCE.md session 19)")
    ap.add_argument("--precision", default="bf16", choices=sorted(PRECISIONS), help="the flow's (encoder, estimator)")
    ap.add_argument("--vocoder-precision", choices=sorted(PRECISIONS), help="the vocoder's (hift); default model.toml's")
    ap.add_argument("--max-frames", type=int, default=3000, help="longest mel (frames, 50 a second) a package takes")
    ap.add_argument("--max-batch", type=int, default=1024, help="largest batch (CFG doubles the flow's batch)")
    ap.add_argument("--attention", default="auto", choices=["auto", "sdpa", "flex", "flash", "cudnn"],
                    help="the estimator's attention: SDPA with the reference's bias, FlexAttention masking padded keys in "
                         "the kernel, FlashAttention reading each item's valid keys only (CUDA, bf16/fp16), or cuDNN's "
                         "fused attention with a broadcast key bias (CUDA, bf16/fp16; experimental); "
                         "auto (default): flash on CUDA at bf16/fp16, else sdpa")
    ap.add_argument("--tuning", default="none", choices=sorted(TUNINGS),
                    help="inductor's compile-time search: none (default), coordinate-descent, max-autotune")
    ap.add_argument("--layout", default="time-major-strided-copy", choices=LAYOUTS,
                    help="each stage's activations: time-major throughout (the estimator as "
                         "tools/time_major_estimator.py computes it, the vocoder body channels-last) with the estimator's "
                         "convolution windows copied from a strided view of the padded frames by a kernel of the package "
                         "(time-major-strided-copy, the default since session 20) or by the matmul itself, with libtorch's "
                         "generic strided copy (time-major-strided, session 19's), or from a `cat` of shifted slices (time-major); time-major-shift: the "
                         "estimator's convolutions as one matmul per frame and a shifted sum, experimental; time-major-cudnn: "
                         "the estimator's convolutions through cuDNN instead of matmuls, experimental; or "
                         "channel-major as the reference computes them")
    ap.add_argument("--ff-gelu", default="epilogue", choices=FF_GELUS,
                    help="the estimator's feed-forward GELU: epilogue (default): in the input projection's cuBLASLt "
                         "matmul (tanh approximation on CUDA), or exact, a separate kernel as the reference computes it")
    ap.add_argument("--mish", default="auto", choices=["auto", "exact", "exp"],
                    help="the time-major estimator's Mish: exp, x·n/(n+2) with n = eˣ(eˣ+2), one exponential and one "
                         "division, or exact, torch's x·tanh(softplus(x)) (the same function within 1e-6); auto "
                         "(default): exp with a time-major layout, else exact")
    ap.add_argument("--qkv", default="auto", choices=["auto", "separate", "fused"],
                    help="the estimator's attention projections: fused, query, key and value in one matmul (needs "
                         "--attention flash, flex or cudnn), or separate, as the reference; auto (default): fused where "
                         "the attention allows it")
    ap.add_argument("--hift-channel-multiple", type=int, default=4, metavar="K",
                    help="the vocoder body's convolutions on the 18 STFT channels padded with zero channels to a "
                         "multiple of K (4, the default → 20: cuDNN's TF32 kernels want multiples of 4); 1: as they are. "
                         "Same result")
    ap.add_argument("--hift-dilation", default="auto", choices=["auto", *HIFT_DILATIONS],
                    help="the vocoder body's dilated convolutions: phases, each as an undilated convolution over the "
                         "time axis split into phases (time-major layouts only), or dilated, as they are; auto "
                         "(default): phases with a time-major layout, else dilated")
    ap.add_argument("--inductor-option", action="append", default=[], type=inductor_option, metavar="[STAGE:]KEY=VALUE",
                    help="an inductor setting for this compile (repeatable; e.g. realize_reads_threshold=2, or "
                         "hift:realize_reads_threshold=2 for one stage's compile alone), recorded in the package's metadata; "
                         f"after the defaults ({' '.join(f'{s}:{k}={v}' for s, k, v in DEFAULT_INDUCTOR_OPTIONS)}), which "
                         "a later setting of the same key overrides (estimator:freezing=False)")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--eager-check", action="store_true",
                    help="no compile: print each stage's eager module's worst difference from the reference's own")
    ap.add_argument("--cuda-kernels", action="store_true",
                    help="no compile: list the Triton kernels a CUDA compile would launch for one call (each named "
                         "after the ops it fuses, as GPU profiles name them), generated on this machine without a GPU "
                         "(tools/fake_cuda.py; static shapes --kernels-batch × --kernels-frames)")
    ap.add_argument("--kernels-batch", type=int, default=4, help="--cuda-kernels: rows of the call (CFG doubles the flow's)")
    ap.add_argument("--kernels-frames", type=int, default=104,
                    help="--cuda-kernels: mel frames of the call (tokens for the encoder; a multiple of 8 for the estimator)")
    ap.add_argument("--check-package", metavar="PT2", help=argparse.SUPPRESS)  # --check's child process
    a = ap.parse_args()
    a.inductor_option = DEFAULT_INDUCTOR_OPTIONS + a.inductor_option
    device = torch.device(a.device)
    _, dims = read_dims(a.model)
    vocoder = a.vocoder_precision or dims.get("vocoder_precision") or ("fp32" if dims.get("vocoder_fp32") else "tf32")
    stages = a.stages.split(",")
    for stage in stages:
        if stage not in STAGES:
            sys.exit(f"unknown stage {stage!r}: encoder, estimator or hift")
    if a.hift_channel_multiple < 1:
        sys.exit("--hift-channel-multiple: 1 or more")
    # auto: the measured fastest forms, where the layout has them (the reference's modules do not).
    hift_dilation = a.hift_dilation if a.hift_dilation != "auto" else ("dilated" if a.layout == "reference" else "phases")
    mish = a.mish if a.mish != "auto" else ("exact" if a.layout == "reference" else "exp")
    failed = []
    for stage in stages:
        precision = a.precision if stage in ("encoder", "estimator") else vocoder
        # --cuda-kernels lists what a CUDA compile builds, whatever --device says: `auto` resolves as on CUDA.
        attention = resolve_attention(a.attention, torch.device("cuda") if a.cuda_kernels else device, precision)
        qkv = a.qkv if a.qkv != "auto" else ("separate" if attention == "sdpa" else "fused")
        variant = Variant(attention=attention, layout=a.layout,
                          ff_gelu=a.ff_gelu, mish=mish, qkv=qkv, hift_channel_multiple=a.hift_channel_multiple,
                          hift_dilation=hift_dilation)
        if a.eager_check and variant.is_reference(stage):
            print(json.dumps({"stage": stage, "eager_check": "computed as the reference computes it: nothing to compare"}))
        elif a.eager_check:
            check_eager(stage, a.model, device, precision, variant)
        elif a.cuda_kernels:
            list_cuda_kernels(stage, a.model, precision, variant, stage_inductor_options(a.inductor_option, stage), a.kernels_batch, a.kernels_frames)
        elif a.check_package:
            check_package(stage, a.model, device, precision, variant, a.check_package)
        else:
            # One stage's failed compile does not stop the next stage's: the report says which failed.
            try:
                compile_stage(stage, a.model, device, precision, a.max_batch, a.max_frames, a.check, variant, a.tuning,
                              stage_inductor_options(a.inductor_option, stage))
            except Exception as e:  # noqa: BLE001 — reported, and the exit status says so
                traceback.print_exc()
                print(json.dumps({"stage": stage, "failed": f"{type(e).__name__}: {e}"[:2000]}), flush=True)
                failed.append(stage)
    if failed:
        sys.exit(f"compile failed for: {', '.join(failed)}")


if __name__ == "__main__":
    main()
