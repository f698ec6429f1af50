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

use super::layers::{Conv1d, LayerNorm, Linear};
use super::weights::Weights;

const D: i64 = 512;
const LOOKAHEAD: i64 = 3;

/// ESPnet's relative positional encoding for `t` positions: `[1, 2t − 1, d]`, relative positions
/// `t − 1` down to `−(t − 1)`, interleaved sin/cos as `EspnetRelPositionalEncoding` builds them.
fn rel_positions(t: i64, d: i64, device: tch::Device) -> Tensor {
    let opts = (Kind::Float, device);
    let position = Tensor::arange(t, opts).unsqueeze(1);
    let div = (Tensor::arange_start_step(0, d, 2, opts) * -(10000f64.ln() / d as f64)).exp();
    let interleave = |sin: Tensor, cos: Tensor| Tensor::stack(&[sin, cos], 2).view([t, d]);
    let angle = &position * &div;
    let positive = interleave(angle.sin(), angle.cos()).flip([0]);
    let neg_angle = (&position * -1.0) * &div;
    let negative = interleave(neg_angle.sin(), neg_angle.cos()).narrow(0, 1, t - 1);
    Tensor::cat(&[positive, negative], 0).unsqueeze(0)
}

struct RelSelfAttention {
    q: Linear,
    k: Linear,
    v: Linear,
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
            q: Linear::new(w, &format!("{p}.linear_q"), D, D, true),
            k: Linear::new(w, &format!("{p}.linear_k"), D, D, true),
            v: Linear::new(w, &format!("{p}.linear_v"), D, D, true),
            out: Linear::new(w, &format!("{p}.linear_out"), D, D, true),
            pos: Linear::new(w, &format!("{p}.linear_pos"), D, D, false),
            bias_u: w.get(&format!("{p}.pos_bias_u"), &[heads, dk]),
            bias_v: w.get(&format!("{p}.pos_bias_v"), &[heads, dk]),
            heads,
        }
    }

    /// `x`: `[B, T, D]`; `key_pad`: `[B, 1, 1, T]` true where the key is padding; `pos`: `[1, 2T−1, D]`.
    fn forward(&self, x: &Tensor, key_pad: &Tensor, pos: &Tensor) -> Tensor {
        let (b, t, _) = x.size3().unwrap_or((0, 0, 0));
        let (h, dk) = (self.heads, D / self.heads);
        let q = self.q.forward(x).view([b, t, h, dk]);
        let k = self.k.forward(x).view([b, t, h, dk]).transpose(1, 2);
        let v = self.v.forward(x).view([b, t, h, dk]).transpose(1, 2);
        let p = self.pos.forward(pos).view([1, -1, h, dk]).transpose(1, 2);
        let q_u = (&q + &self.bias_u).transpose(1, 2);
        let q_v = (&q + &self.bias_v).transpose(1, 2);
        let ac = q_u.matmul(&k.transpose(-2, -1));
        let bd = rel_shift(&q_v.matmul(&p.transpose(-2, -1)));
        let scores = (ac + bd) / (dk as f64).sqrt();
        let attn = scores.masked_fill(key_pad, f64::NEG_INFINITY).softmax(-1, None::<Kind>).masked_fill(key_pad, 0.0);
        let ctx = attn.matmul(&v).transpose(1, 2).contiguous().view([b, t, h * dk]);
        self.out.forward(&ctx)
    }
}

/// Transformer-XL's shift: `[B, H, T, 2T−1]` scores by relative position → `[B, H, T, T]` by key.
fn rel_shift(x: &Tensor) -> Tensor {
    let s = x.size();
    let (b, h, t1, n) = (s[0], s[1], s[2], s[3]);
    let zero = Tensor::zeros([b, h, t1, 1], (x.kind(), x.device()));
    let padded = Tensor::cat(&[zero, x.shallow_clone()], -1).view([b, h, n + 1, t1]);
    padded.narrow(2, 1, n).reshape([b, h, t1, n]).narrow(3, 0, n / 2 + 1)
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
    fn forward(&self, x: &Tensor, key_pad: &Tensor, pos: &Tensor) -> Tensor {
        let x = x + self.attn.forward(&self.norm_mha.forward(x), key_pad, pos);
        &x + self.w_2.forward(&self.w_1.forward(&self.norm_ff.forward(&x)).silu())
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
    fn forward(&self, x: &Tensor) -> (Tensor, Tensor) {
        let t = x.size()[1];
        let x = self.norm.forward(&self.linear.forward(x)) * (D as f64).sqrt();
        let pos = rel_positions(t, D, x.device());
        (x, pos)
    }
}

pub struct Encoder {
    embed: Embed,
    lookahead1: Conv1d,
    lookahead2: Conv1d,
    layers: Vec<EncoderLayer>,
    up_conv: Conv1d,
    up_embed: Embed,
    up_layers: Vec<EncoderLayer>,
    after_norm: LayerNorm,
}

impl Encoder {
    pub fn new(w: &Weights, p: &str, heads: i64, units: i64, blocks: usize, up_blocks: usize) -> Encoder {
        Encoder {
            embed: Embed::new(w, &format!("{p}.embed")),
            lookahead1: Conv1d::new(w, &format!("{p}.pre_lookahead_layer.conv1"), D, D, LOOKAHEAD + 1, 1, 1, (0, LOOKAHEAD)),
            lookahead2: Conv1d::causal(w, &format!("{p}.pre_lookahead_layer.conv2"), D, D, 3),
            layers: (0..blocks).map(|i| EncoderLayer::new(w, &format!("{p}.encoders.{i}"), heads, units)).collect(),
            up_conv: Conv1d::new(w, &format!("{p}.up_layer.conv"), D, D, 5, 1, 1, (4, 0)),
            up_embed: Embed::new(w, &format!("{p}.up_embed")),
            up_layers: (0..up_blocks).map(|i| EncoderLayer::new(w, &format!("{p}.up_encoders.{i}"), heads, units)).collect(),
            after_norm: LayerNorm::new(w, &format!("{p}.after_norm"), D, 1e-5),
        }
    }

    /// `xs`: `[B, T, 512]` masked token embeddings; `mask`: `[B, T]` → `[B, 2T, 512]`.
    pub fn forward(&self, xs: &Tensor, mask: &Tensor) -> Tensor {
        let (x, pos) = self.embed.forward(xs);
        let x = x * mask.unsqueeze(-1);
        // Pre-lookahead: each token sees the next three.
        let c = x.transpose(1, 2);
        let c = self.lookahead1.forward(&c).leaky_relu();
        let c = self.lookahead2.forward(&c).transpose(1, 2);
        let mut x = c + x;
        let key_pad = mask.eq(0.0).view([mask.size()[0], 1, 1, -1]);
        for layer in &self.layers {
            x = layer.forward(&x, &key_pad, &pos);
        }
        // ×2 upsampling to the mel frame rate.
        let up = x.transpose(1, 2).repeat_interleave_self_int(2, 2, None);
        let x = self.up_conv.forward(&up).transpose(1, 2);
        let mask2 = mask.repeat_interleave_self_int(2, 1, None);
        let (mut x, pos) = self.up_embed.forward(&x);
        let key_pad = mask2.eq(0.0).view([mask2.size()[0], 1, 1, -1]);
        for layer in &self.up_layers {
            x = layer.forward(&x, &key_pad, &pos);
        }
        self.after_norm.forward(&x)
    }
}
