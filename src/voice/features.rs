//! Features of a prompt recording, each as the reference computes it (`cosyvoice/cli/frontend.py`):
//! the speaker embedding's input — Kaldi's 80-bin log-mel filterbank at 16 kHz
//! (`torchaudio.compliance.kaldi.fbank(speech, num_mel_bins=80, dither=0)`) with its mean over time
//! removed — ported operation by operation (25 ms Povey windows every 10 ms, DC offset removed,
//! pre-emphasis 0.97, 512-point power spectrum, Kaldi's mel banks from 20 Hz to Nyquist, log with
//! float32's epsilon as the floor).
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
