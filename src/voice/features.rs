//! Features of a prompt recording, each as the reference computes it (`cosyvoice/cli/frontend.py`):
//! - the speaker embedding's input — Kaldi's 80-bin log-mel filterbank at 16 kHz
//!   (`torchaudio.compliance.kaldi.fbank(speech, num_mel_bins=80, dither=0)`) with its mean over
//!   time removed — ported operation by operation (25 ms Povey windows every 10 ms, DC offset
//!   removed, pre-emphasis 0.97, 512-point power spectrum, Kaldi's mel banks from 20 Hz to Nyquist,
//!   log with float32's epsilon as the floor);
//! - the speech tokenizer's input: Whisper's 128-bin log-mel at 16 kHz (`whisper_log_mel`);
//! - the flow's prompt mel at 24 kHz (matcha's `mel_spectrogram`: n_fft 1920, hop 480, Hann window,
//!   reflect padding of 720 a side, magnitude, 80 Slaney mel bands to 8 kHz, log clamped at 1e-5).
//!
//! Neighbours: `recording` (the samples at 16 kHz); the speaker-embedding model consumes
//! [`speaker_fbank`].

use realfft::RealFftPlanner;

/// Kaldi's frame length and shift at 16 kHz (25 ms, 10 ms) and the FFT size it rounds up to.
const FRAME: usize = 400;
const SHIFT: usize = 160;
const FFT: usize = 512;
const PREEMPHASIS: f64 = 0.97;
/// torch.finfo(torch.float32).eps: Kaldi's log floor in torchaudio.
const LOG_FLOOR: f64 = f32::EPSILON as f64;

/// Kaldi's mel scale.
fn mel(hz: f64) -> f64 {
    1127.0 * (1.0 + hz / 700.0).ln()
}

/// Kaldi's triangular mel banks (`get_mel_banks`, no VTLN): `bins` rows of `FFT / 2 + 1` weights
/// (the last, Nyquist, always 0), from `low_hz` to Nyquist. In float32 arithmetic, as torchaudio
/// computes them (whatever the input's precision): the banks' rounding moves a log energy by up to
/// ≈ 2e-4, so a float64 bank would not be the reference's.
fn mel_banks(bins: usize, sample_rate: f64, low_hz: f64) -> Vec<Vec<f64>> {
    let nyquist = sample_rate / 2.0;
    let bin_width = (sample_rate / FFT as f64) as f32;
    let (mel_low, mel_high) = (mel(low_hz), mel(nyquist));
    let (low, delta) = (mel_low as f32, ((mel_high - mel_low) / (bins as f64 + 1.0)) as f32);
    let fft_mels: Vec<f32> = (0..FFT / 2).map(|k| 1127.0f32 * (1.0f32 + bin_width * k as f32 / 700.0f32).ln()).collect();
    (0..bins)
        .map(|b| {
            let left = low + b as f32 * delta;
            let center = low + (b + 1) as f32 * delta;
            let right = low + (b + 2) as f32 * delta;
            let mut row: Vec<f64> = fft_mels
                .iter()
                .map(|&m| {
                    let up = (m - left) / (center - left);
                    let down = (right - m) / (right - center);
                    f64::from(up.min(down).max(0.0))
                })
                .collect();
            row.push(0.0);
            row
        })
        .collect()
}

