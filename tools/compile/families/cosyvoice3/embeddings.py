"""What CosyVoice3's DiT embeds before its blocks, as voxbatch's port computes it
(src/model/cosyvoice3/embeddings.rs, at parity with the reference): `TimeEmbedding` (the flow's
time), `InputEmbedding` with its causal convolutional position embedding (the noisy mel, the prompt
condition, mu and the speaker, in that order) and `Rotary`, the rotary positions applied to the
first head's channels of queries and keys. Each module's parameters carry the names the converted
weights have under `flow.decoder.estimator.` (`time_embed.time_mlp.0`, `input_embed.proj`, …), so
that a strict load checks every one by name and shape (model.py `load_exactly`)."""
import math

import torch
import torch.nn.functional as F

# Width of the time sinusoids; the position embedding's convolutions (kernel, groups).
FREQ_DIM, POS_KERNEL, POS_GROUPS = 256, 31, 16


def time_sinusoids(t, dim):
    """The sinusoidal embedding of `t` `[B]` (layers.rs `time_sinusoids`): `dim / 2` frequencies
    `exp(−j · ln 10000 / (dim/2 − 1))`, arguments `(1000 · t) · f_j`, sines then cosines."""
    half = dim // 2
    step = math.log(10000.0) / (half - 1)
    freqs = torch.exp(torch.arange(half, dtype=torch.float32, device=t.device) * -step)
    emb = (t.unsqueeze(1) * 1000.0) * freqs.unsqueeze(0)
    return torch.cat([emb.sin(), emb.cos()], dim=-1)


class TimeEmbedding(torch.nn.Module):
    """`t` `[B]` → `[B, D]`: the sinusoids (cast to `t`'s dtype) → Linear(256 → D) → SiLU → Linear(D → D)."""

    def __init__(self, dim):
        super().__init__()
        self.time_mlp = torch.nn.Sequential(torch.nn.Linear(FREQ_DIM, dim), torch.nn.SiLU(), torch.nn.Linear(dim, dim))

    def forward(self, t):
        return self.time_mlp(time_sinusoids(t, FREQ_DIM).to(t.dtype))


class ConvPositionEmbedding(torch.nn.Module):
    """The causal convolutional position embedding: two grouped convolutions (kernel 31, 16
    groups), each behind 30 zero frames on the left and followed by Mish (`conv1` = `[conv, Mish]`,
    so its weights are `conv1.0.*` as converted)."""

    def __init__(self, dim):
        super().__init__()
        conv = lambda: torch.nn.Sequential(torch.nn.Conv1d(dim, dim, POS_KERNEL, groups=POS_GROUPS), torch.nn.Mish())  # noqa: E731
        self.conv1, self.conv2 = conv(), conv()

    def forward(self, h):
        """`h` `[B, T, D]` → the position embedding `[B, T, D]` (no mask: it is causal)."""
        c = h.permute(0, 2, 1)
        c = self.conv1(F.pad(c, (POS_KERNEL - 1, 0)))
        c = self.conv2(F.pad(c, (POS_KERNEL - 1, 0)))
        return c.permute(0, 2, 1)


class InputEmbedding(torch.nn.Module):
    """`x`, `cond`, `mu` `[B, T, 80]` (time-major), `spks` `[B, 80]` → `h + pos(h)` `[B, T, D]`,
    `h = proj(x ‖ cond ‖ mu ‖ spks)`."""

    def __init__(self, dim):
        super().__init__()
        self.proj = torch.nn.Linear(4 * 80, dim)
        self.conv_pos_embed = ConvPositionEmbedding(dim)

    def forward(self, x, cond, mu, spks):
        b, t, c = x.shape
        h = self.proj(torch.cat([x, cond, mu, spks.unsqueeze(1).expand(b, t, c)], dim=-1))
        return self.conv_pos_embed(h) + h


class Rotary(torch.nn.Module):
    """Rotary positions (base 10000, GPT-J interleaved pairs) on the first `head_dim` channels of
    `[B, T, H·head_dim]` — the first head's alone, as the reference applies them — computed in fp32
    and cast back to the input's dtype. `inv_freq` is the model's buffer."""

    def __init__(self, head_dim):
        super().__init__()
        self.register_buffer("inv_freq", torch.zeros(head_dim // 2))

    def angles(self, t):
        """`(cos, sin)` `[T, head_dim]` fp32 of positions 0..T."""
        positions = torch.arange(t, dtype=torch.float32, device=self.inv_freq.device)
        theta = positions.unsqueeze(1) * self.inv_freq.unsqueeze(0)
        freqs = torch.stack([theta, theta], dim=-1).reshape(t, -1)
        return freqs.cos(), freqs.sin()

    @staticmethod
    def rotate(x, angles):
        cos, sin = angles
        b, t, _ = x.shape
        d = cos.shape[1]
        head = x[..., :d]
        pairs = head.reshape(b, t, d // 2, 2)
        turned = torch.stack([-pairs[..., 1], pairs[..., 0]], dim=-1).reshape(b, t, d)
        rotated = head * cos + turned * sin
        return torch.cat([rotated, x[..., d:]], dim=2).to(x.dtype)
