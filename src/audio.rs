//! Encoding: a waveform of f32 samples in [-1, 1] → a WAV file (RIFF, PCM 16-bit, mono) and its
//! sha256.
//!
//! Neighbours: `model` produces the samples; `storage` uploads the bytes.

use sha2::{Digest, Sha256};

/// An encoded audio file.
#[derive(Debug, Clone)]
pub struct EncodedAudio {
    pub wav: Vec<u8>,
    /// Lower-case hex sha256 of `wav`.
    pub sha256: String,
    pub seconds: f64,
}

/// Encodes `samples` as 16-bit PCM mono WAV at `sample_rate`. Values outside [-1, 1] are clipped;
/// NaN becomes silence.
pub fn encode_wav(samples: &[f32], sample_rate: u32) -> EncodedAudio {
    let data_len = (samples.len() * 2) as u32;
    let mut wav = Vec::with_capacity(44 + samples.len() * 2);
    wav.extend_from_slice(b"RIFF");
    wav.extend_from_slice(&(36 + data_len).to_le_bytes());
    wav.extend_from_slice(b"WAVE");
    wav.extend_from_slice(b"fmt ");
    wav.extend_from_slice(&16u32.to_le_bytes()); // fmt chunk size
    wav.extend_from_slice(&1u16.to_le_bytes()); // PCM
    wav.extend_from_slice(&1u16.to_le_bytes()); // mono
    wav.extend_from_slice(&sample_rate.to_le_bytes());
    wav.extend_from_slice(&(sample_rate * 2).to_le_bytes()); // byte rate
    wav.extend_from_slice(&2u16.to_le_bytes()); // block align
    wav.extend_from_slice(&16u16.to_le_bytes()); // bits per sample
    wav.extend_from_slice(b"data");
    wav.extend_from_slice(&data_len.to_le_bytes());
    for &s in samples {
        let s = if s.is_nan() { 0.0 } else { s.clamp(-1.0, 1.0) };
        wav.extend_from_slice(&((s * 32767.0).round() as i16).to_le_bytes());
    }
    let sha256 = hex::encode(Sha256::digest(&wav));
    EncodedAudio { wav, sha256, seconds: samples.len() as f64 / f64::from(sample_rate) }
}

/// [`encode_wav`] for many waveforms, spread over up to `threads` OS threads (a batch of a few
/// thousand seconds of audio takes about a second on one core: enough to stall the GPU).
pub fn encode_wavs(audio: &[Vec<f32>], sample_rate: u32, threads: usize) -> Vec<EncodedAudio> {
    let threads = threads.clamp(1, audio.len().max(1));
    if threads == 1 {
        return audio.iter().map(|a| encode_wav(a, sample_rate)).collect();
    }
    // Contiguous runs of roughly equal sample counts, one per thread.
    let total: usize = audio.iter().map(Vec::len).sum();
    let per_thread = total.div_ceil(threads).max(1);
    let mut runs: Vec<&[Vec<f32>]> = Vec::with_capacity(threads);
    let (mut start, mut acc) = (0, 0);
    for (i, a) in audio.iter().enumerate() {
        acc += a.len();
        if acc >= per_thread {
            runs.push(&audio[start..=i]);
            (start, acc) = (i + 1, 0);
        }
    }
    if start < audio.len() {
        runs.push(&audio[start..]);
    }
    std::thread::scope(|scope| {
        let handles: Vec<_> = runs
            .into_iter()
            .map(|run| scope.spawn(move || run.iter().map(|a| encode_wav(a, sample_rate)).collect::<Vec<_>>()))
            .collect();
        // A panic in a thread (none is expected: encoding cannot fail) propagates to the caller.
        handles.into_iter().flat_map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))).collect()
    })
}

/// Header fields of a PCM WAV file, for checks.
#[derive(Debug, PartialEq, Eq)]
pub struct WavInfo {
    pub sample_rate: u32,
    pub channels: u16,
    pub bits_per_sample: u16,
    pub samples: u32,
}

/// Parses the canonical 44-byte header written by [`encode_wav`]; `None` if it is not one.
pub fn parse_wav_header(wav: &[u8]) -> Option<WavInfo> {
    if wav.len() < 44 || &wav[0..4] != b"RIFF" || &wav[8..12] != b"WAVE" || &wav[12..16] != b"fmt " || &wav[36..40] != b"data" {
        return None;
    }
    let u16_at = |i: usize| u16::from_le_bytes([wav[i], wav[i + 1]]);
    let u32_at = |i: usize| u32::from_le_bytes([wav[i], wav[i + 1], wav[i + 2], wav[i + 3]]);
    let (channels, bits) = (u16_at(22), u16_at(34));
    let data_len = u32_at(40);
    if u16_at(20) != 1 || channels == 0 || bits == 0 || u32_at(4) != 36 + data_len || wav.len() != 44 + data_len as usize {
        return None;
    }
    Some(WavInfo {
        sample_rate: u32_at(24),
        channels,
        bits_per_sample: bits,
        samples: data_len / (u32::from(channels) * u32::from(bits / 8)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parallel_encoding_gives_the_same_files_in_order() {
        let audio: Vec<Vec<f32>> = (0..23).map(|i| (0..(i * 997 % 5000)).map(|n| ((n * (i + 1)) as f32 * 0.001).sin()).collect()).collect();
        let serial: Vec<String> = audio.iter().map(|a| encode_wav(a, 24000).sha256).collect();
        for threads in [1, 2, 7, 64] {
            let parallel: Vec<String> = encode_wavs(&audio, 24000, threads).into_iter().map(|e| e.sha256).collect();
            assert_eq!(parallel, serial, "{threads} threads");
        }
        assert!(encode_wavs(&[], 24000, 8).is_empty());
    }

    #[test]
    fn wav_header_is_pcm16_mono_at_the_model_rate() {
        let a = encode_wav(&[0.0, 0.5, -1.0, 2.0, f32::NAN], 24000);
        assert_eq!(a.wav.len(), 44 + 10);
        let info = parse_wav_header(&a.wav).unwrap();
        assert_eq!(info, WavInfo { sample_rate: 24000, channels: 1, bits_per_sample: 16, samples: 5 });
        let s: Vec<i16> = a.wav[44..].chunks(2).map(|c| i16::from_le_bytes([c[0], c[1]])).collect();
        assert_eq!(s, vec![0, 16384, -32767, 32767, 0]);
        assert_eq!(a.sha256.len(), 64);
        assert!((a.seconds - 5.0 / 24000.0).abs() < 1e-12);
    }
}
