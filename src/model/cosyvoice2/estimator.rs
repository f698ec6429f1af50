//! CosyVoice2's flow-matching estimator, `CausalConditionalDecoder` (non-streaming): a Matcha-style
//! 1-D U-Net that predicts the velocity `dφ/dt` of the mel at time `t`.
//!
//! Input `[B, 320, T]` = x ‖ mu ‖ speaker ‖ prompt condition (80 channels each); a sinusoidal time
//! embedding through an MLP conditions every ResNet block. With CosyVoice2's one channel level the
//! "down" and "up" blocks keep the length (their resampling convolutions are causal stride-1 convs).
//! Every block is causal in time, and attention masks padded keys, so padded items of a batch give
//! exactly their unbatched values on their valid frames. Between levels the padded frames are
//! masked before every use, so a level's transformers may also run on the valid frames alone
//! ([`FlowAttention::Packed`]).

use tch::{Kind, Tensor};

use crate::model::layers::{Conv1d, LayerNorm, Linear, R};
use crate::model::weights::Weights;

/// How the transformer blocks of each level attend (`[cosyvoice2] flow_attention` in model.toml).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FlowAttention {
    /// SDPA over the padded batch, padded keys out by a bias (as the reference does).
    #[default]
    Padded,
    /// Experimental (not yet measured on a GPU): each level's transformer blocks run on the
    /// batch's valid frames only, packed, with FlashAttention's variable-length kernel on CUDA in
    /// bf16/fp16 — no bias in memory and no work on padding. Elsewhere packed frames attend through
    /// SDPA with a block-diagonal mask (`[ΣT, ΣT]`: for tests and small batches), and at fp32 on
    /// CUDA the padded path runs.
    Packed,
    /// The padded batch as B sequences of T frames laid end to end, FlashAttention's
    /// variable-length kernel reading only each item's valid keys (`seqused_k`) — no bias in
    /// memory, no gather, no device-to-host read. CUDA in bf16/fp16; elsewhere the padded path
    /// runs. Measured on an H200 (2026-12-04) it is slower than `Padded` in this eager port (444
    /// against 465 audio-s/s: the layout copies around the kernel cost more than the bias saves).
    Flash,
}

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
    /// `attn1.to_q`, `to_k` and `to_v` as one projection (outputs side by side).
    to_qkv: Linear,
    inner: i64,
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
            to_qkv: Linear::fused(w, &[&format!("{p}.attn1.to_q"), &format!("{p}.attn1.to_k"), &format!("{p}.attn1.to_v")], dim, inner, false),
            inner,
            to_out: Linear::new(w, &format!("{p}.attn1.to_out.0"), inner, dim, true),
            norm3: LayerNorm::new(w, &format!("{p}.norm3"), dim, 1e-5),
            ff_in: Linear::new(w, &format!("{p}.ff.net.0.proj"), dim, dim * 4, true),
            ff_out: Linear::new(w, &format!("{p}.ff.net.2"), dim * 4, dim, true),
            heads,
        }
    }
    /// `x`: `[B, T, C]` padded (`Frames::Padded`) or `[ΣT, C]` packed.
    fn forward(&self, x: &Tensor, frames: &Frames) -> R<Tensor> {
        let n = self.norm1.forward(x)?;
        let qkv = self.to_qkv.forward(&n)?;
        let last = qkv.dim() as i64 - 1;
        let (q, k, v) = (qkv.f_narrow(last, 0, self.inner)?, qkv.f_narrow(last, self.inner, self.inner)?, qkv.f_narrow(last, 2 * self.inner, self.inner)?);
        let a = frames.attend(&q, &k, &v, self.heads)?;
        let x = x.f_add(&self.to_out.forward(&a)?)?;
        x.f_add(&self.ff_out.forward(&self.ff_in.forward(&self.norm3.forward(&x)?)?.f_gelu("none")?)?)
    }
}

/// The frames a level's transformer blocks run on, and how they attend ([`Estimator::frames`]).
pub enum Frames {
    /// `[B, T, C]`; `bias` `[B, 1, T, T]`: 0 for valid keys, −1e10 for padded ones.
    Padded { bias: Tensor },
    /// The valid frames of `[B, T, C]` packed to `[ΣT, C]`: flat positions `index` (b·T + t),
    /// item offsets `cu` (int32, B + 1), the longest item.
    Packed { index: Tensor, cu: Tensor, longest: i64, mask: Option<Tensor> },
    /// `[B, T, C]` read as B sequences of T frames end to end: item offsets `cu` (int32, B + 1,
    /// b·T) and each item's valid keys `used` (int32, B).
    PaddedFlash { cu: Tensor, used: Tensor },
}

