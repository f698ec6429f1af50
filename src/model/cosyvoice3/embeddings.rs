//! What the DiT embeds before its blocks (cosyvoice/flow/DiT/modules.py, dit.py; x_transformers):
//! `TimestepEmbedding` (the time), `InputEmbedding` with its `CausalConvPositionEmbedding` (the
//! noisy mel, the prompt condition, mu and the speaker, in that order), and x_transformers'
//! `RotaryEmbedding` as the DiT applies it — to the first `head_dim` channels of q and k only.

use tch::{Kind, Tensor};

use crate::model::layers::{time_sinusoids, Conv1d, Linear, R};
use crate::model::weights::Weights;

/// `TimestepEmbedding(dim, freq_embed_dim=256)`: `SinusPositionEmbedding(256)` of `t` (scale 1000,
/// sines then cosines, cast back to `t`'s dtype) → Linear(256 → D) → SiLU → Linear(D → D).
pub struct TimeEmbedding {
    mlp_in: Linear,
    mlp_out: Linear,
}

/// Width of the time sinusoids.
const FREQ_DIM: i64 = 256;

impl TimeEmbedding {
    pub fn new(w: &Weights, p: &str, dim: i64) -> TimeEmbedding {
        TimeEmbedding {
            mlp_in: Linear::new(w, &format!("{p}.time_mlp.0"), FREQ_DIM, dim, true),
            mlp_out: Linear::new(w, &format!("{p}.time_mlp.2"), dim, dim, true),
        }
    }

    /// `t` `[B]` → `[B, D]`.
    pub fn forward(&self, t: &Tensor) -> R<Tensor> {
        let s = time_sinusoids(t, FREQ_DIM)?.f_to_kind(t.kind())?;
        self.mlp_out.forward(&self.mlp_in.forward(&s)?.f_silu()?)
    }
}

/// `InputEmbedding(mel_dim, mu_dim, dim, spk_dim)` + `CausalConvPositionEmbedding(dim)` (kernel 31,
/// 16 groups, each convolution behind 30 zero frames on the left, then Mish; no mask passed):
/// `h = proj(x ‖ cond ‖ mu ‖ spks)`, `h + ccpe(h)`.
pub struct InputEmbedding {
    proj: Linear,
    conv1: Conv1d,
    conv2: Conv1d,
}

const POS_KERNEL: i64 = 31;
const POS_GROUPS: i64 = 16;

impl InputEmbedding {
    pub fn new(w: &Weights, p: &str, dim: i64) -> InputEmbedding {
        let conv = |name: &str| Conv1d::grouped(w, &format!("{p}.conv_pos_embed.{name}.0"), dim, POS_KERNEL, POS_GROUPS, (POS_KERNEL - 1, 0));
        InputEmbedding { proj: Linear::new(w, &format!("{p}.proj"), 4 * 80, dim, true), conv1: conv("conv1"), conv2: conv("conv2") }
    }

    /// `x`, `cond`, `mu` `[B, T, 80]` (time-major), `spks` `[B, 80]` → `[B, T, D]`.
    pub fn forward(&self, x: &Tensor, cond: &Tensor, mu: &Tensor, spks: &Tensor) -> R<Tensor> {
        let (b, t, c) = x.size3()?;
        let spks = spks.f_unsqueeze(1)?.f_expand([b, t, c], false)?;
        let h = self.proj.forward(&Tensor::f_cat(&[x.shallow_clone(), cond.shallow_clone(), mu.shallow_clone(), spks], -1)?)?;
        let c = h.f_permute([0, 2, 1])?;
        let c = self.conv1.forward(&c)?.f_mish()?;
        let c = self.conv2.forward(&c)?.f_mish()?;
        c.f_permute([0, 2, 1])?.f_add(&h)
    }
}

/// x_transformers' `RotaryEmbedding(head_dim)` (base 10000, no xpos, interpolation 1):
/// `θ[n, i] = n · inv_freq[i]` for positions from 0, each angle used by the interleaved channel
/// pair (2i, 2i + 1) — GPT-J style — and `apply_rotary_pos_emb`, which rotates only the first
/// `head_dim` channels of `[B, T, H·head_dim]`: head 0 alone (F5-TTS's quirk, kept upstream).
/// Computed in fp32 and cast back to the input's dtype (upstream disables autocast there).
pub struct Rotary {
    inv_freq: Tensor,
}

impl Rotary {
    pub fn new(w: &Weights, p: &str, head_dim: i64) -> Rotary {
        Rotary { inv_freq: w.get(&format!("{p}.inv_freq"), &[head_dim / 2]) }
    }

    /// `(cos, sin)` of the angles for `t` positions: `[T, head_dim]` fp32 each.
    pub fn angles(&self, t: i64) -> R<(Tensor, Tensor)> {
        let positions = Tensor::f_arange(t, (Kind::Float, self.inv_freq.device()))?;
        let theta = positions.f_unsqueeze(1)?.f_mul(&self.inv_freq.f_unsqueeze(0)?)?;
        let freqs = Tensor::f_stack(&[&theta, &theta], -1)?.f_reshape([t, -1])?;
        Ok((freqs.f_cos()?, freqs.f_sin()?))
    }

    /// `x` `[B, T, H·d]` with its first `d` channels rotated by `angles`.
    pub fn apply(&self, x: &Tensor, (cos, sin): &(Tensor, Tensor)) -> R<Tensor> {
        let (b, t, inner) = x.size3()?;
        let d = cos.size2()?.1;
        let head = x.f_narrow(2, 0, d)?;
        let pairs = head.f_reshape([b, t, d / 2, 2])?;
        let (x1, x2) = (pairs.f_select(3, 0)?, pairs.f_select(3, 1)?);
        let turned = Tensor::f_stack(&[x2.f_neg()?, x1], -1)?.f_reshape([b, t, d])?;
        let rotated = head.f_mul(cos)?.f_add(&turned.f_mul(sin)?)?;
        Tensor::f_cat(&[rotated, x.f_narrow(2, d, inner - d)?], 2)?.f_to_kind(x.kind())
    }
}
