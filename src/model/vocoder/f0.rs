//! The F0 predictor: CosyVoice2's `ConvRNNF0Predictor` (five centred k=3 convolutions, fp32) and
//! CosyVoice3's `CausalConvRNNF0Predictor` (a k=4 convolution looking 3 frames ahead, then four
//! causal k=3 ones, in float64 as upstream runs it — autocast never casts float64), each followed
//! by ELU, then a linear classifier and `abs`: mel `[B, 80, T]` → F0 `[B, T]` in Hz, fp32.

use tch::{Kind, Tensor};

use super::Layout;
use crate::model::layers::{Conv1d, Linear, R};
use crate::model::weights::Weights;

pub(super) struct F0Predictor {
    convs: Vec<Conv1d>,
    classifier: Linear,
    /// Float64 (CosyVoice3): weights and computation.
    double: bool,
}

impl F0Predictor {
    pub(super) fn new(w: &Weights, channels: i64, layout: Layout) -> R<F0Predictor> {
        let name = |i: usize| format!("hift.f0_predictor.condnet.{}", 2 * i);
        let input = |i: usize| if i == 0 { 80 } else { channels };
        let mut convs: Vec<Conv1d> = (0..5)
            .map(|i| match layout {
                Layout::Centred => Conv1d::same(w, &name(i), input(i), channels, 3, 1),
                Layout::Causal { .. } if i == 0 => Conv1d::new(w, &name(i), 80, channels, 4, 1, 1, (0, 3)),
                Layout::Causal { .. } => Conv1d::new(w, &name(i), channels, channels, 3, 1, 1, (2, 0)),
            })
            .collect();
        let mut classifier = Linear::new(w, "hift.f0_predictor.classifier", channels, 1, true);
        let double = matches!(layout, Layout::Causal { .. });
        if double {
            for conv in &mut convs {
                conv.cast(Kind::Double)?;
            }
            classifier.cast(Kind::Double)?;
        }
        Ok(F0Predictor { convs, classifier, double })
    }

    /// `mel` `[B, 80, T]`, `mel_mask` `[B, 1, T]` → `[B, T]` fp32, zero past each length.
    pub(super) fn forward(&self, mel: &Tensor, mel_mask: &Tensor) -> R<Tensor> {
        let mel = if self.double { mel.f_to_kind(Kind::Double)? } else { mel.shallow_clone() };
        let mut h = mel.f_mul(mel_mask)?;
        for conv in &self.convs {
            h = conv.forward(&h)?.f_mul(mel_mask)?.f_elu()?;
        }
        let f0 = self.classifier.forward(&h.f_transpose(1, 2)?)?.f_squeeze_dim(-1)?.f_abs()?.f_to_kind(Kind::Float)?;
        f0.f_mul(&mel_mask.f_squeeze_dim(1)?)
    }
}
