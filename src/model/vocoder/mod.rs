//! The HiFT vocoder both families run — CosyVoice2's `HiFTGenerator` and CosyVoice3's
//! `CausalHiFTGenerator` (cosyvoice/hifigan/generator.py) — batched: mel `[B, 80, T]` at 50 Hz →
//! waveform `[B, 480·T]` at 24 kHz.
//!
//! F0 predictor (five convolutions + linear, [`f0`]) → harmonic source (`SineGen2` +
//! `SourceModuleHnNSF`: 8 harmonics, phase integrated at the frame rate, [`source`]) → its STFT
//! joins the upsampling path (×8, ×5, ×3 with Snake ResBlocks, [`resblock`]) → 18 channels of
//! log-magnitude and phase → iSTFT (n_fft 16, hop 4, [`stft`]). The two families differ only in
//! how their convolutions see time ([`Layout`]), the F0 predictor's dtype, how the source's phase
//! is upsampled and where its noise comes from; the computation is one ([`HiftGenerator`]).
//!
//! Batching (a padded batch computes what each item computes alone): the positions past an
//! item's length are zeroed after every convolution — the zero padding an unbatched run sees,
//! needed by CosyVoice2's centred convolutions and by CosyVoice3's look-ahead ones (`conv_pre`, the
//! F0 predictor's first), harmless for causal ones; the source's STFT reflect-pads each item at
//! its own end, and the iSTFT's overlap-add and envelope count only each item's own frames.
//!
//! Neighbours: `cosyvoice2::hift`, `cosyvoice3::hift` (each family's generator: its layout, its
//! noise), `model::compiled` (the body as a package, either layout), `layers`.

mod f0;
mod generator;
mod resblock;
mod source;
mod stft;

pub use generator::{HiftGenerator, HiftOutput};
pub use source::PhaseUpsampling;

/// Samples per mel frame: 8 · 5 · 3 · hop.
pub const SAMPLES_PER_FRAME: i64 = 480;
const N_FFT: i64 = 16;
const HOP: i64 = 4;
/// The fundamental and 8 harmonics.
pub const HARMONICS: i64 = 9;
const SAMPLE_RATE: f64 = 24000.0;
const UPSAMPLE: [i64; 3] = [8, 5, 3];
const UP_KERNELS: [i64; 3] = [16, 11, 7];
const RES_KERNELS: [i64; 3] = [3, 7, 11];
const SOURCE_KERNELS: [i64; 3] = [7, 7, 11];
const DILATIONS: [i64; 3] = [1, 3, 5];

/// How a generator's convolutions see time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// CosyVoice2's `HiFTGenerator`: centred convolutions (`conv_pre` k=7), transposed-convolution
    /// upsampling, source downsampling padded `u/2` on both sides, the F0 predictor in fp32, the
    /// source's phase upsampled linearly.
    Centred,
    /// CosyVoice3's `CausalHiFTGenerator`: convolutions padded on the left only, except `conv_pre`
    /// (kernel `conv_pre_look_right + 1`, looking that many frames ahead) and the F0 predictor's
    /// first (kernel 4, 3 ahead); upsampling by nearest repetition then a causal convolution;
    /// source downsampling padded `u − 1` on the left; the F0 predictor in float64 (upstream moves
    /// it there: "f0_predictor precision is crucial for causal inference"); the source's phase
    /// upsampled by repetition (nearest).
    Causal { conv_pre_look_right: i64 },
}
