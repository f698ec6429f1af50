//! Output formats through the whole worker (issue 17): a job asking for FLAC is stored as
//! `<job_id>.flac` whose bytes the reference decoder (Debian's `flac`, which bootstrap installs)
//! turns back into the very samples the WAV of the same text holds; jobs without `format` get
//! `[output] format`; an unknown format is refused with its reason.

mod common;

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

/// The samples of a 16-bit PCM WAV file.
fn wav_samples(bytes: &[u8]) -> Vec<i16> {
    let info = voxbatch::audio::parse_wav_header(bytes).expect("a PCM WAV");
    assert_eq!((info.channels, info.bits_per_sample), (1, 16));
    bytes[44..].chunks(2).map(|c| i16::from_le_bytes([c[0], c[1]])).collect()
}

#[tokio::test]
async fn a_flac_job_is_stored_as_flac_that_decodes_to_the_wavs_samples_and_an_unknown_format_is_refused() {
    let env = TestEnv::new("output_formats").await;
    let text = "the same sentence twice";
    let flac = Job { format: Some(OutputFormat::Flac), ..Job::new(text) };
    let wav = Job::new(text);
    env.publish(&[flac.clone(), wav.clone()]).await;
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

    let reason: String = sqlx::query_scalar("SELECT reason FROM rejections WHERE code = 'invalid_field'").fetch_one(env.db.pool()).await.unwrap();
    assert!(reason.contains("ogg") && reason.contains("flac"), "{reason}");
    env.cleanup().await;
}
