//! Output formats through the whole worker (issue 17): a job asking for FLAC is stored as
//! `<job_id>.flac` whose bytes the reference decoder (Debian's `flac`, which bootstrap installs)
//! turns back into the very samples the WAV of the same text holds; MP3 and Opus jobs are stored
//! as `.mp3` / `.opus` that an independent decoder (ffmpeg's own, not LAME or libopus) turns into
//! audio of the WAV's duration and level; jobs without `format` get `[output] format`; an unknown
//! format is refused with its reason.

use crate::common;

use common::TestEnv;
use voxbatch::audio::OutputFormat;
use voxbatch::job::Job;

/// The 16-bit samples of a FLAC file, by the reference decoder.
fn decode_flac(bytes: &[u8]) -> Vec<i16> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.flac");
    std::fs::write(&path, bytes).unwrap();
    let out = std::process::Command::new("flac")
        .args(["-d", "-s", "-c", "--force-raw-format", "--endian=little", "--sign=signed"])
        .arg(&path)
        .output()
        .expect("the reference FLAC decoder (Debian package flac; scripts/bootstrap.sh installs it)");
    assert!(out.status.success(), "flac -d: {}", String::from_utf8_lossy(&out.stderr));
    out.stdout.chunks(2).map(|c| i16::from_le_bytes([c[0], c[1]])).collect()
}

/// The 16-bit samples of any audio file, by ffmpeg's decoders, at 24 kHz mono (Opus decodes at
/// 48 kHz: ffmpeg resamples).
fn decode_ffmpeg(bytes: &[u8], ext: &str) -> Vec<i16> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(format!("a.{ext}"));
    std::fs::write(&path, bytes).unwrap();
    let out = std::process::Command::new("ffmpeg")
        .args(["-v", "error", "-i"])
        .arg(&path)
        .args(["-f", "s16le", "-ac", "1", "-ar", "24000", "-"])
        .output()
        .expect("ffmpeg (Debian package ffmpeg; scripts/bootstrap.sh installs it)");
    assert!(out.status.success(), "ffmpeg -i a.{ext}: {}", String::from_utf8_lossy(&out.stderr));
    out.stdout.chunks(2).map(|c| i16::from_le_bytes([c[0], c[1]])).collect()
}

/// The level (RMS) of `x` between 50 Hz and 7 kHz at 24 kHz: the speech band. Outside it the
/// codecs change the signal by design — Opus's encoder rejects DC and both low-pass near
/// Nyquist at speech bitrates — and the reference model's random weights put most of their
/// output exactly there (DC, and 11–12 kHz), so a whole-band level would measure the band limits.
fn speech_band_rms(x: &[i16]) -> f64 {
    let n = x.len();
    let mut input: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
    let fft = realfft::RealFftPlanner::<f64>::new().plan_fft_forward(n);
    let mut spectrum = fft.make_output_vec();
    fft.process(&mut input, &mut spectrum).expect("fft");
    let hz = |k: usize| k as f64 * 24000.0 / n as f64;
    // Parseval over the one-sided spectrum (every bin in the band is neither DC nor Nyquist).
    let energy: f64 = spectrum.iter().enumerate().filter(|(k, _)| (50.0..7000.0).contains(&hz(*k))).map(|(_, c)| 2.0 * c.norm_sqr()).sum();
    (energy / (n as f64 * n as f64)).sqrt()
}

/// The samples of a 16-bit PCM WAV file.
fn wav_samples(bytes: &[u8]) -> Vec<i16> {
    let info = voxbatch::audio::parse_wav_header(bytes).expect("a PCM WAV");
    assert_eq!((info.channels, info.bits_per_sample), (1, 16));
    bytes[44..].chunks(2).map(|c| i16::from_le_bytes([c[0], c[1]])).collect()
}

#[tokio::test]
async fn each_format_is_stored_under_its_extension_and_decodes_to_the_wavs_duration_and_level_and_an_unknown_format_is_refused() {
    let env = TestEnv::new("output_formats").await;
    let text = "the same sentence twice";
    let flac = Job { format: Some(OutputFormat::Flac), ..Job::new(text) };
    let mp3 = Job { format: Some(OutputFormat::Mp3), ..Job::new(text) };
    let opus = Job { format: Some(OutputFormat::Opus), ..Job::new(text) };
    let wav = Job::new(text);
    env.publish(&[flac.clone(), mp3.clone(), opus.clone(), wav.clone()]).await;
    let bad = format!(r#"{{"job_id":"{}","text":"x","format":"ogg"}}"#, uuid::Uuid::new_v4());
    env.publish_raw(&[bad.as_bytes()]).await;
    env.drain().await;

    let key = |job: &Job, ext: &str| format!("{}default/{}.{ext}", env.key_prefix(), job.job_id);
    let (flac_bytes, flac_meta) = env.storage.get(&key(&flac, "flac")).await.expect("the FLAC job's object is <job_id>.flac");
    let (wav_bytes, _) = env.storage.get(&key(&wav, "wav")).await.expect("a job without format gets [output] format: wav");
    assert!(flac_bytes.starts_with(b"fLaC"));
    let sha: String = sqlx::query_scalar("SELECT audio_sha256 FROM jobs WHERE job_id = $1").bind(flac.job_id).fetch_one(env.db.pool()).await.unwrap();
    use sha2::Digest;
    assert_eq!(sha, hex::encode(sha2::Sha256::digest(&flac_bytes)), "sha256 is of the stored bytes");
    assert_eq!(flac_meta.get("sha256"), Some(&sha));
    let (from_flac, from_wav) = (decode_flac(&flac_bytes), wav_samples(&wav_bytes));
    assert!(!from_wav.is_empty() && from_flac == from_wav, "same duration and level: lossless ({} vs {} samples)", from_flac.len(), from_wav.len());

    // Lossy formats at the default bitrates: an independent decoder gives the WAV's duration (to a
    // millisecond) and its level in the speech band (within 1 dB); the Content-Type says what it is.
    for (job, ext, content_type) in [(&mp3, "mp3", "audio/mpeg"), (&opus, "opus", "audio/ogg; codecs=opus")] {
        let (bytes, meta) = env.storage.get(&key(job, ext)).await.unwrap_or_else(|e| panic!("the {ext} job's object is <job_id>.{ext}: {e}"));
        assert!(bytes.len() < wav_bytes.len() / 2, "{ext}: {} bytes vs the WAV's {}", bytes.len(), wav_bytes.len());
        assert_eq!(meta.get("content-type").map(String::as_str), Some(content_type), "{ext}: Content-Type");
        let decoded = decode_ffmpeg(&bytes, ext);
        let diff = (decoded.len() as i64 - from_wav.len() as i64).abs();
        assert!(diff <= 24, "{ext}: {} samples decoded for the WAV's {}", decoded.len(), from_wav.len());
        let db = 20.0 * (speech_band_rms(&decoded) / speech_band_rms(&from_wav)).log10();
        assert!(db.abs() < 1.0, "{ext}: level {db:.2} dB from the WAV's");
        let sha: String = sqlx::query_scalar("SELECT audio_sha256 FROM jobs WHERE job_id = $1").bind(job.job_id).fetch_one(env.db.pool()).await.unwrap();
        assert_eq!(sha, hex::encode(sha2::Sha256::digest(&bytes)), "{ext}: sha256 is of the stored bytes");
    }

    let reason: String = sqlx::query_scalar("SELECT reason FROM rejections WHERE code = 'invalid_field'").fetch_one(env.db.pool()).await.unwrap();
    assert!(reason.contains("ogg") && reason.contains("flac"), "{reason}");
    env.cleanup().await;
}
