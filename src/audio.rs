//! Encoding: a waveform of f32 samples in [-1, 1] → an audio file in the job's output format —
//! WAV (RIFF, PCM 16-bit, mono) or FLAC (16-bit mono, lossless; `flacenc`, pure Rust) — and the
//! sha256 of the stored bytes.
//!
//! Neighbours: `model` produces the samples; `storage` uploads the bytes under a key whose
//! extension and Content-Type come from [`OutputFormat`].

use sha2::{Digest, Sha256};

/// The file format a job's audio is stored in (`[output] format`, or the job's `format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OutputFormat {
    #[default]
    Wav,
    Flac,
}

impl OutputFormat {
    /// Every format, as jobs and the config name them.
    pub const NAMES: &'static str = "wav, flac";

    /// The object key's extension.
    pub fn extension(self) -> &'static str {
        match self {
            OutputFormat::Wav => "wav",
            OutputFormat::Flac => "flac",
        }
    }

    /// The object's Content-Type.
    pub fn content_type(self) -> &'static str {
        match self {
            OutputFormat::Wav => "audio/wav",
            OutputFormat::Flac => "audio/flac",
        }
    }
}

impl std::str::FromStr for OutputFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "wav" => Ok(OutputFormat::Wav),
            "flac" => Ok(OutputFormat::Flac),
            other => Err(format!("unknown audio format {other:?} (supported: {})", OutputFormat::NAMES)),
        }
    }
}

/// An encoded audio file.
#[derive(Debug, Clone)]
pub struct EncodedAudio {
    pub bytes: Vec<u8>,
    /// What `bytes` are (the format asked for, or WAV where that could not be made).
    pub format: OutputFormat,
    /// Lower-case hex sha256 of `bytes`.
    pub sha256: String,
    pub seconds: f64,
}

/// Encodes `samples` in `format`. FLAC that cannot be made (not expected for 16-bit mono) is
/// logged and stored as WAV instead: the job's audio is never lost to its container.
pub fn encode(samples: &[f32], sample_rate: u32, format: OutputFormat) -> EncodedAudio {
    match format {
        OutputFormat::Wav => encode_wav(samples, sample_rate),
        OutputFormat::Flac => match encode_flac(samples, sample_rate) {
            Ok(bytes) => {
                let sha256 = hex::encode(Sha256::digest(&bytes));
                EncodedAudio { bytes, format, sha256, seconds: samples.len() as f64 / f64::from(sample_rate) }
            }
            Err(reason) => {
                tracing::error!(reason, "FLAC encoding failed; storing WAV");
                encode_wav(samples, sample_rate)
            }
        },
    }
}

/// 16-bit PCM values of `samples` (clipped to [-1, 1]; NaN is silence).
fn pcm16(samples: &[f32]) -> impl Iterator<Item = i16> + '_ {
    samples.iter().map(|&s| {
        let s = if s.is_nan() { 0.0 } else { s.clamp(-1.0, 1.0) };
        (s * 32767.0).round() as i16
    })
}

fn encode_flac(samples: &[f32], sample_rate: u32) -> Result<Vec<u8>, String> {
    use flacenc::component::BitRepr;
    use flacenc::error::Verify;
    let pcm: Vec<i32> = pcm16(samples).map(i32::from).collect();
    let config = flacenc::config::Encoder::default().into_verified().map_err(|(_, e)| format!("{e:?}"))?;
    let source = flacenc::source::MemSource::from_samples(&pcm, 1, 16, sample_rate as usize);
    let stream = flacenc::encode_with_fixed_block_size(&config, source, config.block_size).map_err(|e| format!("{e:?}"))?;
    let mut sink = flacenc::bitsink::ByteSink::new();
    stream.write(&mut sink).map_err(|e| format!("{e:?}"))?;
    let mut bytes = sink.as_slice().to_vec();
    // STREAMINFO's minimum block size must exclude the last block (FLAC format); flacenc counts
    // it, which makes strict decoders (symphonia) take the fixed-size stream for a variable-size
    // one and find no frame. Every block but the last has the maximum size: say so.
    if bytes.len() >= 12 && &bytes[..4] == b"fLaC" && bytes[4] & 0x7f == 0 {
        let max = [bytes[10], bytes[11]];
        bytes[8..10].copy_from_slice(&max);
    }
    Ok(bytes)
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
    for s in pcm16(samples) {
        wav.extend_from_slice(&s.to_le_bytes());
    }
    let sha256 = hex::encode(Sha256::digest(&wav));
    EncodedAudio { bytes: wav, format: OutputFormat::Wav, sha256, seconds: samples.len() as f64 / f64::from(sample_rate) }
}

