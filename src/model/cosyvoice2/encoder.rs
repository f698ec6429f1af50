//! CosyVoice2's `UpsampleConformerEncoder` as its flow uses it (no convolution module, no macaron
//! feed-forward, relative-position self-attention, non-streaming): token embeddings `[B, T, 512]`
//! at 25 Hz → hidden states `[B, 2T, 512]` at 50 Hz.
//!
//! Stages: linear embed + layer norm + √d scale → pre-lookahead convolutions (3 tokens ahead) →
//! `blocks` conformer layers → nearest ×2 upsampling + causal conv → embed again → `up_blocks`
//! layers → final layer norm. Padding: the only place where padded positions could leak into valid
//! ones is the look-ahead convolution, so they are zeroed before it, as an unbatched run pads with
//! zeros; attention masks padded keys.

use tch::{Kind, Tensor};

use crate::model::layers::{Conv1d, LayerNorm, Linear, R};
use crate::model::pre_lookahead::PreLookahead;
use crate::model::weights::Weights;

const D: i64 = 512;
const LOOKAHEAD: i64 = 3;

/// ESPnet's relative positional encoding for `t` positions: `[1, 2t − 1, d]`, relative positions
/// `t − 1` down to `−(t − 1)`, interleaved sin/cos as `EspnetRelPositionalEncoding` builds them.
fn rel_positions(t: i64, d: i64, device: tch::Device) -> R<Tensor> {
    let opts = (Kind::Float, device);
    let position = Tensor::f_arange(t, opts)?.f_unsqueeze(1)?;
    let div = Tensor::f_arange_start_step(0, d, 2, opts)?.f_mul_scalar(-(10000f64.ln() / d as f64))?.f_exp()?;
    let interleave = |angle: &Tensor| -> R<Tensor> { Tensor::f_stack(&[angle.f_sin()?, angle.f_cos()?], 2)?.f_view([t, d]) };
    let angle = position.f_mul(&div)?;
    let positive = interleave(&angle)?.f_flip([0])?;
    let neg_angle = position.f_mul_scalar(-1.0)?.f_mul(&div)?;
    let negative = interleave(&neg_angle)?.f_narrow(0, 1, t - 1)?;
    Tensor::f_cat(&[positive, negative], 0)?.f_unsqueeze(0)
}

/// [`rel_positions`] computed once for the longest sequence seen so far and cut for each call:
/// a relative position's encoding does not depend on the sequence's length, so the central
/// `2t − 1` rows of a longer table are `rel_positions(t)` exactly — a view instead of a dozen
/// small kernels per call (the eager encoder is launch-bound on short buckets). Grows by
/// doubling; holds `(4t − 1) × 512` fp32 at most for the longest `t`.
struct PositionTable {
    table: std::cell::RefCell<Option<(i64, Tensor)>>,
}

impl PositionTable {
    fn new() -> Self {
        PositionTable { table: std::cell::RefCell::new(None) }
    }

    /// `rel_positions(t, D, device)`, as a view of the table.
    fn get(&self, t: i64, device: tch::Device) -> R<Tensor> {
        let mut slot = self.table.borrow_mut();
        let (len, table) = match slot.take() {
            Some((len, table)) if len >= t && table.device() == device => (len, table),
            old => {
                let len = old.map_or(t, |(len, _)| t.max(2 * len));
                (len, rel_positions(len, D, device)?)
            }
        };
        let cut = table.f_narrow(1, len - t, 2 * t - 1);
        *slot = Some((len, table));
        cut
    }
}

struct RelSelfAttention {
    /// `linear_q`, `linear_k` and `linear_v` as one projection.
    qkv: Linear,
    out: Linear,
    pos: Linear,
    bias_u: Tensor,
    bias_v: Tensor,
    heads: i64,
}

impl RelSelfAttention {
    fn new(w: &Weights, p: &str, heads: i64) -> Self {
        let dk = D / heads;
        RelSelfAttention {
            qkv: Linear::fused(w, &[&format!("{p}.linear_q"), &format!("{p}.linear_k"), &format!("{p}.linear_v")], D, D, true),
            out: Linear::new(w, &format!("{p}.linear_out"), D, D, true),
            pos: Linear::new(w, &format!("{p}.linear_pos"), D, D, false),
            bias_u: w.get(&format!("{p}.pos_bias_u"), &[heads, dk]),
            bias_v: w.get(&format!("{p}.pos_bias_v"), &[heads, dk]),
            heads,
        }
    }

    /// The projections' parameters in `kind` (`Linear::cast_for_autocast`). The position biases
    /// stay fp32: they are added outside autocast's casts, and bf16 copies would round the sums.
    fn cast_for_autocast(&mut self, kind: Kind) -> R<()> {
        self.qkv.cast_for_autocast(kind)?;
        self.out.cast_for_autocast(kind)?;
        self.pos.cast_for_autocast(kind)
    }

