//! `torch.stft` of the harmonic source and `torch.istft` of the generator's output (n_fft 16, hop
//! 4, periodic Hann window, `center=True`), each item over its own samples and frames: the STFT
//! reflect-pads every item at its own end (alone, its last two frames read the reflection; in a
//! batch they would read the next item-padding samples), and the iSTFT's overlap-add and window
//! envelope count only each item's own `120·T + 1` frames (alone, the frame after them does not
//! exist). Both in fp32, whatever the autocast precision around them.

use std::f64::consts::PI;

use tch::{Kind, Tensor};

use super::{HOP, N_FFT, SAMPLES_PER_FRAME};
use crate::model::layers::{length_mask, R};

/// scipy's periodic Hann window of `N_FFT` (`get_window('hann', 16, fftbins=True)`), computed
/// in f64 and stored as f32 like the reference.
pub(super) fn hann_window(device: tch::Device) -> Tensor {
    let window: Vec<f32> = (0..N_FFT).map(|n| (0.5 - 0.5 * (2.0 * PI * n as f64 / N_FFT as f64).cos()) as f32).collect();
    Tensor::from_slice(&window).to_device(device)
}

/// STFT frames of an item of `frames` mel frames.
fn stft_frames(frames: i64) -> i64 {
    frames * SAMPLES_PER_FRAME / HOP + 1
}

/// `torch.stft(center=True, reflect)` of each item's own samples (`s` `[B, samples]` fp32,
/// `frames` mel frames per item): `[B, 18, frames·120 + 1]` (real parts, then imaginary), zero
/// past each item's frames.
pub(super) fn source_stft(s: &Tensor, frames: &[i64], window: &Tensor) -> R<Tensor> {
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
    let spec = padded.f_unfold(1, N_FFT, HOP)?.f_mul(window)?.f_fft_rfft(None, -1, "backward")?; // [B, F, 9]
    let spec = Tensor::f_view_as_real(&spec)?; // [B, F, 9, 2]
    let real = spec.f_select(-1, 0)?.f_transpose(1, 2)?;
    let imag = spec.f_select(-1, 1)?.f_transpose(1, 2)?;
    let frames_max = samples / HOP + 1;
    let mask = length_mask(&frames.iter().map(|&f| stft_frames(f)).collect::<Vec<_>>(), frames_max, s.device())?;
    Tensor::f_cat(&[real, imag], 1)?.f_mul(&mask.f_unsqueeze(1)?)
}

/// `torch.istft(center=True)` of `x` (`[B, 18, n]` fp32: log-magnitudes, then phases before their
/// sine) with the window envelope of each item's own frames: `[B, (n − 1)·4]`.
pub(super) fn istft(x: &Tensor, frames: &[i64], window: &Tensor) -> R<Tensor> {
    let device = x.device();
    let bins = N_FFT / 2 + 1;
    let (_, _, n) = x.size3()?;
    let frame_mask = length_mask(&frames.iter().map(|&f| stft_frames(f)).collect::<Vec<_>>(), n, device)?;
    let magnitude = x.f_narrow(1, 0, bins)?.f_exp()?.f_clamp_max(100.0)?.f_mul(&frame_mask.f_unsqueeze(1)?)?;
    let phase = x.f_narrow(1, bins, bins)?.f_sin()?;
    let spec = Tensor::f_complex(&magnitude.f_mul(&phase.f_cos()?)?, &magnitude.f_mul(&phase.f_sin()?)?)?.f_transpose(1, 2)?;
    let frames_t = spec.f_fft_irfft(N_FFT, -1, "backward")?.f_mul(window)?; // [B, F, 16]
    let eye = Tensor::f_eye(N_FFT, (Kind::Float, device))?.f_view([N_FFT, 1, N_FFT])?;
    let ola = frames_t.f_transpose(1, 2)?.f_conv_transpose1d(&eye, None::<&Tensor>, [HOP], [0], [0], 1, [1])?;
    let win_sq = window.f_mul(window)?.f_view([1, 1, N_FFT])?;
    let envelope = frame_mask.f_unsqueeze(1)?.f_conv_transpose1d(&win_sq, None::<&Tensor>, [HOP], [0], [0], 1, [1])?;
    let len = (n - 1) * HOP;
    let ola = ola.f_narrow(2, N_FFT / 2, len)?.f_squeeze_dim(1)?;
    let envelope = envelope.f_narrow(2, N_FFT / 2, len)?.f_squeeze_dim(1)?;
    let safe = envelope.f_gt(1e-11)?;
    ola.f_div(&envelope.f_where_scalarother(&safe, 1.0)?)?.f_mul(&safe.f_to_kind(Kind::Float)?)
}
