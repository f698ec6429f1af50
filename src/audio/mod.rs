//! Encoding: a waveform of f32 samples in [-1, 1] → an audio file in the job's output format —
//! WAV (PCM 16-bit mono), FLAC (lossless, pure Rust), MP3 (LAME) or Opus in Ogg (libopus) — and
//! the sha256 of the stored bytes, spread over OS threads off the async runtime.
//!
//! Files: `wav`, `flac`, `mp3`, `opus` (one per format); `codec_library` opens the reference C
//! libraries MP3 and Opus need at run time; `waveform` is a job's samples as the model hands them
//! over (pieces in order, joined on the encoder's thread).
//!
//! Neighbours: `model` produces the [`Waveform`]s; `worker::commit` calls [`encode_batch`]; `storage`
//! uploads the bytes under a key whose extension and Content-Type come from [`OutputFormat`].

mod codec_library;
mod flac;
mod mp3;
mod opus;
mod wav;
mod waveform;

use sha2::{Digest, Sha256};

pub use codec_library::CodecUnavailable;
pub use wav::{parse_wav_header, WavInfo};
pub use waveform::Waveform;

/// The file format a job's audio is stored in (`[output] format`, or the job's `format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OutputFormat {
    #[default]
    Wav,
    Flac,
    Mp3,
    Opus,
}

impl OutputFormat {
    /// Every format, as jobs and the config name them.
    pub const NAMES: &'static str = "wav, flac, mp3, opus";
    pub const ALL: [OutputFormat; 4] = [OutputFormat::Wav, OutputFormat::Flac, OutputFormat::Mp3, OutputFormat::Opus];

    /// The format's name in jobs and config, which is also the object key's extension.
    pub fn extension(self) -> &'static str {
        match self {
            OutputFormat::Wav => "wav",
            OutputFormat::Flac => "flac",
            OutputFormat::Mp3 => "mp3",
            OutputFormat::Opus => "opus",
        }
    }

    /// The object's Content-Type.
    pub fn content_type(self) -> &'static str {
        match self {
            OutputFormat::Wav => "audio/wav",
            OutputFormat::Flac => "audio/flac",
            OutputFormat::Mp3 => "audio/mpeg",
            OutputFormat::Opus => "audio/ogg; codecs=opus",
        }
    }

    /// Whether this host can write the format at `sample_rate`: the reason if not (a codec
    /// library missing, a rate the codec does not take). The worker checks `[output] format` at
    /// start and warns about the others.
    pub fn check(self, sample_rate: u32) -> Result<(), EncodeError> {
        match self {
            OutputFormat::Wav | OutputFormat::Flac => Ok(()),
            OutputFormat::Mp3 => mp3::available().map_err(EncodeError::Unavailable),
            OutputFormat::Opus => {
                opus::check_rate(sample_rate)?;
                opus::available().map_err(EncodeError::Unavailable)
            }
        }
    }
}

impl std::str::FromStr for OutputFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        OutputFormat::ALL
            .into_iter()
            .find(|f| f.extension() == s)
            .ok_or_else(|| format!("unknown audio format {s:?} (supported: {})", OutputFormat::NAMES))
    }
}

/// The lossy codecs' settings (`[output] mp3_kbps`, `opus_kbps`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bitrates {
    pub mp3_kbps: u32,
    pub opus_kbps: u32,
}

impl Default for Bitrates {
    fn default() -> Self {
        Bitrates { mp3_kbps: 64, opus_kbps: 32 }
    }
}

/// Why a file of the asked format could not be made (the audio is then stored as WAV).
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum EncodeError {
    #[error(transparent)]
    Unavailable(CodecUnavailable),
    #[error("{format} encoding failed: {reason}")]
    Codec { format: &'static str, reason: String },
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

/// Encodes `samples` in `format`. A file that cannot be made (a codec library missing on this
/// host, a codec error) is logged and stored as WAV instead — its key and Content-Type say so:
/// the job's audio is never lost to its container.
pub fn encode(samples: &[f32], sample_rate: u32, format: OutputFormat, bitrates: Bitrates) -> EncodedAudio {
    let made = match format {
        OutputFormat::Wav => Ok(wav::encode_wav(samples, sample_rate)),
        OutputFormat::Flac => flac::encode_flac(samples, sample_rate).map_err(|reason| EncodeError::Codec { format: "flac", reason }),
        OutputFormat::Mp3 => mp3::encode_mp3(samples, sample_rate, bitrates.mp3_kbps),
        OutputFormat::Opus => opus::encode_opus(samples, sample_rate, bitrates.opus_kbps),
    };
    let (bytes, format) = match made {
        Ok(bytes) => (bytes, format),
        Err(e) => {
            tracing::error!(error = %e, format = format.extension(), "encoding failed; storing WAV");
            (wav::encode_wav(samples, sample_rate), OutputFormat::Wav)
        }
    };
    let sha256 = hex::encode(Sha256::digest(&bytes));
    EncodedAudio { bytes, format, sha256, seconds: samples.len() as f64 / f64::from(sample_rate) }
}

/// [`encode`] as WAV.
pub fn encode_wav(samples: &[f32], sample_rate: u32) -> EncodedAudio {
    encode(samples, sample_rate, OutputFormat::Wav, Bitrates::default())
}

/// A sample as every format stores it: clipped to [-1, 1], NaN as silence.
fn clipped(s: f32) -> f32 {
    if s.is_nan() {
        0.0
    } else {
        s.clamp(-1.0, 1.0)
    }
}

/// 16-bit PCM values of `samples` ([`clipped`]).
fn pcm16(samples: &[f32]) -> impl Iterator<Item = i16> + '_ {
    samples.iter().map(|&s| (clipped(s) * 32767.0).round() as i16)
}

/// [`encode`] for many waveforms, each joined and encoded in its format, spread over up to
/// `threads` OS threads (a batch of a few thousand seconds of audio takes about a second on one
/// core: enough to stall the GPU).
pub fn encode_batch(audio: &[(Waveform, OutputFormat)], sample_rate: u32, bitrates: Bitrates, threads: usize) -> Vec<EncodedAudio> {
    let threads = threads.clamp(1, audio.len().max(1));
    let one = |(a, f): &(Waveform, OutputFormat)| encode(&a.joined(), sample_rate, *f, bitrates);
    if threads == 1 {
        return audio.iter().map(one).collect();
    }
    // Contiguous runs of roughly equal sample counts, one per thread.
    let total: usize = audio.iter().map(|(a, _)| a.len()).sum();
    let per_thread = total.div_ceil(threads).max(1);
    let mut runs: Vec<&[(Waveform, OutputFormat)]> = Vec::with_capacity(threads);
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
            .map(|run| scope.spawn(move || run.iter().map(one).collect::<Vec<_>>()))
            .collect();
        // A panic in a thread (none is expected: encoding cannot fail) propagates to the caller.
        handles.into_iter().flat_map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))).collect()
    })
}