/// [`encode`] for many waveforms, each in its format, spread over up to `threads` OS threads (a
/// batch of a few thousand seconds of audio takes about a second on one core: enough to stall
/// the GPU).
pub fn encode_batch(audio: &[(Vec<f32>, OutputFormat)], sample_rate: u32, threads: usize) -> Vec<EncodedAudio> {
    let threads = threads.clamp(1, audio.len().max(1));
    if threads == 1 {
        return audio.iter().map(|(a, f)| encode(a, sample_rate, *f)).collect();
    }
    // Contiguous runs of roughly equal sample counts, one per thread.
    let total: usize = audio.iter().map(|(a, _)| a.len()).sum();
    let per_thread = total.div_ceil(threads).max(1);
    let mut runs: Vec<&[(Vec<f32>, OutputFormat)]> = Vec::with_capacity(threads);
    let (mut start, mut acc) = (0, 0);
    for (i, (a, _)) in audio.iter().enumerate() {
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
            .map(|run| scope.spawn(move || run.iter().map(|(a, f)| encode(a, sample_rate, *f)).collect::<Vec<_>>()))
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
        let formats = [OutputFormat::Wav, OutputFormat::Flac];
        let audio: Vec<(Vec<f32>, OutputFormat)> = (0..23)
            .map(|i| ((0..(i * 997 % 5000)).map(|n| ((n * (i + 1)) as f32 * 0.001).sin()).collect(), formats[i % 2]))
            .collect();
        let serial: Vec<String> = audio.iter().map(|(a, f)| encode(a, 24000, *f).sha256).collect();
        for threads in [1, 2, 7, 64] {
            let parallel: Vec<EncodedAudio> = encode_batch(&audio, 24000, threads);
            assert_eq!(parallel.iter().map(|e| e.sha256.clone()).collect::<Vec<_>>(), serial, "{threads} threads");
            assert!(parallel.iter().zip(&audio).all(|(e, (_, f))| e.format == *f), "each in its own format");
        }
        assert!(encode_batch(&[], 24000, 8).is_empty());
    }

    #[test]
    fn flac_decodes_to_the_wavs_samples_with_a_strict_decoder() {
        // The reference decoder checks the stored files in tests/output_formats.rs; symphonia (the
        // reader `voice add` uses) is stricter about STREAMINFO.
        use symphonia::core::audio::SampleBuffer;
        use symphonia::core::io::MediaSourceStream;
        for n in [30_000usize, 4096, 1000] {
            let samples: Vec<f32> = (0..n).map(|i| (i as f32 * 0.01).sin() * 0.6).collect();
            let flac = encode(&samples, 24000, OutputFormat::Flac);
            assert_eq!(flac.format, OutputFormat::Flac);
            assert!(flac.bytes.starts_with(b"fLaC"));
            let mss = MediaSourceStream::new(Box::new(std::io::Cursor::new(flac.bytes.clone())), Default::default());
            let probed = symphonia::default::get_probe().format(&Default::default(), mss, &Default::default(), &Default::default()).unwrap();
            let mut reader = probed.format;
            let track = reader.default_track().unwrap().clone();
            assert_eq!(track.codec_params.sample_rate, Some(24000));
            let mut decoder = symphonia::default::get_codecs().make(&track.codec_params, &Default::default()).unwrap();
            let mut decoded: Vec<i16> = Vec::new();
            while let Ok(packet) = reader.next_packet() {
                let buf = decoder.decode(&packet).unwrap();
                let mut out = SampleBuffer::<i16>::new(buf.capacity() as u64, *buf.spec());
                out.copy_interleaved_ref(buf);
                decoded.extend_from_slice(out.samples());
            }
            assert_eq!(decoded, pcm16(&samples).collect::<Vec<_>>(), "{n} samples, lossless");
        }
    }

    #[test]
    fn wav_header_is_pcm16_mono_at_the_model_rate() {
        let a = encode_wav(&[0.0, 0.5, -1.0, 2.0, f32::NAN], 24000);
        assert_eq!(a.bytes.len(), 44 + 10);
        let info = parse_wav_header(&a.bytes).unwrap();
        assert_eq!(info, WavInfo { sample_rate: 24000, channels: 1, bits_per_sample: 16, samples: 5 });
        let s: Vec<i16> = a.bytes[44..].chunks(2).map(|c| i16::from_le_bytes([c[0], c[1]])).collect();
        assert_eq!(s, vec![0, 16384, -32767, 32767, 0]);
        assert_eq!(a.sha256.len(), 64);
        assert!((a.seconds - 5.0 / 24000.0).abs() < 1e-12);
    }
}