    /// `x`: `[B, T, D]`; `key_pad`: `[B, 1, 1, T]` true where the key is padding; `pos`: `[1, 2T−1, D]`.
    fn forward(&self, x: &Tensor, key_pad: &Tensor, pos: &Tensor) -> R<Tensor> {
        let (b, t, _) = x.size3()?;
        let (h, dk) = (self.heads, D / self.heads);
        let qkv = self.qkv.forward(x)?.f_view([b, t, 3, h, dk])?;
        let q = qkv.f_select(2, 0)?;
        let k = qkv.f_select(2, 1)?.f_transpose(1, 2)?;
        let v = qkv.f_select(2, 2)?.f_transpose(1, 2)?;
        let p = self.pos.forward(pos)?.f_view([1, -1, h, dk])?.f_transpose(1, 2)?;
        let q_u = q.f_add(&self.bias_u)?.f_transpose(1, 2)?;
        let q_v = q.f_add(&self.bias_v)?.f_transpose(1, 2)?;
        // softmax((q_u·kᵀ + shift(q_v·pᵀ)) / √dk) over valid keys: the position term, scaled and
        // with padded keys at −∞, is SDPA's additive mask (one fused kernel on CUDA instead of the
        // reference's scores, sum, scaling, masking and float softmax, each a pass over B·H·T²).
        // Every query has a valid key (its own item's), so no row is all −∞.
        let bd = rel_shift(&q_v.f_matmul(&p.f_transpose(-2, -1)?)?)?;
        let bias = bd.f_div_scalar((dk as f64).sqrt())?.f_masked_fill(key_pad, f64::NEG_INFINITY)?;
        let ctx = Tensor::f_scaled_dot_product_attention(&q_u, &k, &v, Some(&bias), 0.0, false, None, false)?;
        let ctx = ctx.f_transpose(1, 2)?.f_contiguous()?.f_view([b, t, h * dk])?;
        self.out.forward(&ctx)
    }
}

/// Transformer-XL's shift: `[B, H, T, 2T−1]` scores by relative position → `[B, H, T, T]` by key,
/// as a view (the reference pads a zero column and copies twice). Query `i`'s score for key `j`
/// is at relative index `T − 1 − i + j`, i.e. at flat offset `(T − 1) + i·(2T − 2) + j` of each
/// head's row-major scores: rows `2T − 2` apart, starting at `T − 1`.
fn rel_shift(x: &Tensor) -> R<Tensor> {
    let (b, h, t, n) = x.size4()?;
    if t == 1 {
        return Ok(x.shallow_clone());
    }
    x.f_contiguous()?.f_view([b, h, t * n])?.f_narrow(2, t - 1, t * (n - 1))?.f_view([b, h, t, n - 1])?.f_narrow(3, 0, t)
}

struct EncoderLayer {
    norm_mha: LayerNorm,
    attn: RelSelfAttention,
    norm_ff: LayerNorm,
    w_1: Linear,
    w_2: Linear,
}

impl EncoderLayer {
    fn new(w: &Weights, p: &str, heads: i64, units: i64) -> Self {
        EncoderLayer {
            norm_mha: LayerNorm::new(w, &format!("{p}.norm_mha"), D, 1e-12),
            attn: RelSelfAttention::new(w, &format!("{p}.self_attn"), heads),
            norm_ff: LayerNorm::new(w, &format!("{p}.norm_ff"), D, 1e-12),
            w_1: Linear::new(w, &format!("{p}.feed_forward.w_1"), D, units, true),
            w_2: Linear::new(w, &format!("{p}.feed_forward.w_2"), units, D, true),
        }
    }
    fn cast_for_autocast(&mut self, kind: Kind) -> R<()> {
        self.attn.cast_for_autocast(kind)?;
        self.w_1.cast_for_autocast(kind)?;
        self.w_2.cast_for_autocast(kind)
    }
    fn forward(&self, x: &Tensor, key_pad: &Tensor, pos: &Tensor) -> R<Tensor> {
        let x = x.f_add(&self.attn.forward(&self.norm_mha.forward(x)?, key_pad, pos)?)?;
        x.f_add(&self.w_2.forward(&self.w_1.forward(&self.norm_ff.forward(&x)?)?.f_silu()?)?)
    }
}

/// `LinearNoSubsampling` + `EspnetRelPositionalEncoding`: linear, layer norm, scale by √d.
struct Embed {
    linear: Linear,
    norm: LayerNorm,
}

impl Embed {
    fn new(w: &Weights, p: &str) -> Self {
        Embed { linear: Linear::new(w, &format!("{p}.out.0"), D, D, true), norm: LayerNorm::new(w, &format!("{p}.out.1"), D, 1e-5) }
    }
    fn forward(&self, x: &Tensor, positions: &PositionTable) -> R<(Tensor, Tensor)> {
        let (_, t, _) = x.size3()?;
        let x = self.norm.forward(&self.linear.forward(x)?)?.f_mul_scalar((D as f64).sqrt())?;
        let pos = positions.get(t, x.device())?;
        Ok((x, pos))
    }
}

pub struct Encoder {
    embed: Embed,
    lookahead: PreLookahead,
    layers: Vec<EncoderLayer>,
    up_conv: Conv1d,
    up_embed: Embed,
    up_layers: Vec<EncoderLayer>,
    after_norm: LayerNorm,
    /// The relative positions' encodings, for both frame rates.
    positions: PositionTable,
}

