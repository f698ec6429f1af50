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
- `cudnn-masked` (experimental, not yet measured in a package): cuDNN's fused attention with no
  mask and no bias (`CudnnMaskedSelfAttention`), the key-padding mask folded into added head
  dimensions. FlashAttention 2 is a quarter of token2wav's kernel time on the H100 (2026-12-06,
  docs/PERFORMANCE.md#2026-12-06-h100g); cuDNN's kernel with no mask at head dimension 64 is 30 %
  faster at the pipeline's shapes (at 72, as here, not yet measured). `cudnn-varlen`, cuDNN on
  each item's valid keys gathered end to end, was tried and dropped on 2026-12-06: AOTInductor
  cannot package `aten::_cudnn_attention_forward`, which returns SymInts, and the kernel took
  40–59 ms a call against FlashAttention's 0.6.
"""
import torch

# --attention values (auto resolves to one of the others).
ATTENTIONS = ["auto", "sdpa", "flex", "flash", "cudnn", "cudnn-masked"]


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


# Head dimensions `--attention cudnn-masked` adds: one carries the key-padding mask, the rest keep
# the head dimension a multiple of 8 (cuDNN's rule; 72 × 2 bytes keeps each row 16-byte aligned).
MASK_DIMS = 8
# A padded key's mask dimension: × the query's 1 × the scale (1/8 at head dimension 64) = −3750 in
# the score, whose exponential is 0 in fp32 — as the reference's −1e10 bias makes it. Exact in bf16
# and fp16 to three digits; valid keys carry 0 there, so their scores are the reference's.
MASKED_KEY = -30000.0


def mask_in_head_dims(query, key, value, valid, heads):
    """`[B, T, heads·d]` query, key and value → `[B, heads, T, d + MASK_DIMS]` each, the key-padding
    mask folded into the added dimensions: the query's first is 1, a valid key's 0, a padded key's
    `MASKED_KEY`; the value's are 0 (the output's added dimensions are 0 and dropped). An item with
    no valid frame keeps every key, as the exportable chunk mask makes the reference attend to all."""
    b, t, inner = query.shape
    d = inner // heads
    valid = valid | (valid.sum(dim=-1, keepdim=True) == 0)
    zeros = query.new_zeros(b, t, heads, MASK_DIMS - 1)
    one = query.new_ones(b, t, heads, 1)
    key_mask = torch.where(valid, 0.0, MASKED_KEY).to(query.dtype)[:, :, None, None].expand(b, t, heads, 1)
    q = torch.cat([query.view(b, t, heads, d), one, zeros], dim=-1)
    k = torch.cat([key.view(b, t, heads, d), key_mask, zeros], dim=-1)
    v = torch.cat([value.view(b, t, heads, d), zeros, zeros[..., :1]], dim=-1)
    return (x.transpose(1, 2) for x in (q, k, v))


class CudnnMaskedSelfAttention(SelfAttention):
    """Through cuDNN's fused attention with no mask (`--attention cudnn-masked`, experimental): the
    key-padding mask folded into `MASK_DIMS` more head dimensions (`mask_in_head_dims`), so that a
    padded key's score is −3750 and its weight 0 while a valid key's score is the reference's, and
    the scale stays the reference's `1/sqrt(d)`. On an H100 (2026-12-06, bf16, 512 rows of 280
    frames, 8 × 64 heads, tools/bench_attention_kernels.py) cuDNN's kernel with no mask took 0.438
    ms against FlashAttention 2's 0.619, and with the mask as a bias (`cudnn`) 0.675; at the 72 head
    dimensions this form runs, not yet measured (`cudnn-aug8` of that tool). On a CPU or in
    fp32 the same tensors through SDPA: what `--eager-check` compares with the reference."""

    def attend(self, query, key, value, valid, heads):
        b, t, inner = query.shape
        d = inner // heads
        q, k, v = mask_in_head_dims(query, key, value, valid, heads)
        if query.device.type == "cuda" and query.dtype in (torch.bfloat16, torch.float16):
            out = torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, False, scale=d ** -0.5)[0]
        else:
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=d ** -0.5)
        return out[..., :d].transpose(1, 2).reshape(b, t, inner)


# The processors voxbatch adds (sdpa keeps the reference's own).
PROCESSORS = {"flex": FlexSelfAttention, "flash": FlashSelfAttention, "cudnn": CudnnSelfAttention,
              "cudnn-masked": CudnnMaskedSelfAttention}
