//! [`HiftGenerator`]: the vocoder's computation, the same for both families' layouts
//! (`HiFTGenerator.decode` / `CausalHiFTGenerator.decode` and their `inference` with
//! `finalize=True`): conv_pre → three levels of (leaky ReLU 0.1, upsampling, the source's STFT
//! downsampled and through its ResBlock added, three ResBlocks averaged; a reflection pad of one
//! frame in front before the last level's fusion) → leaky ReLU 0.01 → conv_post → iSTFT → clamp
//! ±0.99. The convolutional body between the source's STFT and the iSTFT runs through a compiled
//! package (`model::compiled`, stage `hift`) when one is set and the batch fits it.

use tch::{Kind, Tensor};

use super::f0::F0Predictor;
use super::resblock::ResBlock;
use super::source::{harmonic_source, PhaseUpsampling};
use super::stft::{hann_window, istft, source_stft};
use super::{Layout, HARMONICS, N_FFT, RES_KERNELS, SAMPLES_PER_FRAME, SOURCE_KERNELS, UPSAMPLE, UP_KERNELS};
use crate::model::compiled::{CompiledStage, KernelCounts};
use crate::model::layers::{length_mask, upsample_by_rows, Conv1d, ConvTranspose1d, Linear, R};
use crate::model::weights::Weights;

/// An upsampling layer: a transposed convolution (CosyVoice2), or `CausalConv1dUpsample`: nearest
/// repetition, then a convolution with `kernel − 1` zeros on the left (CosyVoice3).
enum Upsampler {
    Transposed(ConvTranspose1d),
    Nearest { factor: i64, conv: Conv1d },
}

impl Upsampler {
    fn forward(&self, x: &Tensor) -> R<Tensor> {
        match self {
            Upsampler::Transposed(conv) => conv.forward(x),
            Upsampler::Nearest { factor, conv } => {
                let (_, c, t) = x.size3()?;
                let up = upsample_by_rows(x, c * t * factor, |rows| rows.f_upsample_nearest1d([t * factor], *factor as f64))?;
                conv.forward(&up)
            }
        }
    }
}

pub struct HiftGenerator {
    f0: F0Predictor,
    source_linear: Linear,
    phase: PhaseUpsampling,
    conv_pre: Conv1d,
    ups: Vec<Upsampler>,
    source_downs: Vec<Conv1d>,
    source_resblocks: Vec<ResBlock>,
    resblocks: Vec<ResBlock>,
    conv_post: Conv1d,
    window: Tensor,
    /// The body compiled, when the model directory has a package for this machine.
    compiled: Option<CompiledStage>,
    /// Bodies run (compiled, eager) since the last `take_call_counts`.
    calls_run: KernelCounts,
}

/// What the vocoder computed, per stage (for parity tests).
pub struct HiftOutput {
    /// `[B, samples]`, zero past each item's length.
    pub wav: Tensor,
    /// `[B, T]` predicted F0 in Hz.
    pub f0: Tensor,
    /// `[B, samples]` harmonic source.
    pub source: Tensor,
}

