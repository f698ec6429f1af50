//! WAV (RIFF, PCM 16-bit, mono): the default container, and the one every other format falls
//! back to. Also parses the canonical header back, for checks.
//!
//! Neighbours: `audio` (the format switch) calls [`encode_wav`]; tests and `voice add` read
//! headers with [`parse_wav_header`].

use super::pcm16;

/// Encodes `samples` as 16-bit PCM mono WAV at `sample_rate`. Values outside [-1, 1] are clipped;
/// NaN becomes silence.
pub fn encode_wav(samples: &[f32], sample_rate: u32) -> Vec<u8> {
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
    for s in pcm16(samples) {
        wav.extend_from_slice(&s.to_le_bytes());
    }
    wav
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
    fn wav_header_is_pcm16_mono_at_the_model_rate() {
        let bytes = encode_wav(&[0.0, 0.5, -1.0, 2.0, f32::NAN], 24000);
        assert_eq!(bytes.len(), 44 + 10);
        let info = parse_wav_header(&bytes).unwrap();
        assert_eq!(info, WavInfo { sample_rate: 24000, channels: 1, bits_per_sample: 16, samples: 5 });
        let s: Vec<i16> = bytes[44..].chunks(2).map(|c| i16::from_le_bytes([c[0], c[1]])).collect();
        assert_eq!(s, vec![0, 16384, -32767, 32767, 0]);
    }
}
