"""The estimator's self-attention in the forms `--attention` chooses, as diffusers attention
processors (`Attention.set_processor`): `SelfAttention` does the projections, `attend` the
attention over each item's valid keys.

- `sdpa`: the reference's own processor, SDPA with the decoder's `[B·heads, T, T]` key bias.
- `flex` (experimental, not yet measured on a GPU): FlexAttention (`FlexSelfAttention`), padded
  keys masked inside the kernel, no bias in memory; its eager module equals the SDPA one (4e-6 on
  the tiny model), but inductor's CPU backend refuses to compile it (torch 2.11), so on a CPU it
  serves only that comparison.
- `flash`: FlashAttention's varlen kernel on the padded layout with each item's key count
  (`FlashSelfAttention`; AOTInductor keeps it as a call to aten's kernel): no bias, padded keys
  never read; on a CPU or in fp32 it is SDPA with a boolean key mask. Measured on the H200
  (2026-12-04, bf16, batch 128): token2wav 664.6 audio-s/s with it against 576.3 with SDPA, so
  `auto` (the default) is flash on CUDA at bf16/fp16 and sdpa elsewhere (`resolve_attention`).
- `cudnn`: cuDNN's fused attention (`CudnnSelfAttention`): measured on the H200 (2026-12-04, with
  the FF epilogue) token2wav 647.4 audio-s/s — attention 0.90 s against FlashAttention's 0.31
  (cuDNN with a key bias) — so it stays an experiment.
- `cudnn-masked` (cuDNN with no mask, the key-padding mask folded into 8 added head dimensions)
  and `cudnn-varlen` (cuDNN on each item's valid keys gathered end to end) were tried and dropped
  (docs/PERFORMANCE.md#2026-12-06-h100h, #2026-12-07-h100i): at the 72 head dimensions the first
  needs, cuDNN's kernel is 4 % faster than FlashAttention 2 (at 64, 30 %), and its package ran
  token2wav at 570.6 audio-s/s against the default's 946.7 (an H100, 2026-12-07); AOTInductor
  cannot package the second's `aten::_cudnn_attention_forward`, which returns SymInts, and its
  kernel took 40–59 ms a call against FlashAttention's 0.6.
"""
import torch

# --attention values (auto resolves to one of the others).
ATTENTIONS = ["auto", "sdpa", "flex", "flash", "cudnn"]


def resolve_attention(attention, device, precision):
    """`auto`: FlashAttention where its kernel runs (CUDA, bf16/fp16), else SDPA."""
    if attention != "auto":
        return attention
    return "flash" if device.type == "cuda" and precision in ("bf16", "fp16") else "sdpa"


class SelfAttention:
    """diffusers' `AttnProcessor2_0` as the estimator's self-attention uses it (no cross-attention,
    norms, residual or rescale), with the attention itself left to `attend`: query, key and value
    `[B, T, heads·d]` and each item's valid keys `[B, T]` (the first row of the decoder's bias:
    every row of a non-streaming bias is the same key-padding mask) → `[B, T, heads·d]`. An
    `Attention` given `layouts.fuse_qkv` projects query, key and value in one matmul (`--qkv fused`)."""

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
    −inf instead of −1e10 (identical after softmax: no row is fully masked, the family's
    exportable chunk mask sees to that)."""

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
        # An item with no valid frame attends to every key, as the exportable chunk mask makes the reference do.
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
    """Through cuDNN's fused attention (`--attention cudnn`, experimental): aten's cuDNN SDPA kernel
    called directly (AOTInductor keeps it as a call), each item's padded keys out through an
    additive bias broadcast over heads and query rows (`[B, 1, 1, T]` expanded, no
    `[B·heads, T, T]` copy). cuDNN's Hopper kernels use the wgmma/TMA instructions FlashAttention 2
    (`flash`) does not. On a CPU or in fp32 it is `FlashSelfAttention`'s fallback (SDPA with a
    boolean key mask)."""

    def attend(self, query, key, value, valid, heads):
        if not (query.device.type == "cuda" and query.dtype in (torch.bfloat16, torch.float16)):
            return FlashSelfAttention.attend(self, query, key, value, valid, heads)
        b, t, inner = query.shape
        # An item with no valid frame attends to every key, as the exportable chunk mask makes the reference do.
        valid = valid | (valid.sum(dim=-1, keepdim=True) == 0)
        bias = torch.zeros(b, 1, 1, t, dtype=query.dtype, device=query.device).masked_fill(~valid[:, None, None, :], float("-inf"))
        q, k, v = (x.view(b, t, heads, inner // heads).transpose(1, 2) for x in (query, key, value))
        out = torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, bias.expand(b, heads, t, t), False)[0]
        return out.transpose(1, 2).reshape(b, t, inner)


# The processors voxbatch adds (sdpa keeps the reference's own).
PROCESSORS = {"flex": FlexSelfAttention, "flash": FlashSelfAttention, "cudnn": CudnnSelfAttention}
