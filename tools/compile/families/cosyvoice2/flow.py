"""CosyVoice2's flow stages as the compile tool exports them: `encoder` (`FlowEncoder`: the
reference `UpsampleConformerEncoder` and `encoder_proj`) and `estimator` (`Estimator` over the
reference `CausalConditionalDecoder`, in the forms the variant chooses: attention.py, layouts.py),
each with its example inputs and dynamic shapes.

For export only, two helpers of the reference code are replaced by exportable equivalents: the
reference's `add_optional_chunk_mask` by its non-streaming meaning without the data-dependent
`.item()` check (a row with no valid key attends to every key: what the reference does after
printing a warning), and diffusers' `Attention.prepare_attention_mask` by the same per-head repeat
without the `output_size` argument that pins the batch size.
"""
import sys

import torch

import make_parity_fixtures as mpf

from ... import attention as attention_forms
from ... import layouts
from ...flow_step import FRAME_MULTIPLE, estimator_inputs, estimator_shapes  # noqa: F401 — the estimator stage's
from ...packages import PRECISIONS
from .model import read_dims, stage_weights


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
        processor = attention_forms.PROCESSORS[attention]
        for module in estimator.modules():
            if isinstance(module, Attention):
                module.set_processor(processor())
                if qkv == "fused":
                    layouts.fuse_qkv(module)
    elif qkv == "fused":
        sys.exit("--qkv fused needs one of voxbatch's attention processors (--attention flash, flex or cudnn)")
    if ff_gelu == "epilogue":
        layouts.fuse_ff_gelus(estimator)
    if layout != "reference":
        estimator = layouts.TimeMajorDecoder(estimator, layouts.conv_path(layout), mish)
    elif mish != "exact":
        sys.exit("--mish exp needs a time-major --layout (the reference's modules keep torch's Mish)")
    return Estimator(estimator.eval().to(device), device.type, PRECISIONS[precision])


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