/// Decodes a file with symphonia (the reader `voice add` uses): its sample rate and samples
/// (gapless: an MP3's encoder delay and padding trimmed). For the formats' tests.
#[cfg(test)]
pub(crate) fn decode_with_symphonia(bytes: Vec<u8>) -> (Option<u32>, Vec<f32>) {
    use symphonia::core::audio::SampleBuffer;
    use symphonia::core::io::MediaSourceStream;
    let mss = MediaSourceStream::new(Box::new(std::io::Cursor::new(bytes)), Default::default());
    let opts = symphonia::core::formats::FormatOptions { enable_gapless: true, ..Default::default() };
    let mut reader = symphonia::default::get_probe().format(&Default::default(), mss, &opts, &Default::default()).unwrap().format;
    let track = reader.default_track().unwrap().clone();
    let mut decoder = symphonia::default::get_codecs().make(&track.codec_params, &Default::default()).unwrap();
    let mut decoded = Vec::new();
    while let Ok(packet) = reader.next_packet() {
        let buf = decoder.decode(&packet).unwrap();
        let mut out = SampleBuffer::<f32>::new(buf.capacity() as u64, *buf.spec());
        out.copy_interleaved_ref(buf);
        decoded.extend_from_slice(out.samples());
    }
    (track.codec_params.sample_rate, decoded)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parallel_encoding_gives_the_same_files_in_order() {
        // Odd items in two pieces: joined as one.
        let audio: Vec<(Waveform, OutputFormat)> = (0..23)
            .map(|i| {
                let samples: Vec<f32> = (0..(i * 997 % 5000)).map(|n| ((n * (i + 1)) as f32 * 0.001).sin()).collect();
                let w = match i % 2 {
                    0 => Waveform::from(samples),
                    _ => Waveform::from_pieces(vec![samples[..samples.len() / 3].to_vec(), samples[samples.len() / 3..].to_vec()]),
                };
                (w, OutputFormat::ALL[i % 4])
            })
            .collect();
        let bitrates = Bitrates::default();
        let serial: Vec<String> = audio.iter().map(|(a, f)| encode(&a.clone().into_samples(), 24000, *f, bitrates).sha256).collect();
        for threads in [1, 2, 7, 64] {
            let parallel: Vec<EncodedAudio> = encode_batch(&audio, 24000, bitrates, threads);
            assert_eq!(parallel.iter().map(|e| e.sha256.clone()).collect::<Vec<_>>(), serial, "{threads} threads");
            assert!(parallel.iter().zip(&audio).all(|(e, (_, f))| e.format == *f), "each in its own format");
        }
        assert!(encode_batch(&[], 24000, bitrates, 8).is_empty());
    }

    #[test]
    fn a_format_that_cannot_be_made_is_stored_as_wav_and_says_so() {
        // libopus takes no 22,050 Hz input: the audio survives as WAV, keyed and typed as WAV.
        let samples = vec![0.25f32; 2205];
        let e = encode(&samples, 22050, OutputFormat::Opus, Bitrates::default());
        assert_eq!(e.format, OutputFormat::Wav);
        assert_eq!(parse_wav_header(&e.bytes).map(|h| h.samples), Some(2205));
        assert!(OutputFormat::Opus.check(22050).is_err() && OutputFormat::Flac.check(22050).is_ok());
    }

    #[test]
    fn formats_parse_from_their_names_and_unknown_ones_list_the_supported() {
        for f in OutputFormat::ALL {
            assert_eq!(f.extension().parse::<OutputFormat>(), Ok(f));
        }
        let err = "ogg".parse::<OutputFormat>().unwrap_err();
        assert!(err.contains("ogg") && err.contains("mp3, opus"), "{err}");
    }
}