/// `torchaudio.compliance.kaldi.fbank(samples, num_mel_bins=bins, dither=0, sample_frequency=16000)`
/// for samples at 16 kHz: one row of `bins` log energies per 10 ms frame (edges snipped: frames
/// that fit whole). Empty when shorter than one frame.
pub fn kaldi_fbank(samples: &[f32], bins: usize) -> Vec<Vec<f32>> {
    if samples.len() < FRAME {
        return Vec::new();
    }
    let frames = 1 + (samples.len() - FRAME) / SHIFT;
    let banks = mel_banks(bins, 16_000.0, 20.0);
    // Povey window: a Hann window (symmetric) to the power 0.85.
    let window: Vec<f64> = (0..FRAME)
        .map(|i| (0.5 - 0.5 * (2.0 * std::f64::consts::PI * i as f64 / (FRAME - 1) as f64).cos()).powf(0.85))
        .collect();
    let fft = RealFftPlanner::<f64>::new().plan_fft_forward(FFT);
    let mut input = fft.make_input_vec();
    let mut spectrum = fft.make_output_vec();
    let mut out = Vec::with_capacity(frames);
    for f in 0..frames {
        let frame: Vec<f64> = samples[f * SHIFT..f * SHIFT + FRAME].iter().map(|&s| f64::from(s)).collect();
        let mean = frame.iter().sum::<f64>() / FRAME as f64;
        let centred: Vec<f64> = frame.iter().map(|s| s - mean).collect();
        input.iter_mut().for_each(|x| *x = 0.0);
        for i in 0..FRAME {
            let previous = if i == 0 { centred[0] } else { centred[i - 1] };
            input[i] = (centred[i] - PREEMPHASIS * previous) * window[i];
        }
        // A 512-point buffer: the planner's length check cannot fail.
        if fft.process(&mut input, &mut spectrum).is_err() {
            return Vec::new();
        }
        let power: Vec<f64> = spectrum.iter().map(|c| c.norm_sqr()).collect();
        out.push(banks.iter().map(|bank| bank.iter().zip(&power).map(|(w, p)| w * p).sum::<f64>().max(LOG_FLOOR).ln() as f32).collect());
    }
    out
}

/// The speaker-embedding model's input as the reference makes it: the 80-bin fbank of the 16 kHz
/// samples, each bin's mean over time subtracted.
pub fn speaker_fbank(samples_16k: &[f32]) -> Vec<Vec<f32>> {
    let mut feat = kaldi_fbank(samples_16k, 80);
    if feat.is_empty() {
        return feat;
    }
    let n = feat.len() as f64;
    for b in 0..80 {
        let mean = feat.iter().map(|row| f64::from(row[b])).sum::<f64>() / n;
        for row in feat.iter_mut() {
            row[b] = (f64::from(row[b]) - mean) as f32;
        }
    }
    feat
}

/// The prompt mel's STFT: 80 ms windows every 20 ms at 24 kHz (two frames a speech token).
const MEL_FFT: usize = 1920;
const MEL_HOP: usize = 480;

/// librosa's Slaney mel scale (linear to 1 kHz, logarithmic above).
fn slaney_mel(hz: f64) -> f64 {
    let (f_sp, min_log_hz, min_log_mel, logstep) = (200.0 / 3.0, 1000.0, 15.0, 6.4f64.ln() / 27.0);
    if hz >= min_log_hz {
        min_log_mel + (hz / min_log_hz).ln() / logstep
    } else {
        hz / f_sp
    }
}

fn slaney_hz(mel: f64) -> f64 {
    let (f_sp, min_log_hz, min_log_mel, logstep) = (200.0 / 3.0, 1000.0, 15.0, 6.4f64.ln() / 27.0);
    if mel >= min_log_mel {
        min_log_hz * (logstep * (mel - min_log_mel)).exp()
    } else {
        f_sp * mel
    }
}

/// `librosa.filters.mel(sr, n_fft, n_mels, fmin, fmax)` (Slaney scale, Slaney area normalisation):
/// `n_mels` rows of `n_fft / 2 + 1` weights.
fn slaney_banks(sample_rate: f64, n_fft: usize, n_mels: usize, fmin: f64, fmax: f64) -> Vec<Vec<f64>> {
    let bins = n_fft / 2 + 1;
    let fft_hz: Vec<f64> = (0..bins).map(|k| k as f64 * sample_rate / n_fft as f64).collect();
    let (lo, hi) = (slaney_mel(fmin), slaney_mel(fmax));
    let mel_hz: Vec<f64> = (0..n_mels + 2).map(|i| slaney_hz(lo + (hi - lo) * i as f64 / (n_mels + 1) as f64)).collect();
    (0..n_mels)
        .map(|i| {
            let norm = 2.0 / (mel_hz[i + 2] - mel_hz[i]);
            fft_hz
                .iter()
                .map(|&f| {
                    let lower = (f - mel_hz[i]) / (mel_hz[i + 1] - mel_hz[i]);
                    let upper = (mel_hz[i + 2] - f) / (mel_hz[i + 2] - mel_hz[i + 1]);
                    lower.min(upper).max(0.0) * norm
                })
                .collect()
        })
        .collect()
}

