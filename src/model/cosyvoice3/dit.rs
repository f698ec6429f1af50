//! CosyVoice3's flow-matching estimator, `DiT` (cosyvoice/flow/DiT/dit.py, modules.py;
//! non-streaming): a 22-block diffusion transformer that predicts the velocity of the mel at time `t`.
//!
//! Inputs `x`, `mu`, `cond` `[B, 80, T]`, `mask` `[B, 1, T]`, `t` `[B]`, `spks` `[B, 80]` → `[B, 80, T]`.
//! Time embedding; input embedding of `x ‖ cond ‖ mu ‖ spks` with the causal convolutional
//! position embedding; `depth` AdaLN-Zero blocks (`DiTBlock`: the time modulates both layer norms
//! with shift, scale and a gate; self-attention with rotary positions on head 0; a GELU-tanh
//! feed-forward); the final AdaLN (scale first) and the projection to 80.
//!
//! Batching: attention masks padded keys (bidirectional among an item's own frames), the position
//! embedding is causal and every other layer is per frame, so a padded batch gives each item its
//! unbatched values on its frames; the attention output is zeroed at padded frames as upstream does.

use tch::{TchError, Tensor};

use super::embeddings::{InputEmbedding, Rotary, TimeEmbedding};
use crate::model::layers::{Linear, R};
use crate::model::weights::Weights;

/// The DiT's dimensions (`[cosyvoice3]` `dit_*`).
#[derive(Debug, Clone, Copy)]
pub struct DitDims {
    pub dim: i64,
    pub depth: usize,
    pub heads: i64,
    pub head_dim: i64,
    pub ff_mult: i64,
}

/// Layer norm without affine parameters, eps 1e-6, over the last dimension (`D`).
fn norm(x: &Tensor, dim: i64) -> R<Tensor> {
    x.f_layer_norm([dim], None::<&Tensor>, None::<&Tensor>, 1e-6, true)
}

/// `norm(x) · (1 + scale) + shift`, `scale`/`shift` `[B, D]` broadcast over frames.
fn modulate(x: &Tensor, dim: i64, scale: &Tensor, shift: &Tensor) -> R<Tensor> {
    norm(x, dim)?.f_mul(&scale.f_unsqueeze(1)?.f_add_scalar(1.0)?)?.f_add(&shift.f_unsqueeze(1)?)
}

/// The frames a batch attends over: the key mask every query row shares, and the padded frames.
pub struct Frames {
    /// `[B, 1, T, T]` bool (a view): key `j` valid for every query.
    keys: Tensor,
    /// `[B, T, 1]` bool: padded frames, whose attention output is zeroed.
    padded: Tensor,
    angles: (Tensor, Tensor),
}

/// `DiTBlock`: AdaLN-Zero (`attn_norm`), `Attention` with `AttnProcessor`, `ff_norm`, `FeedForward`.
struct Block {
    modulation: Linear,
    to_q: Linear,
    to_k: Linear,
    to_v: Linear,
    to_out: Linear,
    ff_in: Linear,
    ff_out: Linear,
    dim: i64,
    heads: i64,
}

impl Block {
    fn new(w: &Weights, p: &str, d: &DitDims) -> Block {
        let inner = d.heads * d.head_dim;
        let linear = |name: &str, input: i64, output: i64| Linear::new(w, &format!("{p}.{name}"), input, output, true);
        Block {
            modulation: linear("attn_norm.linear", d.dim, 6 * d.dim),
            to_q: linear("attn.to_q", d.dim, inner),
            to_k: linear("attn.to_k", d.dim, inner),
            to_v: linear("attn.to_v", d.dim, inner),
            to_out: linear("attn.to_out.0", inner, d.dim),
            ff_in: linear("ff.ff.0.0", d.dim, d.ff_mult * d.dim),
            ff_out: linear("ff.ff.2", d.ff_mult * d.dim, d.dim),
            dim: d.dim,
            heads: d.heads,
        }
    }

