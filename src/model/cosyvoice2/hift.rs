//! CosyVoice2's vocoder, `HiFTGenerator` (HiFi-GAN + neural source filter + iSTFT), batched:
//! mel `[B, 80, T]` at 50 Hz → waveform `[B, 480·T]` at 24 kHz.
//!
//! F0 predictor (5 convs + linear) → harmonic source (`SineGen2`: 8 harmonics, phase integrated at
//! the frame rate) → its STFT joins the upsampling path ([8, 5, 3] transposed convs with Snake
//! ResBlocks) → 18 channels of log-magnitude and phase → iSTFT (n_fft 16, hop 4).
//!
//! Batching: every convolution here is non-causal, so after each one the positions past an item's
//! length are zeroed — exactly the zero padding an unbatched run sees; the source's STFT
//! reflect-pads each item at its own end, and the iSTFT's overlap-add envelope counts only each
//! item's own frames. The STFT/iSTFT run in fp32 (there are no half-precision FFT kernels worth
//! the error), whatever the autocast precision of the rest.
//!
//! The convolutional body between the source's STFT and the iSTFT runs through a compiled package
//! (`model::compiled`, stage `hift`: `tools/compile_token2wav.py`'s `HiftBody`, the same masked
//! computation) when the model directory has one for this machine and the batch fits it.

use std::f64::consts::PI;

use tch::{Kind, Tensor};

use super::layers::{length_mask, Conv1d, ConvTranspose1d, Linear, R};
use crate::model::compiled::{CompiledStage, KernelCounts};
use super::weights::Weights;

const N_FFT: i64 = 16;
const HOP: i64 = 4;
const HARMONICS: i64 = 9; // fundamental + 8
const SAMPLE_RATE: f64 = 24000.0;
const UPSAMPLE: [i64; 3] = [8, 5, 3];
const UP_KERNELS: [i64; 3] = [16, 11, 7];
const RES_KERNELS: [i64; 3] = [3, 7, 11];
const SOURCE_KERNELS: [i64; 3] = [7, 7, 11];
const DILATIONS: [i64; 3] = [1, 3, 5];
/// Samples per mel frame: 8 · 5 · 3 · hop.
pub const SAMPLES_PER_FRAME: i64 = 480;

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

struct Snake {
    alpha: Tensor,
}

impl Snake {
    fn new(w: &Weights, name: &str, ch: i64) -> Snake {
        Snake { alpha: w.get(name, &[ch]).view([1, ch, 1]) }
    }
    /// x + 1/α · sin²(αx)
    fn forward(&self, x: &Tensor) -> R<Tensor> {
        let alpha = self.alpha.f_to_kind(x.kind())?;
        let sin2 = x.f_mul(&alpha)?.f_sin()?.f_pow_tensor_scalar(2)?;
        x.f_add(&alpha.f_add_scalar(1e-9)?.f_reciprocal()?.f_mul(&sin2)?)
    }
}

struct ResBlock {
    convs1: Vec<Conv1d>,
    convs2: Vec<Conv1d>,
    acts1: Vec<Snake>,
    acts2: Vec<Snake>,
}

impl ResBlock {
    fn new(w: &Weights, p: &str, ch: i64, kernel: i64) -> ResBlock {
        let n = DILATIONS.len();
        ResBlock {
            convs1: DILATIONS.iter().enumerate().map(|(i, &d)| Conv1d::same(w, &format!("{p}.convs1.{i}"), ch, ch, kernel, d)).collect(),
            convs2: (0..n).map(|i| Conv1d::same(w, &format!("{p}.convs2.{i}"), ch, ch, kernel, 1)).collect(),
            acts1: (0..n).map(|i| Snake::new(w, &format!("{p}.activations1.{i}.alpha"), ch)).collect(),
            acts2: (0..n).map(|i| Snake::new(w, &format!("{p}.activations2.{i}.alpha"), ch)).collect(),
        }
    }
    fn forward(&self, x: &Tensor, mask: &Tensor) -> R<Tensor> {
        let mut x = x.shallow_clone();
        for i in 0..self.convs1.len() {
            let xt = self.convs1[i].forward(&self.acts1[i].forward(&x)?)?.f_mul(mask)?;
            let xt = self.convs2[i].forward(&self.acts2[i].forward(&xt)?)?.f_mul(mask)?;
            x = xt.f_add(&x)?;
        }
        Ok(x)
    }
}

