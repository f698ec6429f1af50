//! CosyVoice3's vocoder, `CausalHiFTGenerator` (cosyvoice/hifigan/generator.py; `inference` with
//! `finalize=True`), batched: mel `[B, 80, T]` → waveform `[B, 480·T]` — the shared
//! [`HiftGenerator`] in its causal layout (`conv_pre` looking `conv_pre_look_right` frames ahead,
//! the F0 predictor's first convolution 3, every other convolution causal; nearest-repetition
//! upsampling; the F0 predictor in float64; the source's phase upsampled by repetition), its
//! source's noise the fixed buffer upstream draws once (`SineGen2.sine_waves`, uniform, shared by
//! every item: each reads the prefix of its own length).
//!
//! Batching: a padded item equals the item alone once the mel is zero past its end (the look-ahead
//! reads zeros, as alone: the generator masks it), the source's STFT reflects each item at its
//! own end and the iSTFT counts each item's own frames (`model::vocoder::stft`) — upstream's own
//! classes on a padded batch differ from alone in each padded item's last ≤ 63 samples there.
//!
//! The convolutional body between the source's STFT and the iSTFT runs through a compiled package
//! (`model::compiled`, stage `hift`: tools/compile/families/cosyvoice3/hift.py, the shared body in
//! the causal layout) when the model directory has one for this machine at the vocoder's precision.

use tch::Tensor;

use crate::model::compiled::CompiledStage;
use crate::model::layers::R;
use crate::model::vocoder::{HiftGenerator, HiftOutput, Layout, HARMONICS, SAMPLES_PER_FRAME};
use crate::model::weights::Weights;

pub struct Hift {
    generator: HiftGenerator,
    /// `[1, noise_samples, 9]`, U[0, 1).
    sine_waves: Tensor,
}

impl Hift {
    pub fn new(w: &Weights, channels: i64, f0_channels: i64, conv_pre_look_right: i64, noise_samples: i64) -> R<Hift> {
        Ok(Hift {
            generator: HiftGenerator::new(w, channels, f0_channels, Layout::Causal { conv_pre_look_right })?,
            sine_waves: w.get("hift.m_source.l_sin_gen.sine_waves", &[1, noise_samples, HARMONICS]),
        })
    }

    /// The longest mel (frames) the fixed noise covers.
    pub fn max_frames(&self) -> i64 {
        self.sine_waves.size()[1] / SAMPLES_PER_FRAME
    }

    /// Runs the body through `compiled` (or the eager port again with `None`).
    pub fn set_compiled(&mut self, compiled: Option<CompiledStage>) {
        self.generator.set_compiled(compiled);
    }

    /// The compiled body, if any.
    pub fn compiled(&self) -> Option<&CompiledStage> {
        self.generator.compiled()
    }

    /// Bodies run (compiled, eager) since the last call.
    pub fn take_call_counts(&self) -> (u64, u64) {
        self.generator.take_call_counts()
    }

    /// `mel`: `[B, 80, T]` (zero past each length), `frames`: mel frames per item.
    pub fn forward(&self, mel: &Tensor, frames: &[i64]) -> R<HiftOutput> {
        self.generator.forward(mel, frames, None, &self.sine_waves)
    }

    /// `CausalConvRNNF0Predictor` (float64): mel → F0 `[B, T]` in Hz, fp32 (zero past each length).
    pub fn f0(&self, mel: &Tensor, frames: &[i64]) -> R<Tensor> {
        self.generator.f0(mel, frames)
    }

    /// `SourceModuleHnNSF(causal=True)`: F0 `[B, T]` (Hz) → harmonic source `[B, samples]`.
    pub fn source(&self, f0: &Tensor, samples: i64) -> R<Tensor> {
        self.generator.source(f0, samples, None, &self.sine_waves)
    }

    /// `decode`: mel `[B, 80, T]` and harmonic source `[B, 480·T]` → waveform `[B, 480·T]`, zero
    /// past each item's length.
    pub fn decode(&self, mel: &Tensor, source: &Tensor, frames: &[i64]) -> R<Tensor> {
        self.generator.decode(mel, source, frames)
    }
}
