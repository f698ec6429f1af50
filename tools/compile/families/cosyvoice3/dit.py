"""CosyVoice3's flow-matching estimator, the DiT, as voxbatch's port computes it
(src/model/cosyvoice3/dit.rs, at parity with the reference): `depth` AdaLN-Zero blocks (`Block`:
the time modulates both layer norms with shift, scale and a gate; self-attention over each item's
valid frames with rotary positions on the first head; a GELU-tanh feed-forward) between the time
and input embeddings (embeddings.py) and the final AdaLN (scale first) with the projection to 80.

Inputs as the flow's Euler steps give them — `x`, `mu`, `cond` `[B, 80, T]`, `mask` `[B, 1, T]`
(1 on valid frames), `t` `[B]`, `spks` `[B, 80]` — and the velocity `[B, 80, T]` out, in the last
projection's dtype. Operation for operation the port's, so under the same autocast the same
roundings: a padded batch gives each item its unbatched values on its frames (attention masks
padded keys, the position embedding is causal, every other layer is per frame; the attention
output is zeroed at padded frames). Parameter names are the converted weights' under
`flow.decoder.estimator.`."""
import torch
import torch.nn.functional as F

from .embeddings import InputEmbedding, Rotary, TimeEmbedding


def modulate(x, scale, shift):
    """Layer norm without affine parameters (eps 1e-6) · (1 + scale) + shift, per item."""
    return F.layer_norm(x, (x.shape[-1],), eps=1e-6) * (scale.unsqueeze(1) + 1.0) + shift.unsqueeze(1)


class Named(torch.nn.Module):
    """A module holding one submodule under `name` (the weights' `attn_norm.linear`, `norm_out.linear`)."""

    def __init__(self, **children):
        super().__init__()
        for name, child in children.items():
            self.add_module(name, child)


class Block(torch.nn.Module):
    """One AdaLN-Zero DiT block (dit.rs `Block`)."""

    def __init__(self, dim, heads, head_dim, ff_mult):
        super().__init__()
        inner = heads * head_dim
        self.heads = heads
        self.attn_norm = Named(linear=torch.nn.Linear(dim, 6 * dim))
        self.attn = Named(to_q=torch.nn.Linear(dim, inner), to_k=torch.nn.Linear(dim, inner), to_v=torch.nn.Linear(dim, inner),
                          to_out=torch.nn.ModuleList([torch.nn.Linear(inner, dim)]))
        # `ff.ff.0.0` and `ff.ff.2`: the feed-forward's input projection (its GELU beside it) and output.
        self.ff = Named(ff=torch.nn.Sequential(torch.nn.Sequential(torch.nn.Linear(dim, ff_mult * dim), torch.nn.GELU("tanh")),
                                               torch.nn.Identity(), torch.nn.Linear(ff_mult * dim, dim)))

    def forward(self, x, time, keys, padded, angles):
        """`x` `[B, T, D]`; `time` the SiLU of the time embedding `[B, D]`; `keys` `[B, 1, T, T]`
        bool (key valid), `padded` `[B, T, 1]` bool; `angles` the rotary table."""
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.attn_norm.linear(time).chunk(6, dim=1)
        n = modulate(x, scale_msa, shift_msa)
        b, t, _ = n.shape
        q = Rotary.rotate(self.attn.to_q(n), angles)
        k = Rotary.rotate(self.attn.to_k(n), angles)
        v = self.attn.to_v(n)

        def heads(y):
            return y.view(b, -1, self.heads, y.shape[2] // self.heads).transpose(1, 2)

        a = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), attn_mask=keys, dropout_p=0.0, is_causal=False)
        a = a.transpose(1, 2).reshape(b, t, -1).to(q.dtype)
        a = self.attn.to_out[0](a).masked_fill(padded, 0.0)
        x = x + gate_msa.unsqueeze(1) * a
        m = modulate(x, scale_mlp, shift_mlp)
        ff = self.ff.ff
        return x + gate_mlp.unsqueeze(1) * ff[2](ff[0](m))


class Dit(torch.nn.Module):
    """The DiT at the model's `[cosyvoice3]` dimensions (dit.rs `Dit::forward`)."""

    def __init__(self, dim, depth, heads, head_dim, ff_mult):
        super().__init__()
        self.time_embed = TimeEmbedding(dim)
        self.input_embed = InputEmbedding(dim)
        self.rotary_embed = Rotary(head_dim)
        self.transformer_blocks = torch.nn.ModuleList([Block(dim, heads, head_dim, ff_mult) for _ in range(depth)])
        self.norm_out = Named(linear=torch.nn.Linear(dim, 2 * dim))
        self.proj_out = torch.nn.Linear(dim, 80)

    def forward(self, x, mask, mu, t, spks, cond):
        b, _, frames = mask.shape
        valid = mask != 0
        keys = valid.unsqueeze(1).expand(b, 1, frames, frames)
        padded = valid.logical_not().transpose(1, 2)
        angles = self.rotary_embed.angles(frames)
        time = self.time_embed(t)
        h = self.input_embed(x.transpose(1, 2), cond.transpose(1, 2), mu.transpose(1, 2), spks)
        time_silu = F.silu(time)
        for block in self.transformer_blocks:
            h = block(h, time_silu, keys, padded, angles)
        scale, shift = self.norm_out.linear(time_silu).chunk(2, dim=1)
        return self.proj_out(modulate(h, scale, shift)).transpose(1, 2)
