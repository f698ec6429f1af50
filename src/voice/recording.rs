//! A prompt recording in: decoded with symphonia (WAV, FLAC, MP3, Ogg Vorbis), down-mixed to mono
//! as the reference's `load_wav` does (the mean of the channels), resampled as torchaudio's
//! `Resample` does it (the reference resamples with it; a port, not a different resampler, so the
//! features see the reference's samples: the speech tokenizer and speaker embedding take 16 kHz,
//! the prompt mel 24 kHz), and checked as a
//! prompt: 1 to 30 seconds, not silence. Each refusal says what is wrong with the file. (symphonia
//! also logs its probe failures through `log`, at ERROR; the binary's log filter turns symphonia's
//! records off, so `voice add` on a file that is not audio prints only this module's refusal.)
//!
//! Neighbours: `voice` (the features computed from it).

use std::io::Cursor;

use symphonia::core::audio::SampleBuffer;
use symphonia::core::codecs::{DecoderOptions, CODEC_TYPE_NULL};
use symphonia::core::errors::Error as DecodeError;
use symphonia::core::formats::FormatOptions;
use symphonia::core::io::MediaSourceStream;
use symphonia::core::meta::MetadataOptions;
use symphonia::core::probe::Hint;

/// Shortest prompt accepted, in seconds.
pub const MIN_SECONDS: f64 = 1.0;
/// Longest prompt accepted (the speech tokenizer reads at most 30 s).
pub const MAX_SECONDS: f64 = 30.0;
/// A recording whose loudest sample is below this (dBFS) is silence.
pub const SILENCE_PEAK_DBFS: f64 = -50.0;