impl HiftGenerator {
    /// The generator's weights (`hift.…`, weight norm folded) for `layout`: base `channels`,
    /// the F0 predictor's `f0_channels`.
    pub fn new(w: &Weights, channels: i64, f0_channels: i64, layout: Layout) -> R<HiftGenerator> {
        let causal = matches!(layout, Layout::Causal { .. });
        let ch = |i: usize| channels >> (i + 1);
        let ups = (0..3)
            .map(|i| {
                let (u, k, p) = (UPSAMPLE[i], UP_KERNELS[i], format!("hift.ups.{i}"));
                if causal {
                    Upsampler::Nearest { factor: u, conv: Conv1d::new(w, &p, channels >> i, ch(i), k, 1, 1, (k - 1, 0)) }
                } else {
                    Upsampler::Transposed(ConvTranspose1d::new(w, &p, channels >> i, ch(i), k, u, (k - u) / 2))
                }
            })
            .collect();
        // Source downsampling to each level's rate: cumulative [15, 3, 1].
        let down_rates = [15i64, 3, 1];
        let source_downs = (0..3)
            .map(|i| {
                let (u, p) = (down_rates[i], format!("hift.source_downs.{i}"));
                let pad = if causal { (u - 1, 0) } else { (u / 2, u / 2) };
                if u == 1 {
                    Conv1d::new(w, &p, N_FFT + 2, ch(i), 1, 1, 1, (0, 0))
                } else {
                    Conv1d::new(w, &p, N_FFT + 2, ch(i), 2 * u, u, 1, pad)
                }
            })
            .collect();
        let source_resblocks =
            (0..3).map(|i| ResBlock::new(w, &format!("hift.source_resblocks.{i}"), ch(i), SOURCE_KERNELS[i], causal)).collect();
        let resblocks = (0..3)
            .flat_map(|i| (0..3).map(move |j| (i, j)))
            .map(|(i, j)| ResBlock::new(w, &format!("hift.resblocks.{}", 3 * i + j), ch(i), RES_KERNELS[j], causal))
            .collect();
        let (conv_pre, phase) = match layout {
            Layout::Centred => (Conv1d::same(w, "hift.conv_pre", 80, channels, 7, 1), PhaseUpsampling::Linear),
            Layout::Causal { conv_pre_look_right: look } => {
                (Conv1d::new(w, "hift.conv_pre", 80, channels, look + 1, 1, 1, (0, look)), PhaseUpsampling::Nearest)
            }
        };
        let conv_post = if causal {
            Conv1d::new(w, "hift.conv_post", ch(2), N_FFT + 2, 7, 1, 1, (6, 0))
        } else {
            Conv1d::same(w, "hift.conv_post", ch(2), N_FFT + 2, 7, 1)
        };
        let device = w.get("hift.conv_pre.bias", &[channels]).device();
        Ok(HiftGenerator {
            f0: F0Predictor::new(w, f0_channels, layout)?,
            source_linear: Linear::new(w, "hift.m_source.l_linear", HARMONICS, 1, true),
            phase,
            conv_pre,
            ups,
            source_downs,
            source_resblocks,
            resblocks,
            conv_post,
            window: hann_window(device),
            compiled: None,
            calls_run: KernelCounts::default(),
        })
    }

    /// Runs the body through `compiled` (or the eager port again with `None`).
    pub fn set_compiled(&mut self, compiled: Option<CompiledStage>) {
        self.compiled = compiled;
    }

    /// The compiled body, if any.
    pub fn compiled(&self) -> Option<&CompiledStage> {
        self.compiled.as_ref()
    }

    /// Bodies run (compiled, eager) since the last call.
    pub fn take_call_counts(&self) -> (u64, u64) {
        self.calls_run.take()
    }

    /// `mel`: `[B, 80, T]` (zero past each length), `frames`: mel frames per item; the source's
    /// `rand_ini` and `noise` as [`HiftGenerator::source`] takes them.
    pub fn forward(&self, mel: &Tensor, frames: &[i64], rand_ini: Option<&Tensor>, noise: &Tensor) -> R<HiftOutput> {
        let f0 = self.f0(mel, frames)?;
        let (_, _, t) = mel.size3()?;
        let samples = t * SAMPLES_PER_FRAME;
        let source = self.source(&f0, samples, rand_ini, noise)?.f_mul(&self.mask(frames, samples, SAMPLES_PER_FRAME, 0)?.f_squeeze_dim(1)?)?;
        let wav = self.decode(mel, &source, frames)?;
        Ok(HiftOutput { wav, f0, source })
    }

