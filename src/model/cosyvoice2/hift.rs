//! CosyVoice2's vocoder, `HiFTGenerator` (HiFi-GAN + neural source filter + iSTFT), batched:
//! mel `[B, 80, T]` at 50 Hz → waveform `[B, 480·T]` at 24 kHz — the shared
//! [`HiftGenerator`](crate::model::vocoder::HiftGenerator) in its centred layout (every
//! convolution centred, transposed-convolution upsampling, the F0 predictor in fp32, the source's
//! phase upsampled linearly), with the source's random draws (`rand_ini`, Gaussian noise) made
//! per call as upstream does ([`SourceDraws`]; parity tests pass the reference's).
//!
//! The convolutional body between the source's STFT and the iSTFT runs through a compiled package
//! (`model::compiled`, stage `hift`: `tools/compile_token2wav.py`'s `HiftBody`, the same masked
//! computation) when the model directory has one for this machine and the batch fits it.

use tch::{Kind, Tensor};

use crate::model::compiled::CompiledStage;
use crate::model::layers::R;
use crate::model::vocoder::{HiftGenerator, Layout, HARMONICS};
use crate::model::weights::Weights;

pub use crate::model::vocoder::{HiftOutput, SAMPLES_PER_FRAME};

/// The source's random draws: `rand_ini` `[B, 9]` (initial phases) and `noise` `[B, samples, 9]`.
pub struct SourceDraws {
    pub rand_ini: Tensor,
    pub noise: Tensor,
}

impl SourceDraws {
    /// Fresh draws for `b` items of up to `samples` samples on `device`.
    pub fn random(b: i64, samples: i64, device: tch::Device) -> R<SourceDraws> {
        Ok(SourceDraws {
            rand_ini: Tensor::f_rand([b, HARMONICS], (Kind::Float, device))?,
            noise: Tensor::f_randn([b, samples, HARMONICS], (Kind::Float, device))?,
        })
    }
}

pub struct Hift {
    generator: HiftGenerator,
}

impl Hift {
    pub fn new(w: &Weights, channels: i64, f0_channels: i64) -> R<Hift> {
        Ok(Hift { generator: HiftGenerator::new(w, channels, f0_channels, Layout::Centred)? })
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
    pub fn forward(&self, mel: &Tensor, frames: &[i64], draws: &SourceDraws) -> R<HiftOutput> {
        self.generator.forward(mel, frames, Some(&draws.rand_ini), &draws.noise)
    }

    /// `ConvRNNF0Predictor`: mel → F0 `[B, T]` in Hz (zero past each length).
    pub fn f0(&self, mel: &Tensor, frames: &[i64]) -> R<Tensor> {
        self.generator.f0(mel, frames)
    }

    /// `SineGen2` + `SourceModuleHnNSF2`: F0 `[B, T]` (Hz) → harmonic source `[B, samples]`.
    pub fn source(&self, f0: &Tensor, draws: &SourceDraws, samples: i64) -> R<Tensor> {
        self.generator.source(f0, samples, Some(&draws.rand_ini), &draws.noise)
    }

    /// The HiFi-GAN/iSTFT decoder: mel `[B, 80, T]` and harmonic source `[B, 480·T]` → waveform
    /// `[B, 480·T]`, zero past each item's length.
    pub fn decode(&self, mel: &Tensor, source: &Tensor, frames: &[i64]) -> R<Tensor> {
        self.generator.decode(mel, source, frames)
    }
}
