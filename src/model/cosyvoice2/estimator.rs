//! CosyVoice2's flow-matching estimator, `CausalConditionalDecoder` (non-streaming): a Matcha-style
//! 1-D U-Net that predicts the velocity `dφ/dt` of the mel at time `t`.
//!
//! Input `[B, 320, T]` = x ‖ mu ‖ speaker ‖ prompt condition (80 channels each); a sinusoidal time
//! embedding through an MLP conditions every ResNet block. With CosyVoice2's one channel level the
//! "down" and "up" blocks keep the length (their resampling convolutions are causal stride-1 convs).
//! Every block is causal in time, and attention masks padded keys, so padded items of a batch give
//! exactly their unbatched values on their valid frames.

use tch::{Kind, Tensor};

use super::layers::{Conv1d, LayerNorm, Linear, R};
use super::weights::Weights;

const IN: i64 = 320;
const MEL: i64 = 80;

/// `CausalBlock1D`: causal conv k=3 → layer norm over channels → mish, masked before and after.
struct CausalBlock {
    conv: Conv1d,
    norm: LayerNorm,
}

impl CausalBlock {
    fn new(w: &Weights, p: &str, input: i64, output: i64) -> Self {
        CausalBlock {
            conv: Conv1d::causal(w, &format!("{p}.block.0"), input, output, 3),
            norm: LayerNorm::new(w, &format!("{p}.block.2"), output, 1e-5),
        }
    }
    fn forward(&self, x: &Tensor, mask: &Tensor) -> R<Tensor> {
        let h = self.conv.forward(&x.f_mul(mask)?)?;
        self.norm.forward(&h.f_transpose(1, 2)?)?.f_transpose(1, 2)?.f_mish()?.f_mul(mask)
    }
}

/// `CausalResnetBlock1D`.
struct ResnetBlock {
    mlp: Linear,
    block1: CausalBlock,
    block2: CausalBlock,
    res_conv: Conv1d,
}

impl ResnetBlock {
    fn new(w: &Weights, p: &str, input: i64, output: i64, time_dim: i64) -> Self {
        ResnetBlock {
            mlp: Linear::new(w, &format!("{p}.mlp.1"), time_dim, output, true),
            block1: CausalBlock::new(w, &format!("{p}.block1"), input, output),
            block2: CausalBlock::new(w, &format!("{p}.block2"), output, output),
            res_conv: Conv1d::new(w, &format!("{p}.res_conv"), input, output, 1, 1, 1, (0, 0)),
        }
    }
    fn forward(&self, x: &Tensor, mask: &Tensor, t: &Tensor) -> R<Tensor> {
        let h = self.block1.forward(x, mask)?.f_add(&self.mlp.forward(&t.f_mish()?)?.f_unsqueeze(-1)?)?;
        self.block2.forward(&h, mask)?.f_add(&self.res_conv.forward(&x.f_mul(mask)?)?)
    }
}

/// diffusers' `BasicTransformerBlock` as Matcha configures it: pre-norm self-attention (no q/k/v
/// bias) and a GELU feed-forward (×4).
struct TransformerBlock {
    norm1: LayerNorm,
    to_q: Linear,
    to_k: Linear,
    to_v: Linear,
    to_out: Linear,
    norm3: LayerNorm,
    ff_in: Linear,
    ff_out: Linear,
    heads: i64,
}

impl TransformerBlock {
    fn new(w: &Weights, p: &str, dim: i64, heads: i64, head_dim: i64) -> Self {
        let inner = heads * head_dim;
        TransformerBlock {
            norm1: LayerNorm::new(w, &format!("{p}.norm1"), dim, 1e-5),
            to_q: Linear::new(w, &format!("{p}.attn1.to_q"), dim, inner, false),
            to_k: Linear::new(w, &format!("{p}.attn1.to_k"), dim, inner, false),
            to_v: Linear::new(w, &format!("{p}.attn1.to_v"), dim, inner, false),
            to_out: Linear::new(w, &format!("{p}.attn1.to_out.0"), inner, dim, true),
            norm3: LayerNorm::new(w, &format!("{p}.norm3"), dim, 1e-5),
            ff_in: Linear::new(w, &format!("{p}.ff.net.0.proj"), dim, dim * 4, true),
            ff_out: Linear::new(w, &format!("{p}.ff.net.2"), dim * 4, dim, true),
            heads,
        }
    }
    /// `x`: `[B, T, C]`; `bias`: `[B, 1, T, T]` additive attention bias (0 or −1e10).
    fn forward(&self, x: &Tensor, bias: &Tensor) -> R<Tensor> {
        let (b, t, _) = x.size3()?;
        let n = self.norm1.forward(x)?;
        let split = |y: Tensor| y.f_view([b, t, self.heads, -1])?.f_transpose(1, 2);
        let q = split(self.to_q.forward(&n)?)?;
        let k = split(self.to_k.forward(&n)?)?;
        let v = split(self.to_v.forward(&n)?)?;
        let bias = bias.f_to_kind(q.kind())?;
        let a = Tensor::f_scaled_dot_product_attention(&q, &k, &v, Some(&bias), 0.0, false, None, false)?;
        let a = a.f_transpose(1, 2)?.f_reshape([b, t, -1])?;
        let x = x.f_add(&self.to_out.forward(&a)?)?;
        x.f_add(&self.ff_out.forward(&self.ff_in.forward(&self.norm3.forward(&x)?)?.f_gelu("none")?)?)
    }
}