    /// `[B, 1, t_max · scale + extra]` mask of each item's `frames · scale + extra` positions.
    fn mask(&self, frames: &[i64], t_len: i64, scale: i64, extra: i64) -> R<Tensor> {
        let lens: Vec<i64> = frames.iter().map(|f| f * scale + extra).collect();
        length_mask(&lens, t_len, self.window.device())?.f_unsqueeze(1)
    }

    /// The F0 predictor: mel → F0 `[B, T]` in Hz (zero past each length).
    pub fn f0(&self, mel: &Tensor, frames: &[i64]) -> R<Tensor> {
        let (_, _, t) = mel.size3()?;
        self.f0.forward(mel, &self.mask(frames, t, 1, 0)?)
    }

    /// The harmonic source of F0 `[B, T]` (Hz) over `samples` samples (`source::harmonic_source`:
    /// `rand_ini` `[B, 9]` or none, `noise` `[B or 1, ≥ samples, 9]`).
    pub fn source(&self, f0: &Tensor, samples: i64, rand_ini: Option<&Tensor>, noise: &Tensor) -> R<Tensor> {
        harmonic_source(&self.source_linear, f0, samples, self.phase, rand_ini, noise)
    }

    /// The HiFi-GAN/iSTFT decoder: mel `[B, 80, T]` and harmonic source `[B, 480·T]` → waveform
    /// `[B, 480·T]`, zero past each item's length.
    pub fn decode(&self, mel: &Tensor, source: &Tensor, frames: &[i64]) -> R<Tensor> {
        let (b, _, t) = mel.size3()?;
        let s_stft = source_stft(&source.f_to_kind(Kind::Float)?, frames, &self.window)?;
        let package = self.compiled.as_ref().filter(|c| c.fits(b, t));
        self.calls_run.count(package.is_some());
        let x = match package {
            Some(c) => {
                let lengths = Tensor::f_from_slice(frames)?.f_to_device(mel.device())?;
                let mel = mel.f_to_kind(Kind::Float)?;
                c.package.run(&[&mel, &s_stft, &lengths])?.into_iter().next().ok_or_else(|| {
                    tch::TchError::Torch("the compiled vocoder returned nothing".into())
                })?
            }
            None => self.body(mel, &s_stft, frames)?,
        };
        let samples = t * SAMPLES_PER_FRAME;
        istft(&x, frames, &self.window)?.f_clamp(-0.99, 0.99)?.f_mul(&self.mask(frames, samples, SAMPLES_PER_FRAME, 0)?.f_squeeze_dim(1)?)
    }

    /// The convolutional body: mel and the source's STFT → conv_post's 18 channels `[B, 18, 120·T + 1]`, fp32.
    fn body(&self, mel: &Tensor, s_stft: &Tensor, frames: &[i64]) -> R<Tensor> {
        let (_, _, t) = mel.size3()?;
        let mel_mask = self.mask(frames, t, 1, 0)?;
        let mut x = self.conv_pre.forward(&mel.f_mul(&mel_mask)?)?.f_mul(&mel_mask)?;
        let mut scale = 1;
        for (i, up) in self.ups.iter().enumerate() {
            x = up.forward(&x.f_maximum(&x.f_mul_scalar(0.1)?)?)?;
            scale *= UPSAMPLE[i];
            let extra = i64::from(i == 2);
            if i == 2 {
                x = x.f_reflection_pad1d([1, 0])?;
            }
            let mask = self.mask(frames, t * scale + extra, scale, extra)?;
            x = x.f_mul(&mask)?;
            let si = self.source_resblocks[i].forward(&self.source_downs[i].forward(s_stft)?.f_mul(&mask)?, &mask)?;
            x = x.f_add(&si)?;
            let mut xs = self.resblocks[3 * i].forward(&x, &mask)?;
            for j in 1..3 {
                xs = xs.f_add(&self.resblocks[3 * i + j].forward(&x, &mask)?)?;
            }
            x = xs.f_div_scalar(3.0)?;
        }
        self.conv_post.forward(&x.f_leaky_relu()?)?.f_to_kind(Kind::Float)
    }
}
