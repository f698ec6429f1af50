//! The harmonic source, `SineGen2` + `SourceModuleHnNSF` (cosyvoice/hifigan/generator.py): F0
//! `[B, T]` (Hz) → excitation `[B, samples]`. F0 held per frame (nearest ×480), 9 harmonics, each
//! one's phase increment per sample `(f·h / 24000) mod 1` averaged to the frame rate, summed into
//! phase and brought back to the sample rate — linearly (CosyVoice2) or by repetition (CosyVoice3,
//! `causal=True`); sines × 0.1 where voiced (F0 > 10 Hz), plus noise (0.003 voiced, 0.1/3
//! unvoiced) times the given draws; merged by `l_linear` and tanh.

use std::f64::consts::PI;

use tch::{Kind, Tensor};

use super::{HARMONICS, SAMPLES_PER_FRAME, SAMPLE_RATE};
use crate::model::layers::{upsample_by_rows, Linear, R};

/// How the phase, integrated at the frame rate, returns to the sample rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PhaseUpsampling {
    /// `F.interpolate(mode='linear')` (CosyVoice2).
    Linear,
    /// `F.interpolate(mode='nearest')` (CosyVoice3's causal source).
    Nearest,
}

/// The excitation of `f0` over `samples` samples. `rand_ini` (`[B, 9]`, the fundamental's column
/// zeroed here) offsets the first sample's phase increment, as upstream does; it has no effect on
/// the output (the frame-rate average never reads sample 0), and CosyVoice3 passes none. `noise`:
/// `[B, ≥ samples, 9]`, or `[1, ≥ samples, 9]` shared by every item (CosyVoice3's fixed buffer).
pub(super) fn harmonic_source(
    linear: &Linear,
    f0: &Tensor,
    samples: i64,
    phase_upsampling: PhaseUpsampling,
    rand_ini: Option<&Tensor>,
    noise: &Tensor,
) -> R<Tensor> {
    let device = f0.device();
    let (b, frames) = f0.size2()?;
    // nn.Upsample(scale_factor=480), nearest, with its own index arithmetic.
    let f0_up = upsample_by_rows(&f0.f_unsqueeze(1)?, samples, |rows| rows.f_upsample_nearest1d([samples], SAMPLES_PER_FRAME as f64))?
        .f_transpose(1, 2)?; // [B, S, 1]
    let harmonics = Tensor::f_arange_start(1, HARMONICS + 1, (Kind::Float, device))?.f_view([1, 1, HARMONICS])?;
    let fn_ = f0_up.f_mul(&harmonics)?;
    let mut rad = fn_.f_div_scalar(SAMPLE_RATE)?.f_remainder(1.0)?;
    if let Some(drawn) = rand_ini {
        let drawn = drawn.f_to_device(device)?.f_narrow(0, 0, b)?;
        let mut rand_ini = drawn.f_empty_like()?;
        rand_ini.f_copy_(&drawn)?;
        let _ = rand_ini.f_narrow(1, 0, 1)?.f_fill_(0.0)?;
        let first = rad.f_narrow(1, 0, 1)?.f_add(&rand_ini.f_unsqueeze(1)?)?;
        rad = Tensor::f_cat(&[first, rad.f_narrow(1, 1, samples - 1)?], 1)?;
    }
    let scale = SAMPLES_PER_FRAME as f64;
    let rad_down = rad.f_transpose(1, 2)?.f_upsample_linear1d([frames], false, 1.0 / scale)?.f_transpose(1, 2)?;
    let phase = rad_down.f_cumsum(1, None::<Kind>)?.f_mul_scalar(2.0)?.f_mul_scalar(PI)?;
    let phase = phase.f_transpose(1, 2)?.f_mul_scalar(scale)?;
    let phase = upsample_by_rows(&phase, HARMONICS * samples, |rows| match phase_upsampling {
        PhaseUpsampling::Linear => rows.f_upsample_linear1d([samples], false, scale),
        PhaseUpsampling::Nearest => rows.f_upsample_nearest1d([samples], scale),
    })?
    .f_transpose(1, 2)?;
    let sines = phase.f_sin()?.f_mul_scalar(0.1)?;
    let uv = f0_up.f_gt(10.0)?.f_to_kind(Kind::Float)?;
    let noise_amp = uv.f_mul_scalar(0.003)?.f_add(&uv.f_ones_like()?.f_sub(&uv)?.f_mul_scalar(0.1)?.f_div_scalar(3.0)?)?;
    let noise = noise.f_to_device(device)?;
    let noise = if noise.size().first().copied().unwrap_or(1) > 1 { noise.f_narrow(0, 0, b)? } else { noise };
    let noise = noise_amp.f_mul(&noise.f_narrow(1, 0, samples)?)?;
    let sine_waves = sines.f_mul(&uv)?.f_add(&noise)?;
    linear.forward(&sine_waves)?.f_tanh()?.f_squeeze_dim(-1)
}