impl Frames {
    fn new(mask: &Tensor, layout: FlowAttention, kind: Kind) -> R<Frames> {
        let (b, _, t) = mask.size3()?;
        let flash = mask.device().is_cuda() && matches!(kind, Kind::BFloat16 | Kind::Half);
        if layout == FlowAttention::Flash && flash {
            let used = mask.f_sum_dim_intlist([1, 2].as_slice(), false, Kind::Float)?.f_round()?.f_to_kind(Kind::Int)?;
            // An item with no valid frame attends to every key, as the bias makes the padded path do.
            let used = used.f_where_scalarother(&used.f_gt(0)?, t)?;
            let cu = Tensor::f_arange_start_step(0i64, (b + 1) * t, t, (Kind::Int, mask.device()))?;
            return Ok(Frames::PaddedFlash { cu, used });
        }
        if layout != FlowAttention::Packed || (mask.device().is_cuda() && !flash) {
            // Key-padding bias, the same for every query row and head: (1 − mask) · −1e10.
            let bias = mask.f_unsqueeze(1)?.f_mul_scalar(-1.0)?.f_add_scalar(1.0)?.f_mul_scalar(-1.0e10)?.f_expand([-1, -1, t, -1], false)?;
            return Ok(Frames::Padded { bias });
        }
        let lengths: Vec<i64> = Vec::<f32>::try_from(mask.f_sum_dim_intlist([1, 2].as_slice(), false, Kind::Float)?.f_to_device(tch::Device::Cpu)?)?
            .into_iter()
            .map(|l| l.round() as i64)
            .collect();
        let mut flat = Vec::new();
        let mut cu = vec![0i32];
        let mut owner = Vec::new();
        for (item, &len) in lengths.iter().enumerate() {
            flat.extend((0..len).map(|f| item as i64 * t + f));
            owner.extend(std::iter::repeat_n(item as i64, len as usize));
            cu.push(cu[cu.len() - 1] + len as i32);
        }
        let device = mask.device();
        let index = Tensor::f_from_slice(&flat)?.f_to_device(device)?;
        // Without FlashAttention: frames of one item see each other only.
        let mask = if flash {
            None
        } else {
            let owner = Tensor::f_from_slice(&owner)?.f_to_device(device)?;
            Some(owner.f_unsqueeze(1)?.f_eq_tensor(&owner.f_unsqueeze(0)?)?.f_view([1, 1, flat.len() as i64, flat.len() as i64])?)
        };
        Ok(Frames::Packed { index, cu: Tensor::f_from_slice(&cu)?.f_to_device(device)?, longest: lengths.iter().copied().max().unwrap_or(1), mask })
    }

    /// `[B, T, C]` → what the blocks run on.
    fn enter(&self, h: &Tensor) -> R<Tensor> {
        match self {
            Frames::Padded { .. } | Frames::PaddedFlash { .. } => Ok(h.shallow_clone()),
            Frames::Packed { index, .. } => {
                let (b, t, c) = h.size3()?;
                h.f_reshape([b * t, c])?.f_index_select(0, index)
            }
        }
    }

    /// What the blocks made → `[B, T, C]` (padded frames zero: every next use masks them).
    fn leave(&self, x: &Tensor, like: &Tensor) -> R<Tensor> {
        match self {
            Frames::Padded { .. } | Frames::PaddedFlash { .. } => Ok(x.shallow_clone()),
            Frames::Packed { index, .. } => {
                let (b, t, c) = like.size3()?;
                Tensor::f_zeros([b * t, c], (x.kind(), x.device()))?.f_index_copy(0, index, x)?.f_view([b, t, c])
            }
        }
    }

    /// Self-attention of projected `q`, `k`, `v` (`[B, T, H·d]` or `[ΣT, H·d]`) → the same shape.
    fn attend(&self, q: &Tensor, k: &Tensor, v: &Tensor, heads: i64) -> R<Tensor> {
        match self {
            Frames::Padded { bias } => {
                let (b, t, _) = q.size3()?;
                let split = |y: &Tensor| y.f_view([b, t, heads, -1])?.f_transpose(1, 2);
                let bias = bias.f_to_kind(q.kind())?;
                let a = Tensor::f_scaled_dot_product_attention(&split(q)?, &split(k)?, &split(v)?, Some(&bias), 0.0, false, None, false)?;
                a.f_transpose(1, 2)?.f_reshape([b, t, -1])
            }
            Frames::PaddedFlash { cu, used } => {
                let (b, t, _) = q.size3()?;
                let split = |y: &Tensor| y.f_reshape([b * t, heads, -1])?.f_contiguous();
                let a = crate::model::shim::flash_attention_varlen(&split(q)?, &split(k)?, &split(v)?, cu, cu, Some(used), t, t, false)?;
                a.f_reshape([b, t, -1])
            }
            Frames::Packed { cu, longest, mask: None, .. } => {
                let (n, _) = q.size2()?;
                let split = |y: &Tensor| y.f_view([n, heads, -1])?.f_contiguous();
                let a = crate::model::shim::flash_attention_varlen(&split(q)?, &split(k)?, &split(v)?, cu, cu, None, *longest, *longest, false)?;
                a.f_reshape([n, -1])
            }
            Frames::Packed { mask: Some(mask), .. } => {
                let (n, _) = q.size2()?;
                let split = |y: &Tensor| y.f_view([n, heads, -1])?.f_transpose(0, 1)?.f_unsqueeze(0);
                let a = Tensor::f_scaled_dot_product_attention(&split(q)?, &split(k)?, &split(v)?, Some(mask), 0.0, false, None, false)?;
                a.f_squeeze_dim(0)?.f_transpose(0, 1)?.f_reshape([n, -1])
            }
        }
    }
}