/// The flow's prompt mel of 24 kHz samples, as the reference's `_extract_speech_feat`: one row of
/// 80 log-mel values (bands up to `fmax` Hz: CosyVoice2's 8,000, CosyVoice3's 12,000) per 20 ms
/// frame. Empty when too short for one frame.
pub fn prompt_mel(samples_24k: &[f32], fmax: f64) -> Vec<Vec<f32>> {
    let Some(x) = reflect_pad(samples_24k, (MEL_FFT - MEL_HOP) / 2) else { return Vec::new() };
    let banks = slaney_banks(24_000.0, MEL_FFT, 80, 0.0, fmax);
    stft_power(&x, MEL_FFT, MEL_HOP)
        .into_iter()
        .map(|power| {
            let magnitude: Vec<f64> = power.iter().map(|p| (p + 1e-9).sqrt()).collect();
            banks.iter().map(|bank| bank.iter().zip(&magnitude).map(|(w, m)| w * m).sum::<f64>().max(1e-5).ln() as f32).collect()
        })
        .collect()
}

/// The speech tokenizer's input, as the reference's `whisper.log_mel_spectrogram(speech, n_mels=128)`
/// (s3tokenizer's copy): of 16 kHz samples, a 400-point STFT every 160 samples (centred: reflect
/// padding of 200 a side; the last frame dropped), power, 128 Slaney mel bands, log10 clamped at
/// 1e-10, floored 8 below its maximum, then (x + 4) / 4. One row of 128 per 10 ms.
pub fn whisper_log_mel(samples_16k: &[f32]) -> Vec<Vec<f32>> {
    const N_FFT: usize = 400;
    const HOP: usize = 160;
    let Some(x) = reflect_pad(samples_16k, N_FFT / 2) else { return Vec::new() };
    let banks = slaney_banks(16_000.0, N_FFT, 128, 0.0, 8_000.0);
    let mut frames = stft_power(&x, N_FFT, HOP);
    frames.pop();
    let logs: Vec<Vec<f64>> = frames
        .iter()
        .map(|power| banks.iter().map(|bank| bank.iter().zip(power).map(|(w, p)| w * p).sum::<f64>().max(1e-10).log10()).collect())
        .collect();
    let max = logs.iter().flatten().copied().fold(f64::NEG_INFINITY, f64::max);
    logs.into_iter().map(|row| row.into_iter().map(|v| ((v.max(max - 8.0) + 4.0) / 4.0) as f32).collect()).collect()
}

/// `samples` reflect-padded by `pad` a side, as torch's "reflect" (the edge sample not repeated);
/// `None` when there are too few samples to reflect.
fn reflect_pad(samples: &[f32], pad: usize) -> Option<Vec<f64>> {
    let n = samples.len();
    if n <= pad {
        return None;
    }
    Some(
        (0..n + 2 * pad)
            .map(|i| {
                let j = i as isize - pad as isize;
                let j = if j < 0 { -j } else if j >= n as isize { 2 * (n as isize - 1) - j } else { j };
                f64::from(samples[j as usize])
            })
            .collect(),
    )
}

/// Power spectra (`n_fft / 2 + 1` bins) of `x` under a periodic Hann window (torch.hann_window),
/// a frame every `hop` samples, frames that fit whole.
fn stft_power(x: &[f64], n_fft: usize, hop: usize) -> Vec<Vec<f64>> {
    if x.len() < n_fft {
        return Vec::new();
    }
    let frames = 1 + (x.len() - n_fft) / hop;
    let window: Vec<f64> = (0..n_fft).map(|i| 0.5 - 0.5 * (2.0 * std::f64::consts::PI * i as f64 / n_fft as f64).cos()).collect();
    let fft = RealFftPlanner::<f64>::new().plan_fft_forward(n_fft);
    let mut input = fft.make_input_vec();
    let mut spectrum = fft.make_output_vec();
    let mut out = Vec::with_capacity(frames);
    for f in 0..frames {
        for (i, v) in input.iter_mut().enumerate() {
            *v = x[f * hop + i] * window[i];
        }
        // Buffers from the plan itself: the length check cannot fail.
        if fft.process(&mut input, &mut spectrum).is_err() {
            return Vec::new();
        }
        out.push(spectrum.iter().map(|c| c.norm_sqr()).collect());
    }
    out
}
