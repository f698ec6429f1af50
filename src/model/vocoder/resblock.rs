//! HiFi-GAN's `ResBlock` with Snake activations (cosyvoice/hifigan/generator.py `ResBlock`,
//! `Snake` with a linear-scale α): three dilated convolutions, each behind a Snake and followed by
//! another Snake and an undilated convolution, each pair added back to its input. Centred
//! (`causal=False`, CosyVoice2) or causal (padded on the left, CosyVoice3).

use tch::Tensor;

use super::DILATIONS;
use crate::model::layers::{Conv1d, R};
use crate::model::weights::Weights;

/// `Snake`: x + 1/(α + 1e-9) · sin²(αx), α per channel.
struct Snake {
    alpha: Tensor,
}

impl Snake {
    fn new(w: &Weights, name: &str, ch: i64) -> Snake {
        Snake { alpha: w.get(name, &[ch]).view([1, ch, 1]) }
    }
    fn forward(&self, x: &Tensor) -> R<Tensor> {
        let alpha = self.alpha.f_to_kind(x.kind())?;
        let sin2 = x.f_mul(&alpha)?.f_sin()?.f_pow_tensor_scalar(2)?;
        x.f_add(&alpha.f_add_scalar(1e-9)?.f_reciprocal()?.f_mul(&sin2)?)
    }
}

pub(super) struct ResBlock {
    convs1: Vec<Conv1d>,
    convs2: Vec<Conv1d>,
    acts1: Vec<Snake>,
    acts2: Vec<Snake>,
}

/// A stride-1 convolution of `ch` channels: centred, or causal (`dilation · (kernel − 1)` zeros
/// on the left, as `CausalConv1d(causal_type='left')`).
pub(super) fn conv(w: &Weights, name: &str, ch: i64, kernel: i64, dilation: i64, causal: bool) -> Conv1d {
    if causal {
        Conv1d::new(w, name, ch, ch, kernel, 1, dilation, (dilation * (kernel - 1), 0))
    } else {
        Conv1d::same(w, name, ch, ch, kernel, dilation)
    }
}

impl ResBlock {
    pub(super) fn new(w: &Weights, p: &str, ch: i64, kernel: i64, causal: bool) -> ResBlock {
        let n = DILATIONS.len();
        ResBlock {
            convs1: DILATIONS.iter().enumerate().map(|(i, &d)| conv(w, &format!("{p}.convs1.{i}"), ch, kernel, d, causal)).collect(),
            convs2: (0..n).map(|i| conv(w, &format!("{p}.convs2.{i}"), ch, kernel, 1, causal)).collect(),
            acts1: (0..n).map(|i| Snake::new(w, &format!("{p}.activations1.{i}.alpha"), ch)).collect(),
            acts2: (0..n).map(|i| Snake::new(w, &format!("{p}.activations2.{i}.alpha"), ch)).collect(),
        }
    }

    /// `x` `[B, ch, n]`; `mask` `[B, 1, n]` zeroes each item's padding after every convolution.
    pub(super) fn forward(&self, x: &Tensor, mask: &Tensor) -> R<Tensor> {
        let mut x = x.shallow_clone();
        for i in 0..self.convs1.len() {
            let xt = self.convs1[i].forward(&self.acts1[i].forward(&x)?)?.f_mul(mask)?;
            let xt = self.convs2[i].forward(&self.acts2[i].forward(&xt)?)?.f_mul(mask)?;
            x = xt.f_add(&x)?;
        }
        Ok(x)
    }
}