struct Level {
    resnet: ResnetBlock,
    transformers: Vec<TransformerBlock>,
    conv: Option<Conv1d>,
}

impl Level {
    fn forward(&self, x: &Tensor, mask: &Tensor, frames: &Frames, t: &Tensor) -> R<Tensor> {
        let h = self.resnet.forward(x, mask, t)?.f_transpose(1, 2)?;
        let mut y = frames.enter(&h)?;
        for block in &self.transformers {
            y = block.forward(&y, frames)?;
        }
        frames.leave(&y, &h)?.f_transpose(1, 2)
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
    attention: FlowAttention,
}

/// Estimator dimensions (`channels` is CosyVoice2's single U-Net level).
#[derive(Debug, Clone, Copy)]
pub struct EstimatorDims {
    pub channels: i64,
    pub blocks: usize,
    pub mid_blocks: usize,
    pub heads: i64,
    pub head_dim: i64,
    pub attention: FlowAttention,
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
            attention: d.attention,
        }
    }

    /// How the transformer blocks attend from now on (tests compare the layouts).
    pub fn set_attention(&mut self, attention: FlowAttention) {
        self.attention = attention;
    }

    /// Matcha's `SinusoidalPosEmb(320)` of `t` (scale 1000): `[B]` → `[B, 320]`.
    fn time_embedding(t: &Tensor) -> R<Tensor> {
        crate::model::layers::time_sinusoids(t, IN)
    }

    /// How calls with this `mask` attend (the same for every Euler step of a batch: the flow makes
    /// it once). `mu`'s kind is the projections' (autocast's, or the weights'): FlashAttention
    /// serves bf16/fp16 only.
    pub fn frames(&self, mask: &Tensor, mu: &Tensor) -> R<Frames> {
        Frames::new(mask, self.attention, mu.kind())
    }

    /// `x`, `mu`, `cond`: `[B, 80, T]`; `mask`: `[B, 1, T]`; `t`: `[B]`; `spks`: `[B, 80]` → `[B, 80, T]`.
    pub fn forward(&self, x: &Tensor, mask: &Tensor, mu: &Tensor, t: &Tensor, spks: &Tensor, cond: &Tensor) -> R<Tensor> {
        self.forward_with(x, mask, mu, t, spks, cond, &self.frames(mask, mu)?)
    }

    /// [`Estimator::forward`] with the `frames` [`Estimator::frames`] made for `mask`.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_with(&self, x: &Tensor, mask: &Tensor, mu: &Tensor, t: &Tensor, spks: &Tensor, cond: &Tensor, frames: &Frames) -> R<Tensor> {
        let t = Self::time_embedding(t)?.f_to_kind(t.kind())?;
        let t = self.time_2.forward(&self.time_1.forward(&t)?.f_silu()?)?;
        let (_, _, len) = x.size3()?;
        let spks = spks.f_unsqueeze(-1)?.f_expand([-1, -1, len], false)?;
        let h = Tensor::f_cat(&[x.shallow_clone(), mu.shallow_clone(), spks, cond.shallow_clone()], 1)?;
        let skip = self.down.forward(&h, mask, frames, &t)?;
        let mut h = self.down.resample(&skip, mask)?;
        for level in &self.mid {
            h = level.forward(&h, mask, frames, &t)?;
        }
        let (_, _, skip_len) = skip.size3()?;
        let h = Tensor::f_cat(&[h.f_narrow(2, 0, skip_len)?, skip], 1)?;
        let h = self.up.forward(&h, mask, frames, &t)?;
        let h = self.up.resample(&h, mask)?;
        let h = self.final_block.forward(&h, mask)?;
        self.final_proj.forward(&h.f_mul(mask)?)?.f_mul(mask)
    }
}
