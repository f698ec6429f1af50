//! Features of a prompt recording, each as the reference computes it (`cosyvoice/cli/frontend.py`):
//! - the speaker embedding's input — Kaldi's 80-bin log-mel filterbank at 16 kHz
//!   (`torchaudio.compliance.kaldi.fbank(speech, num_mel_bins=80, dither=0)`) with its mean over
//!   time removed — ported operation by operation (25 ms Povey windows every 10 ms, DC offset
//!   removed, pre-emphasis 0.97, 512-point power spectrum, Kaldi's mel banks from 20 Hz to Nyquist,
//!   log with float32's epsilon as the floor);
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
/// 80 log-mel values per 20 ms frame. Empty when too short for one frame.
pub fn prompt_mel(samples_24k: &[f32]) -> Vec<Vec<f32>> {
    let pad = (MEL_FFT - MEL_HOP) / 2;
    let n = samples_24k.len();
    if n <= pad {
        return Vec::new(); // reflect padding needs more samples than it pads
    }
    // Reflect padding (the edge sample not repeated), as torch's "reflect".
    let x: Vec<f64> = (0..n + 2 * pad)
        .map(|i| {
            let j = i as isize - pad as isize;
            let j = if j < 0 { -j } else if j >= n as isize { 2 * (n as isize - 1) - j } else { j };
            f64::from(samples_24k[j as usize])
        })
        .collect();
    if x.len() < MEL_FFT {
        return Vec::new();
    }
    let frames = 1 + (x.len() - MEL_FFT) / MEL_HOP;
    // torch.hann_window(1920): periodic.
    let window: Vec<f64> = (0..MEL_FFT).map(|i| 0.5 - 0.5 * (2.0 * std::f64::consts::PI * i as f64 / MEL_FFT as f64).cos()).collect();
    let banks = slaney_banks(24_000.0, MEL_FFT, 80, 0.0, 8_000.0);
    let fft = RealFftPlanner::<f64>::new().plan_fft_forward(MEL_FFT);
    let mut input = fft.make_input_vec();
    let mut spectrum = fft.make_output_vec();
    let mut out = Vec::with_capacity(frames);
    for f in 0..frames {
        for (i, v) in input.iter_mut().enumerate() {
            *v = x[f * MEL_HOP + i] * window[i];
        }
        if fft.process(&mut input, &mut spectrum).is_err() {
            return Vec::new();
        }
        let magnitude: Vec<f64> = spectrum.iter().map(|c| (c.norm_sqr() + 1e-9).sqrt()).collect();
        out.push(banks.iter().map(|bank| bank.iter().zip(&magnitude).map(|(w, m)| w * m).sum::<f64>().max(1e-5).ln() as f32).collect());
    }
    out
}