/// Mono samples at a sample rate.
#[derive(Debug, Clone, PartialEq)]
pub struct Recording {
    pub samples: Vec<f32>,
    pub sample_rate: u32,
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RecordingError {
    #[error("not an audio file (WAV, FLAC, MP3 or Ogg Vorbis): {0}")]
    NotAudio(String),
    #[error("the audio cannot be decoded: {0}")]
    Unreadable(String),
    #[error("the recording is {seconds:.2} s long: a prompt needs at least {MIN_SECONDS} s")]
    TooShort { seconds: f64 },
    #[error("the recording is {seconds:.1} s long: a prompt may be at most {MAX_SECONDS} s (cut it)")]
    TooLong { seconds: f64 },
    #[error("the recording is silence (its loudest sample is {peak_dbfs:.1} dBFS)")]
    Silence { peak_dbfs: f64 },
    #[error("cannot resample from {from} Hz to {to} Hz: {reason}")]
    Resample { from: u32, to: u32, reason: String },
}

impl Recording {
    /// Decodes `bytes` (`extension`, e.g. "flac", helps the format probe) and down-mixes it.
    pub fn decode(bytes: Vec<u8>, extension: Option<&str>) -> Result<Recording, RecordingError> {
        let stream = MediaSourceStream::new(Box::new(Cursor::new(bytes)), Default::default());
        let mut hint = Hint::new();
        if let Some(ext) = extension {
            hint.with_extension(ext);
        }
        let probed = symphonia::default::get_probe()
            .format(&hint, stream, &FormatOptions::default(), &MetadataOptions::default())
            .map_err(|e| RecordingError::NotAudio(e.to_string()))?;
        let mut format = probed.format;
        let track = format
            .tracks()
            .iter()
            .find(|t| t.codec_params.codec != CODEC_TYPE_NULL)
            .ok_or_else(|| RecordingError::NotAudio("no audio track".into()))?;
        let track_id = track.id;
        let mut sample_rate = track.codec_params.sample_rate;
        let mut decoder = symphonia::default::get_codecs()
            .make(&track.codec_params, &DecoderOptions::default())
            .map_err(|e| RecordingError::Unreadable(e.to_string()))?;
        let mut samples = Vec::new();
        loop {
            let packet = match format.next_packet() {
                Ok(p) => p,
                Err(DecodeError::IoError(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
                Err(DecodeError::ResetRequired) => break,
                Err(e) => return Err(RecordingError::Unreadable(e.to_string())),
            };
            if packet.track_id() != track_id {
                continue;
            }
            let decoded = match decoder.decode(&packet) {
                Ok(d) => d,
                // A damaged frame is skipped, as players do.
                Err(DecodeError::DecodeError(_)) => continue,
                Err(e) => return Err(RecordingError::Unreadable(e.to_string())),
            };
            let spec = *decoded.spec();
            sample_rate = Some(spec.rate);
            let channels = spec.channels.count().max(1);
            let mut buffer = SampleBuffer::<f32>::new(decoded.capacity() as u64, spec);
            buffer.copy_interleaved_ref(decoded);
            samples.extend(buffer.samples().chunks(channels).map(|frame| frame.iter().sum::<f32>() / channels as f32));
        }
        let sample_rate = sample_rate.filter(|r| *r > 0).ok_or_else(|| RecordingError::Unreadable("no sample rate".into()))?;
        if samples.is_empty() {
            return Err(RecordingError::Unreadable("no samples".into()));
        }
        Ok(Recording { samples, sample_rate })
    }

    pub fn seconds(&self) -> f64 {
        self.samples.len() as f64 / f64::from(self.sample_rate)
    }

    /// The loudest sample, in dBFS (−∞ for digital silence).
    pub fn peak_dbfs(&self) -> f64 {
        let peak = self.samples.iter().fold(0.0f32, |m, s| m.max(s.abs()));
        20.0 * f64::from(peak).log10()
    }

    /// Refuses what cannot be a prompt: under [`MIN_SECONDS`], over [`MAX_SECONDS`], silence.
    pub fn check_prompt(&self) -> Result<(), RecordingError> {
        let seconds = self.seconds();
        if seconds < MIN_SECONDS {
            return Err(RecordingError::TooShort { seconds });
        }
        if seconds > MAX_SECONDS {
            return Err(RecordingError::TooLong { seconds });
        }
        let peak_dbfs = self.peak_dbfs();
        if peak_dbfs < SILENCE_PEAK_DBFS {
            return Err(RecordingError::Silence { peak_dbfs });
        }
        Ok(())
    }

    /// The recording at `rate` Hz, resampled exactly as the reference's
    /// `torchaudio.transforms.Resample` (windowed-sinc polyphase filter: Hann window, 6 zero
    /// crossings, roll-off 0.99); the same when already there.
    pub fn resampled(&self, rate: u32) -> Result<Recording, RecordingError> {
        if rate == self.sample_rate {
            return Ok(self.clone());
        }
        if rate == 0 {
            return Err(RecordingError::Resample { from: self.sample_rate, to: rate, reason: "rate 0".into() });
        }
        let g = gcd(self.sample_rate as usize, rate as usize);
        let (orig, new) = (self.sample_rate as usize / g, rate as usize / g);
        let (kernels, width) = sinc_hann_kernels(orig, new);
        let taps = 2 * width + orig;
        // Padded by `width` before and `width + orig` after, as torchaudio pads.
        let mut x = vec![0.0f64; width];
        x.extend(self.samples.iter().map(|&s| f64::from(s)));
        x.extend(std::iter::repeat_n(0.0, width + orig));
        let frames = (x.len() - taps) / orig + 1;
        let target = (new * self.samples.len()).div_ceil(orig);
        let mut samples = Vec::with_capacity(target);
        'out: for k in 0..frames {
            let window = &x[k * orig..k * orig + taps];
            for kernel in &kernels {
                if samples.len() == target {
                    break 'out;
                }
                samples.push(kernel.iter().zip(window).map(|(a, b)| a * b).sum::<f64>() as f32);
            }
        }
        Ok(Recording { samples, sample_rate: rate })
    }
}

/// torchaudio's `_get_sinc_resample_kernel` (method `sinc_interp_hann`, lowpass_filter_width 6,
/// rolloff 0.99) for rates reduced by their gcd: `new` kernels of `2 · width + orig` taps, and width.
fn sinc_hann_kernels(orig: usize, new: usize) -> (Vec<Vec<f64>>, usize) {
    const ZEROS: f64 = 6.0;
    const ROLLOFF: f64 = 0.99;
    let base = orig.min(new) as f64 * ROLLOFF;
    let width = (ZEROS * orig as f64 / base).ceil() as usize;
    let scale = base / orig as f64;
    let kernels = (0..new)
        .map(|j| {
            (0..2 * width + orig)
                .map(|i| {
                    let idx = (i as f64 - width as f64) / orig as f64;
                    let t = ((-(j as f64) / new as f64 + idx) * base).clamp(-ZEROS, ZEROS);
                    let window = (t * std::f64::consts::PI / ZEROS / 2.0).cos().powi(2);
                    let t = t * std::f64::consts::PI;
                    let sinc = if t == 0.0 { 1.0 } else { t.sin() / t };
                    sinc * window * scale
                })
                .collect()
        })
        .collect();
    (kernels, width)
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a.max(1)
    } else {
        gcd(b, a % b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sine(freq: f64, rate: u32, seconds: f64, amplitude: f32) -> Vec<f32> {
        (0..(seconds * f64::from(rate)) as usize).map(|i| amplitude * (2.0 * std::f64::consts::PI * freq * i as f64 / f64::from(rate)).sin() as f32).collect()
    }

    /// A PCM16 WAV of interleaved `channels`.
    fn wav(samples: &[f32], rate: u32, channels: u16) -> Vec<u8> {
        let data: Vec<u8> = samples.iter().flat_map(|s| ((s.clamp(-1.0, 1.0) * 32767.0) as i16).to_le_bytes()).collect();
        let mut out = Vec::new();
        out.extend(b"RIFF");
        out.extend((36 + data.len() as u32).to_le_bytes());
        out.extend(b"WAVEfmt ");
        out.extend(16u32.to_le_bytes());
        out.extend(1u16.to_le_bytes());
        out.extend(channels.to_le_bytes());
        out.extend(rate.to_le_bytes());
        out.extend((rate * 2 * u32::from(channels)).to_le_bytes());
        out.extend((2 * channels).to_le_bytes());
        out.extend(16u16.to_le_bytes());
        out.extend(b"data");
        out.extend((data.len() as u32).to_le_bytes());
        out.extend(data);
        out
    }

    #[test]
    fn a_stereo_wav_is_decoded_and_down_mixed_to_the_mean_of_its_channels() {
        let left = sine(220.0, 24_000, 2.0, 0.5);
        let right = sine(330.0, 24_000, 2.0, 0.25);
        let interleaved: Vec<f32> = left.iter().zip(&right).flat_map(|(l, r)| [*l, *r]).collect();
        let rec = Recording::decode(wav(&interleaved, 24_000, 2), Some("wav")).unwrap();
        assert_eq!((rec.sample_rate, rec.samples.len()), (24_000, 48_000));
        for (i, s) in rec.samples.iter().enumerate() {
            assert!((s - (left[i] + right[i]) / 2.0).abs() < 2.0 / 32767.0, "sample {i}");
        }
        rec.check_prompt().unwrap();
    }

    #[test]
    fn resampling_keeps_the_tone_and_the_timing() {
        // A 1 kHz tone at 24 kHz → 16 kHz equals the tone sampled at 16 kHz (edges aside).
        let rec = Recording { samples: sine(1000.0, 24_000, 2.0, 0.5), sample_rate: 24_000 };
        let down = rec.resampled(16_000).unwrap();
        assert_eq!((down.sample_rate, down.samples.len()), (16_000, 32_000));
        let want = sine(1000.0, 16_000, 2.0, 0.5);
        let worst = down.samples[400..31_600].iter().zip(&want[400..31_600]).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(worst < 5e-3, "worst error {worst}");
        assert_eq!(rec.resampled(24_000).unwrap(), rec, "no-op at the same rate");
    }

    #[test]
    fn what_cannot_be_a_prompt_is_refused_with_the_reason() {
        let e = Recording::decode(b"not audio at all, just some text".to_vec(), Some("wav")).unwrap_err();
        assert!(matches!(e, RecordingError::NotAudio(_)), "{e}");
        let short = Recording::decode(wav(&sine(200.0, 16_000, 0.5, 0.5), 16_000, 1), None).unwrap();
        assert!(matches!(short.check_prompt(), Err(RecordingError::TooShort { .. })));
        let long = Recording { samples: sine(200.0, 16_000, 31.0, 0.5), sample_rate: 16_000 };
        let e = long.check_prompt().unwrap_err();
        assert!(e.to_string().contains("at most 30"), "{e}");
        let silence = Recording { samples: vec![0.0; 32_000], sample_rate: 16_000 };
        assert!(matches!(silence.check_prompt(), Err(RecordingError::Silence { .. })));
        let hiss = Recording { samples: sine(200.0, 16_000, 2.0, 0.001), sample_rate: 16_000 };
        assert!(matches!(hiss.check_prompt(), Err(RecordingError::Silence { .. })), "−60 dBFS is silence");
        // A truncated file decodes what it holds or says it is unreadable; it never panics.
        let mut cut = wav(&sine(200.0, 16_000, 2.0, 0.5), 16_000, 1);
        cut.truncate(30);
        assert!(Recording::decode(cut, Some("wav")).is_err());
    }
}
