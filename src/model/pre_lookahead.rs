//! `PreLookaheadLayer` (cosyvoice/transformer/upsample_encoder.py), both families' (offline,
//! `context` empty): each token sees the next `lookahead` ones and the two before it.
//!
//! `[B, N, C]` → conv1 (`C → channels`, kernel `lookahead + 1`, `lookahead` zero frames on the
//! right) → leaky ReLU (0.01) → conv2 (`channels → C`, kernel 3, two zero frames on the left) →
//! `+` the input. CosyVoice2 runs it inside its conformer encoder (512 wide); CosyVoice3 on the
//! token embedding itself (80 wide, 1024 channels), with nothing after it but the ×2 repeat.
//!
//! Batching: the look-ahead reads the frames past an item's end, which alone are zero padding, so
//! a padded batch must hold zeros there (both flows multiply the embedding by the length mask).
//!
//! Neighbours: `cosyvoice2::encoder`, `cosyvoice3::flow`; `layers` (the convolutions).

use tch::{Kind, Tensor};

use super::layers::{Conv1d, R};
use super::weights::Weights;

pub struct PreLookahead {
    conv1: Conv1d,
    conv2: Conv1d,
}

impl PreLookahead {
    /// The layer's weights under `prefix` (`….pre_lookahead_layer`): `conv1` `[channels, width,
    /// lookahead + 1]`, `conv2` `[width, channels, 3]`.
    pub fn new(w: &Weights, prefix: &str, width: i64, channels: i64, lookahead: i64) -> PreLookahead {
        PreLookahead {
            conv1: Conv1d::new(w, &format!("{prefix}.conv1"), width, channels, lookahead + 1, 1, 1, (0, lookahead)),
            conv2: Conv1d::causal(w, &format!("{prefix}.conv2"), channels, width, 3),
        }
    }

    /// `x`: `[B, N, width]`, zero past each item's end → `[B, N, width]`.
    pub fn forward(&self, x: &Tensor) -> R<Tensor> {
        let c = x.f_transpose(1, 2)?;
        let c = self.conv1.forward(&c)?.f_leaky_relu()?;
        let c = self.conv2.forward(&c)?.f_transpose(1, 2)?;
        c.f_add(x)
    }

    /// Its convolutions' parameters in `kind`, the autocast dtype it always runs under
    /// (`Linear::cast_for_autocast`).
    pub fn cast_for_autocast(&mut self, kind: Kind) -> R<()> {
        self.conv1.cast_for_autocast(kind)?;
        self.conv2.cast_for_autocast(kind)
    }
}