pub struct Hift {
    f0_convs: Vec<Conv1d>,
    f0_classifier: Linear,
    source_linear: Linear,
    conv_pre: Conv1d,
    ups: Vec<ConvTranspose1d>,
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

impl Hift {
    pub fn new(w: &Weights, channels: i64, f0_channels: i64) -> Hift {
        let f0_convs = (0..5)
            .map(|i| Conv1d::same(w, &format!("hift.f0_predictor.condnet.{}", 2 * i), if i == 0 { 80 } else { f0_channels }, f0_channels, 3, 1))
            .collect();
        let ch = |i: usize| channels >> (i + 1);
        let ups = (0..3)
            .map(|i| {
                let (u, k) = (UPSAMPLE[i], UP_KERNELS[i]);
                ConvTranspose1d::new(w, &format!("hift.ups.{i}"), channels >> i, ch(i), k, u, (k - u) / 2)
            })
            .collect();
        // Source downsampling to each level's rate: cumulative [15, 3, 1].
        let down_rates = [15i64, 3, 1];
        let source_downs = (0..3)
            .map(|i| {
                let u = down_rates[i];
                let p = format!("hift.source_downs.{i}");
                if u == 1 {
                    Conv1d::new(w, &p, N_FFT + 2, ch(i), 1, 1, 1, (0, 0))
                } else {
                    Conv1d::new(w, &p, N_FFT + 2, ch(i), 2 * u, u, 1, (u / 2, u / 2))
                }
            })
            .collect();
        let source_resblocks =
            (0..3).map(|i| ResBlock::new(w, &format!("hift.source_resblocks.{i}"), ch(i), SOURCE_KERNELS[i])).collect();
        let resblocks = (0..3)
            .flat_map(|i| (0..3).map(move |j| (i, j)))
            .map(|(i, j)| ResBlock::new(w, &format!("hift.resblocks.{}", 3 * i + j), ch(i), RES_KERNELS[j]))
            .collect();
        // scipy's periodic Hann window, computed in f64 and stored as f32 like the reference.
        let window: Vec<f32> = (0..N_FFT).map(|n| (0.5 - 0.5 * (2.0 * PI * n as f64 / N_FFT as f64).cos()) as f32).collect();
        let device = w.get("hift.conv_pre.bias", &[channels]).device();
        Hift {
            f0_convs,
            f0_classifier: Linear::new(w, "hift.f0_predictor.classifier", f0_channels, 1, true),
            source_linear: Linear::new(w, "hift.m_source.l_linear", HARMONICS, 1, true),
            conv_pre: Conv1d::same(w, "hift.conv_pre", 80, channels, 7, 1),
            ups,
            source_downs,
            source_resblocks,
            resblocks,
            conv_post: Conv1d::same(w, "hift.conv_post", ch(2), N_FFT + 2, 7, 1),
            window: Tensor::from_slice(&window).to_device(device),
            compiled: None,
            calls_run: KernelCounts::default(),
        }
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

    /// `mel`: `[B, 80, T]` (zero past each length), `frames`: mel frames per item.
    pub fn forward(&self, mel: &Tensor, frames: &[i64], draws: &SourceDraws) -> R<HiftOutput> {
        let f0 = self.f0(mel, frames)?;
        let (_, _, t) = mel.size3()?;
        let samples = t * SAMPLES_PER_FRAME;
        let source = self.source(&f0, draws, samples)?.f_mul(&self.mask(frames, samples, SAMPLES_PER_FRAME, 0)?.f_squeeze_dim(1)?)?;
        let wav = self.decode(mel, &source, frames)?;
        Ok(HiftOutput { wav, f0, source })
    }

    /// `[B, 1, t_max · scale + extra]` mask of each item's `frames · scale + extra` positions.
    fn mask(&self, frames: &[i64], t_len: i64, scale: i64, extra: i64) -> R<Tensor> {
        let lens: Vec<i64> = frames.iter().map(|f| f * scale + extra).collect();
        length_mask(&lens, t_len, self.window.device())?.f_unsqueeze(1)
    }

    /// `ConvRNNF0Predictor`: mel → F0 `[B, T]` in Hz (zero past each length).
    pub fn f0(&self, mel: &Tensor, frames: &[i64]) -> R<Tensor> {
        let (_, _, t) = mel.size3()?;
        let mel_mask = self.mask(frames, t, 1, 0)?;
        let mut h = mel.f_mul(&mel_mask)?;
        for conv in &self.f0_convs {
            h = conv.forward(&h)?.f_mul(&mel_mask)?.f_elu()?;
        }
        let f0 = self.f0_classifier.forward(&h.f_transpose(1, 2)?)?.f_squeeze_dim(-1)?.f_abs()?.f_to_kind(Kind::Float)?;
        f0.f_mul(&mel_mask.f_squeeze_dim(1)?)
    }

    /// The HiFi-GAN/iSTFT decoder: mel `[B, 80, T]` and harmonic source `[B, 480·T]` → waveform
    /// `[B, 480·T]`, zero past each item's length.
    pub fn decode(&self, mel: &Tensor, source: &Tensor, frames: &[i64]) -> R<Tensor> {
        let (b, _, t) = mel.size3()?;
        let s_stft = self.source_stft(&source.f_to_kind(Kind::Float)?, frames)?;
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
        self.istft(&x, frames)?.f_clamp(-0.99, 0.99)?.f_mul(&self.mask(frames, samples, SAMPLES_PER_FRAME, 0)?.f_squeeze_dim(1)?)
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

    /// `SineGen2` + `SourceModuleHnNSF2`: F0 `[B, T]` (Hz) → harmonic source `[B, samples]`.
    pub fn source(&self, f0: &Tensor, draws: &SourceDraws, samples: i64) -> R<Tensor> {
        let device = f0.device();
        let (b, frames) = f0.size2()?;
        // nn.Upsample(scale_factor=480), nearest, with its own index arithmetic.
        let f0_up = f0.f_unsqueeze(1)?.f_upsample_nearest1d([samples], SAMPLES_PER_FRAME as f64)?.f_transpose(1, 2)?; // [B, S, 1]
        let harmonics = Tensor::f_arange_start(1, HARMONICS + 1, (Kind::Float, device))?.f_view([1, 1, HARMONICS])?;
        let fn_ = f0_up.f_mul(&harmonics)?;
        let rad = fn_.f_div_scalar(SAMPLE_RATE)?.f_remainder(1.0)?;
        let drawn = draws.rand_ini.f_to_device(device)?.f_narrow(0, 0, b)?;
        let mut rand_ini = drawn.f_empty_like()?;
        rand_ini.f_copy_(&drawn)?;
        let _ = rand_ini.f_narrow(1, 0, 1)?.f_fill_(0.0)?;
        let first = rad.f_narrow(1, 0, 1)?.f_add(&rand_ini.f_unsqueeze(1)?)?;
        let rad = Tensor::f_cat(&[first, rad.f_narrow(1, 1, samples - 1)?], 1)?;
        let scale = SAMPLES_PER_FRAME as f64;
        let rad_down = rad.f_transpose(1, 2)?.f_upsample_linear1d([frames], false, 1.0 / scale)?.f_transpose(1, 2)?;
        let phase = rad_down.f_cumsum(1, None::<Kind>)?.f_mul_scalar(2.0)?.f_mul_scalar(PI)?;
        let phase = phase.f_transpose(1, 2)?.f_mul_scalar(scale)?.f_upsample_linear1d([samples], false, scale)?.f_transpose(1, 2)?;
        let sines = phase.f_sin()?.f_mul_scalar(0.1)?;
        let uv = f0_up.f_gt(10.0)?.f_to_kind(Kind::Float)?;
        let noise_amp = uv.f_mul_scalar(0.003)?.f_add(&uv.f_ones_like()?.f_sub(&uv)?.f_mul_scalar(0.1)?.f_div_scalar(3.0)?)?;
        let noise = noise_amp.f_mul(&draws.noise.f_to_device(device)?.f_narrow(0, 0, b)?.f_narrow(1, 0, samples)?)?;
        let sine_waves = sines.f_mul(&uv)?.f_add(&noise)?;
        self.source_linear.forward(&sine_waves)?.f_tanh()?.f_squeeze_dim(-1)
    }

    /// `torch.stft(center=True, reflect)` of each item's own samples: `[B, 18, frames·120 + 1]`.
    fn source_stft(&self, s: &Tensor, frames: &[i64]) -> R<Tensor> {
        let (b, samples) = s.size2()?;
        let pad = N_FFT / 2;
        let padded = Tensor::f_zeros([b, samples + 2 * pad], (Kind::Float, s.device()))?;
        for (row, &f) in frames.iter().enumerate() {
            let len = f * SAMPLES_PER_FRAME;
            if len == 0 {
                continue;
            }
            let item = s.f_get(row as i64)?.f_narrow(0, 0, len)?.f_view([1, 1, len])?.f_reflection_pad1d([pad, pad])?;
            let mut dst = padded.f_get(row as i64)?.f_narrow(0, 0, len + 2 * pad)?;
            dst.f_copy_(&item.f_view([-1])?)?;
        }
        let spec = padded.f_unfold(1, N_FFT, HOP)?.f_mul(&self.window)?.f_fft_rfft(None, -1, "backward")?; // [B, F, 9]
        let spec = Tensor::f_view_as_real(&spec)?; // [B, F, 9, 2]
        let real = spec.f_select(-1, 0)?.f_transpose(1, 2)?;
        let imag = spec.f_select(-1, 1)?.f_transpose(1, 2)?;
        let frames_max = samples / HOP + 1;
        let mask = length_mask(&frames.iter().map(|f| f * SAMPLES_PER_FRAME / HOP + 1).collect::<Vec<_>>(), frames_max, s.device())?;
        Tensor::f_cat(&[real, imag], 1)?.f_mul(&mask.f_unsqueeze(1)?)
    }

    /// `torch.istft(center=True)` with the window envelope of each item's own frames.
    fn istft(&self, x: &Tensor, frames: &[i64]) -> R<Tensor> {
        let device = x.device();
        let bins = N_FFT / 2 + 1;
        let (_, _, n) = x.size3()?;
        let frame_mask = length_mask(&frames.iter().map(|f| f * SAMPLES_PER_FRAME / HOP + 1).collect::<Vec<_>>(), n, device)?;
        let magnitude = x.f_narrow(1, 0, bins)?.f_exp()?.f_clamp_max(100.0)?.f_mul(&frame_mask.f_unsqueeze(1)?)?;
        let phase = x.f_narrow(1, bins, bins)?.f_sin()?;
        let spec = Tensor::f_complex(&magnitude.f_mul(&phase.f_cos()?)?, &magnitude.f_mul(&phase.f_sin()?)?)?.f_transpose(1, 2)?;
        let frames_t = spec.f_fft_irfft(N_FFT, -1, "backward")?.f_mul(&self.window)?; // [B, F, 16]
        let eye = Tensor::f_eye(N_FFT, (Kind::Float, device))?.f_view([N_FFT, 1, N_FFT])?;
        let ola = frames_t.f_transpose(1, 2)?.f_conv_transpose1d(&eye, None::<&Tensor>, [HOP], [0], [0], 1, [1])?;
        let win_sq = self.window.f_mul(&self.window)?.f_view([1, 1, N_FFT])?;
        let envelope = frame_mask.f_unsqueeze(1)?.f_conv_transpose1d(&win_sq, None::<&Tensor>, [HOP], [0], [0], 1, [1])?;
        let len = (n - 1) * HOP;
        let ola = ola.f_narrow(2, N_FFT / 2, len)?.f_squeeze_dim(1)?;
        let envelope = envelope.f_narrow(2, N_FFT / 2, len)?.f_squeeze_dim(1)?;
        let safe = envelope.f_gt(1e-11)?;
        ola.f_div(&envelope.f_where_scalarother(&safe, 1.0)?)?.f_mul(&safe.f_to_kind(Kind::Float)?)
    }
}