struct Level {
    resnet: ResnetBlock,
    transformers: Vec<TransformerBlock>,
    conv: Option<Conv1d>,
}

impl Level {
    fn forward(&self, x: &Tensor, mask: &Tensor, bias: &Tensor, t: &Tensor) -> R<Tensor> {
        let mut h = self.resnet.forward(x, mask, t)?.f_transpose(1, 2)?;
        for block in &self.transformers {
            h = block.forward(&h, bias)?;
        }
        h.f_transpose(1, 2)
    }

    /// The level's resampling convolution (length-keeping), or `h` itself.
    fn resample(&self, h: &Tensor, mask: &Tensor) -> R<Tensor> {
        match &self.conv {
            Some(c) => c.forward(&h.f_mul(mask)?),
            None => Ok(h.shallow_clone()),
        }
    }
}

pub struct Estimator {
    time_1: Linear,
    time_2: Linear,
    down: Level,
    mid: Vec<Level>,
    up: Level,
    final_block: CausalBlock,
    final_proj: Conv1d,
}

/// Estimator dimensions (`channels` is CosyVoice2's single U-Net level).
#[derive(Debug, Clone, Copy)]
pub struct EstimatorDims {
    pub channels: i64,
    pub blocks: usize,
    pub mid_blocks: usize,
    pub heads: i64,
    pub head_dim: i64,
}

impl Estimator {
    pub fn new(w: &Weights, p: &str, d: EstimatorDims) -> Estimator {
        let c = d.channels;
        let time_dim = 4 * c;
        let level = |prefix: String, input: i64, conv: bool| Level {
            resnet: ResnetBlock::new(w, &format!("{prefix}.0"), input, c, time_dim),
            transformers: (0..d.blocks)
                .map(|i| TransformerBlock::new(w, &format!("{prefix}.1.{i}"), c, d.heads, d.head_dim))
                .collect(),
            conv: conv.then(|| Conv1d::causal(w, &format!("{prefix}.2"), c, c, 3)),
        };
        Estimator {
            time_1: Linear::new(w, &format!("{p}.time_mlp.linear_1"), IN, time_dim, true),
            time_2: Linear::new(w, &format!("{p}.time_mlp.linear_2"), time_dim, time_dim, true),
            down: level(format!("{p}.down_blocks.0"), IN, true),
            mid: (0..d.mid_blocks).map(|i| level(format!("{p}.mid_blocks.{i}"), c, false)).collect(),
            up: level(format!("{p}.up_blocks.0"), 2 * c, true),
            final_block: CausalBlock::new(w, &format!("{p}.final_block"), c, c),
            final_proj: Conv1d::new(w, &format!("{p}.final_proj"), c, MEL, 1, 1, 1, (0, 0)),
        }
    }

    /// Matcha's `SinusoidalPosEmb(320)` of `t` (scale 1000): `[B]` → `[B, 320]`.
    fn time_embedding(t: &Tensor) -> R<Tensor> {
        let half = IN / 2;
        let step = 10000f64.ln() / (half - 1) as f64;
        let freqs = Tensor::f_arange(half, (Kind::Float, t.device()))?.f_mul_scalar(-step)?.f_exp()?;
        let emb = t.f_unsqueeze(1)?.f_mul_scalar(1000.0)?.f_mul(&freqs.f_unsqueeze(0)?)?;
        Tensor::f_cat(&[emb.f_sin()?, emb.f_cos()?], -1)
    }

    /// `x`, `mu`, `cond`: `[B, 80, T]`; `mask`: `[B, 1, T]`; `t`: `[B]`; `spks`: `[B, 80]` → `[B, 80, T]`.
    pub fn forward(&self, x: &Tensor, mask: &Tensor, mu: &Tensor, t: &Tensor, spks: &Tensor, cond: &Tensor) -> R<Tensor> {
        let t = Self::time_embedding(t)?.f_to_kind(t.kind())?;
        let t = self.time_2.forward(&self.time_1.forward(&t)?.f_silu()?)?;
        let (_, _, len) = x.size3()?;
        let spks = spks.f_unsqueeze(-1)?.f_expand([-1, -1, len], false)?;
        let h = Tensor::f_cat(&[x.shallow_clone(), mu.shallow_clone(), spks, cond.shallow_clone()], 1)?;
        // Key-padding bias, the same for every query row and head: (1 − mask) · −1e10.
        let bias = mask.f_unsqueeze(1)?.f_mul_scalar(-1.0)?.f_add_scalar(1.0)?.f_mul_scalar(-1.0e10)?.f_expand([-1, -1, len, -1], false)?;

        let skip = self.down.forward(&h, mask, &bias, &t)?;
        let mut h = self.down.resample(&skip, mask)?;
        for level in &self.mid {
            h = level.forward(&h, mask, &bias, &t)?;
        }
        let (_, _, skip_len) = skip.size3()?;
        let h = Tensor::f_cat(&[h.f_narrow(2, 0, skip_len)?, skip], 1)?;
        let h = self.up.forward(&h, mask, &bias, &t)?;
        let h = self.up.resample(&h, mask)?;
        let h = self.final_block.forward(&h, mask)?;
        self.final_proj.forward(&h.f_mul(mask)?)?.f_mul(mask)
    }
}