    /// `x` `[B, T, D]`; `time` the SiLU of the time embedding `[B, D]`.
    fn forward(&self, x: &Tensor, time: &Tensor, frames: &Frames, rotary: &Rotary) -> R<Tensor> {
        let e = self.modulation.forward(time)?.f_chunk(6, 1)?;
        let [shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp] = &e[..] else {
            return Err(TchError::Torch(format!("the block's modulation gave {} chunks, not 6", e.len())));
        };
        let n = modulate(x, self.dim, scale_msa, shift_msa)?;
        let (b, t, _) = n.size3()?;
        let q = rotary.apply(&self.to_q.forward(&n)?, &frames.angles)?;
        let k = rotary.apply(&self.to_k.forward(&n)?, &frames.angles)?;
        let v = self.to_v.forward(&n)?;
        let heads = |y: &Tensor| y.f_view([b, -1, self.heads, y.size3()?.2 / self.heads])?.f_transpose(1, 2);
        let a = Tensor::f_scaled_dot_product_attention(&heads(&q)?, &heads(&k)?, &heads(&v)?, Some(&frames.keys), 0.0, false, None, false)?;
        let a = a.f_transpose(1, 2)?.f_reshape([b, t, -1])?.f_to_kind(q.kind())?;
        let a = self.to_out.forward(&a)?.f_masked_fill(&frames.padded, 0.0)?;
        let x = x.f_add(&gate_msa.f_unsqueeze(1)?.f_mul(&a)?)?;
        let m = modulate(&x, self.dim, scale_mlp, shift_mlp)?;
        let f = self.ff_out.forward(&self.ff_in.forward(&m)?.f_gelu("tanh")?)?;
        x.f_add(&gate_mlp.f_unsqueeze(1)?.f_mul(&f)?)
    }
}

pub struct Dit {
    time: TimeEmbedding,
    input: InputEmbedding,
    rotary: Rotary,
    blocks: Vec<Block>,
    /// `norm_out.linear`: the final AdaLN's scale and shift.
    final_modulation: Linear,
    proj_out: Linear,
    dim: i64,
}

impl Dit {
    /// The estimator's weights under `p` (`flow.decoder.estimator`).
    pub fn new(w: &Weights, p: &str, d: DitDims) -> Dit {
        Dit {
            time: TimeEmbedding::new(w, &format!("{p}.time_embed"), d.dim),
            input: InputEmbedding::new(w, &format!("{p}.input_embed"), d.dim),
            rotary: Rotary::new(w, &format!("{p}.rotary_embed"), d.head_dim),
            blocks: (0..d.depth).map(|i| Block::new(w, &format!("{p}.transformer_blocks.{i}"), &d)).collect(),
            final_modulation: Linear::new(w, &format!("{p}.norm_out.linear"), d.dim, 2 * d.dim, true),
            proj_out: Linear::new(w, &format!("{p}.proj_out"), d.dim, 80, true),
            dim: d.dim,
        }
    }

    /// What the attention of a batch with `mask` (`[B, 1, T]`, 1 on valid frames) reads: made once
    /// for every step of a batch.
    pub fn frames(&self, mask: &Tensor) -> R<Frames> {
        let (b, _, t) = mask.size3()?;
        let valid = mask.f_ne(0.0)?;
        Ok(Frames {
            keys: valid.f_unsqueeze(1)?.f_expand([b, 1, t, t], false)?,
            padded: valid.f_logical_not()?.f_transpose(1, 2)?,
            angles: self.rotary.angles(t)?,
        })
    }

    /// One estimator call: `x`, `mu`, `cond` `[B, 80, T]`, `mask` `[B, 1, T]`, `t` `[B]`, `spks`
    /// `[B, 80]` → `[B, 80, T]` (in the projection's dtype: autocast's, or fp32).
    pub fn forward(&self, x: &Tensor, mask: &Tensor, mu: &Tensor, t: &Tensor, spks: &Tensor, cond: &Tensor) -> R<Tensor> {
        self.forward_with(x, mu, t, spks, cond, &self.frames(mask)?)
    }

    /// [`Dit::forward`] with the [`Frames`] made for its mask.
    pub fn forward_with(&self, x: &Tensor, mu: &Tensor, t: &Tensor, spks: &Tensor, cond: &Tensor, frames: &Frames) -> R<Tensor> {
        let time = self.time.forward(t)?;
        let major = |y: &Tensor| y.f_transpose(1, 2);
        let mut h = self.input.forward(&major(x)?, &major(cond)?, &major(mu)?, spks)?;
        let time_silu = time.f_silu()?;
        for block in &self.blocks {
            h = block.forward(&h, &time_silu, frames, &self.rotary)?;
        }
        let e = self.final_modulation.forward(&time_silu)?.f_chunk(2, 1)?;
        let [scale, shift] = &e[..] else {
            return Err(TchError::Torch(format!("the final modulation gave {} chunks, not 2", e.len())));
        };
        let h = modulate(&h, self.dim, scale, shift)?;
        self.proj_out.forward(&h)?.f_transpose(1, 2)
    }
}