impl Encoder {
    pub fn new(w: &Weights, p: &str, heads: i64, units: i64, blocks: usize, up_blocks: usize) -> Encoder {
        Encoder {
            embed: Embed::new(w, &format!("{p}.embed")),
            lookahead: PreLookahead::new(w, &format!("{p}.pre_lookahead_layer"), D, D, LOOKAHEAD),
            layers: (0..blocks).map(|i| EncoderLayer::new(w, &format!("{p}.encoders.{i}"), heads, units)).collect(),
            up_conv: Conv1d::new(w, &format!("{p}.up_layer.conv"), D, D, 5, 1, 1, (4, 0)),
            up_embed: Embed::new(w, &format!("{p}.up_embed")),
            up_layers: (0..up_blocks).map(|i| EncoderLayer::new(w, &format!("{p}.up_encoders.{i}"), heads, units)).collect(),
            after_norm: LayerNorm::new(w, &format!("{p}.after_norm"), D, 1e-5),
            positions: PositionTable::new(),
        }
    }

    /// Its projections' and convolutions' parameters in `kind`, the flow's autocast dtype, once
    /// (`Linear::cast_for_autocast`: the same values, fewer kernels a call — the encoder is eager
    /// and, on short buckets, bound by its launches). Layer norms and the position biases stay
    /// fp32, as autocast keeps them. The encoder must then run under that autocast only.
    pub fn cast_for_autocast(&mut self, kind: Kind) -> R<()> {
        self.embed.linear.cast_for_autocast(kind)?;
        self.lookahead.cast_for_autocast(kind)?;
        self.up_conv.cast_for_autocast(kind)?;
        self.up_embed.linear.cast_for_autocast(kind)?;
        for layer in self.layers.iter_mut().chain(self.up_layers.iter_mut()) {
            layer.cast_for_autocast(kind)?;
        }
        Ok(())
    }

    /// `xs`: `[B, T, 512]` masked token embeddings; `mask`: `[B, T]` → `[B, 2T, 512]`.
    pub fn forward(&self, xs: &Tensor, mask: &Tensor) -> R<Tensor> {
        let (x, pos) = self.embed.forward(xs, &self.positions)?;
        let x = x.f_mul(&mask.f_unsqueeze(-1)?)?;
        // Pre-lookahead: each token sees the next three.
        let mut x = self.lookahead.forward(&x)?;
        let b = mask.size2()?.0;
        let key_pad = mask.f_eq(0.0)?.f_view([b, 1, 1, -1])?;
        for layer in &self.layers {
            x = layer.forward(&x, &key_pad, &pos)?;
        }
        // ×2 upsampling to the mel frame rate.
        let up = x.f_transpose(1, 2)?.f_repeat_interleave_self_int(2, 2, None)?;
        let x = self.up_conv.forward(&up)?.f_transpose(1, 2)?;
        let mask2 = mask.f_repeat_interleave_self_int(2, 1, None)?;
        let (mut x, pos) = self.up_embed.forward(&x, &self.positions)?;
        let key_pad = mask2.f_eq(0.0)?.f_view([b, 1, 1, -1])?;
        for layer in &self.up_layers {
            x = layer.forward(&x, &key_pad, &pos)?;
        }
        self.after_norm.forward(&x)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference's shift: a zero column padded in front, rows re-cut, the left half kept.
    fn padded_shift(x: &Tensor) -> Tensor {
        let (b, h, t, n) = x.size4().unwrap();
        let zero = Tensor::zeros([b, h, t, 1], (x.kind(), x.device()));
        let padded = Tensor::cat(&[zero, x.shallow_clone()], -1).view([b, h, n + 1, t]);
        padded.narrow(2, 1, n).reshape([b, h, t, n]).narrow(3, 0, n / 2 + 1)
    }

    #[test]
    fn a_position_table_cut_for_each_length_gives_that_lengths_encodings_exactly() {
        let table = PositionTable::new();
        let cpu = tch::Device::Cpu;
        // Growing, shrinking and growing past a doubling.
        for t in [3, 1, 7, 50, 2, 51, 130, 130, 9] {
            let cut = table.get(t, cpu).unwrap();
            let direct = rel_positions(t, D, cpu).unwrap();
            assert_eq!(cut.size(), [1, 2 * t - 1, D], "t = {t}");
            assert!(cut.equal(&direct), "t = {t}: the table's rows differ from rel_positions({t})");
        }
        assert_eq!(table.table.borrow().as_ref().map(|(len, _)| *len), Some(200), "3 → 7 → 50 → 100 → 200: grown by doubling");
    }

    #[test]
    fn the_relative_shift_as_a_view_gives_the_padded_shifts_scores() {
        for t in [1, 2, 3, 7, 50] {
            let x = Tensor::randn([2, 3, t, 2 * t - 1], (Kind::Float, tch::Device::Cpu));
            let shifted = rel_shift(&x).unwrap();
            assert_eq!(shifted.size(), [2, 3, t, t]);
            assert!(shifted.equal(&padded_shift(&x)), "t = {t}");
        }
    }
}
