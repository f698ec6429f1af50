//! The spool: finished, encoded audio of jobs given back, kept on local disk so that an outage
//! does not cost GPU work twice.
//!
//! When the commit stage gives a batch back after encoding it (an upload or a record failing past
//! `worker.max_hold`, a stop mid-commit), each job's encoded audio is written here with its share
//! of the GPU time that made it. When the job is claimed again, the inference stage looks here
//! first: an entry made for the same job content goes to the commit stage as it is, without the
//! model. An entry is named by the job's id and a digest of what the job asks ([`Spool::digest`]:
//! text, voice, campaign, speech tokens, speed, mode, instruction, model, and the output format
//! and bitrate the commit stage would use), so a job whose content or output settings differ
//! never takes another's audio. An entry is written to a temporary file and renamed, and its
//! whole file is checked (a trailing sha256) when read: a partial or corrupt one is deleted and
//! the job synthesized again, as it is when the spool lost it (evicted, another host, a wiped
//! disk). The spool holds at most `worker.spool_max_bytes`, oldest entries evicted first; an
//! entry is deleted once its job is committed. Workers of one host may share the directory.
//!
//! Every file operation runs on the blocking pool (`spawn_blocking`), never on the runtime.
//!
//! Neighbours: `commit` keeps entries when it gives a batch back and forgets them once
//! committed; `infer` takes them after a claim; `config::worker` says where and how much.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tracing::{debug, warn};
use uuid::Uuid;

use crate::audio::{Bitrates, EncodedAudio, OutputFormat};
use crate::config::{OutputConfig, WorkerConfig};
use crate::job::Job;

/// The first bytes of an entry (the layout's version).
const MAGIC: &[u8] = b"VXSPOOL1\n";
/// An entry's file name ends so; temporary files start with a dot.
const SUFFIX: &str = ".spool";
/// A temporary file older than this is a crashed writer's: removed when the spool is scanned.
const STALE_TEMP: Duration = Duration::from_secs(3600);

/// One job's finished audio.
#[derive(Debug, Clone)]
pub struct SpoolEntry {
    pub job_id: Uuid,
    /// [`Spool::digest`] of the job it was made for.
    pub digest: String,
    pub audio: EncodedAudio,
    /// The job's share of the device time of the batch that synthesized it (billed by the batch
    /// that commits it).
    pub infer_ms: f64,
}

/// An entry's header, as stored (one JSON line after [`MAGIC`]).
#[derive(Serialize, Deserialize)]
struct Header {
    job_id: Uuid,
    digest: String,
    format: OutputFormat,
    sha256: String,
    seconds: f64,
    infer_ms: f64,
    bytes: u64,
}

/// What a digest covers: everything that decides a job's stored bytes.
#[derive(Serialize)]
struct Recipe<'a> {
    job_id: Uuid,
    model: &'a str,
    campaign: &'a str,
    voice: &'a str,
    text: &'a str,
    speech_tokens: Option<&'a [i64]>,
    speed: Option<f64>,
    mode: Option<crate::job::Mode>,
    instruction: Option<&'a str>,
    format: OutputFormat,
    /// The format's bitrate (kbit/s; lossless formats: none).
    kbps: Option<u32>,
}

/// A worker's spool (a directory, maybe shared with the host's other workers).
#[derive(Debug, Clone)]
pub struct Spool {
    dir: PathBuf,
    max_bytes: u64,
    model: String,
    default_format: OutputFormat,
    bitrates: Bitrates,
}

impl Spool {
    /// The spool `cfg` describes for a worker of `model` writing `output` (nothing is touched on
    /// disk until the first entry is kept).
    pub fn new(cfg: &WorkerConfig, model: &str, output: &OutputConfig) -> Spool {
        Spool { dir: cfg.spool_dir(), max_bytes: cfg.spool_max_bytes, model: model.to_string(), default_format: output.format, bitrates: output.bitrates }
    }

    /// False when `worker.spool_max_bytes` is 0.
    pub fn enabled(&self) -> bool {
        self.max_bytes > 0
    }

    /// The digest (hex sha256) of what `job` asks, as this worker would store it.
    pub fn digest(&self, job: &Job) -> String {
        let format = job.format.unwrap_or(self.default_format);
        let kbps = match format {
            OutputFormat::Mp3 => Some(self.bitrates.mp3_kbps),
            OutputFormat::Opus => Some(self.bitrates.opus_kbps),
            OutputFormat::Wav | OutputFormat::Flac => None,
        };
        let recipe = Recipe {
            job_id: job.job_id,
            model: &self.model,
            campaign: &job.campaign,
            voice: &job.voice,
            text: &job.text,
            speech_tokens: job.speech_tokens.as_deref(),
            speed: job.speed,
            mode: job.mode,
            instruction: job.instruction.as_deref(),
            format,
            kbps,
        };
        let json = serde_json::to_vec(&recipe).expect("a recipe serializes");
        hex::encode(Sha256::digest(&json))
    }

    /// The usable entry of each `(job_id, digest)`, in order (`None`: synthesize it).
    pub async fn take(&self, wanted: Vec<(Uuid, String)>) -> Vec<Option<SpoolEntry>> {
        if !self.enabled() || wanted.is_empty() {
            return wanted.iter().map(|_| None).collect();
        }
        let dir = self.dir.clone();
        let n = wanted.len();
        tokio::task::spawn_blocking(move || wanted.iter().map(|(id, digest)| read_entry(&dir, *id, digest)).collect())
            .await
            .unwrap_or_else(|e| {
                warn!(error = %e, "reading the spool panicked; synthesizing the batch");
                (0..n).map(|_| None).collect()
            })
    }

    /// Keeps `entries` (an entry already there stays as it is), evicting the oldest entries to
    /// stay within the size limit. Best effort: a failure is logged, and the job is synthesized
    /// again when it comes back.
    pub async fn keep(&self, entries: Vec<SpoolEntry>) {
        if !self.enabled() || entries.is_empty() {
            return;
        }
        let (dir, max_bytes) = (self.dir.clone(), self.max_bytes);
        let kept = tokio::task::spawn_blocking(move || keep_entries(&dir, max_bytes, &entries)).await;
        match kept {
            Ok(Ok(n)) => debug!(entries = n, "finished audio kept in the spool"),
            Ok(Err(e)) => warn!(error = %e, "could not keep finished audio in the spool; its jobs will be synthesized again"),
            Err(e) => warn!(error = %e, "keeping finished audio in the spool panicked"),
        }
    }

    /// Deletes the entries of committed jobs (best effort; eviction removes any left).
    pub async fn forget(&self, done: Vec<(Uuid, String)>) {
        if !self.enabled() || done.is_empty() {
            return;
        }
        let dir = self.dir.clone();
        let _ = tokio::task::spawn_blocking(move || {
            for (id, digest) in done {
                match std::fs::remove_file(dir.join(entry_name(id, &digest))) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => warn!(job_id = %id, error = %e, "could not delete a committed job's spool entry; eviction will"),
                }
            }
        })
        .await;
    }
}

fn entry_name(job_id: Uuid, digest: &str) -> String {
    format!("{job_id}.{digest}{SUFFIX}")
}

/// The entry's bytes: magic, header line, audio, sha256 of all before it.
fn encode_entry(e: &SpoolEntry) -> Vec<u8> {
    let header = Header {
        job_id: e.job_id,
        digest: e.digest.clone(),
        format: e.audio.format,
        sha256: e.audio.sha256.clone(),
        seconds: e.audio.seconds,
        infer_ms: e.infer_ms,
        bytes: e.audio.bytes.len() as u64,
    };
    let mut out = Vec::with_capacity(MAGIC.len() + 256 + e.audio.bytes.len() + 32);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&serde_json::to_vec(&header).expect("a header serializes"));
    out.push(b'\n');
    out.extend_from_slice(&e.audio.bytes);
    let check = Sha256::digest(&out);
    out.extend_from_slice(&check);
    out
}

/// Parses and checks an entry's bytes; `None` when anything is off.
fn decode_entry(file: &[u8], job_id: Uuid, digest: &str) -> Option<SpoolEntry> {
    let (body, check) = file.split_at(file.len().checked_sub(32)?);
    if Sha256::digest(body).as_slice() != check {
        return None;
    }
    let rest = body.strip_prefix(MAGIC)?;
    let newline = rest.iter().position(|&b| b == b'\n')?;
    let header: Header = serde_json::from_slice(&rest[..newline]).ok()?;
    let bytes = &rest[newline + 1..];
    if header.job_id != job_id || header.digest != digest || header.bytes != bytes.len() as u64 {
        return None;
    }
    if hex::encode(Sha256::digest(bytes)) != header.sha256 || !header.infer_ms.is_finite() || !header.seconds.is_finite() {
        return None;
    }
    let audio = EncodedAudio { bytes: bytes.to_vec(), format: header.format, sha256: header.sha256, seconds: header.seconds };
    Some(SpoolEntry { job_id, digest: header.digest, audio, infer_ms: header.infer_ms.max(0.0) })
}

/// Blocking: the entry of `job_id` made for `digest`, if there is a sound one (a corrupt one is
/// deleted).
fn read_entry(dir: &Path, job_id: Uuid, digest: &str) -> Option<SpoolEntry> {
    let path = dir.join(entry_name(job_id, digest));
    let file = match std::fs::read(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            warn!(%job_id, error = %e, "could not read a spool entry; synthesizing the job");
            return None;
        }
    };
    let entry = decode_entry(&file, job_id, digest);
    if entry.is_none() {
        warn!(%job_id, path = %path.display(), "a spool entry is corrupt or partial; deleting it and synthesizing the job");
        let _ = std::fs::remove_file(&path);
    }
    entry
}

/// Blocking: writes each entry not yet there (temporary file, then rename), evicting the oldest
/// entries first to stay within `max_bytes`. Returns how many were written.
fn keep_entries(dir: &Path, max_bytes: u64, entries: &[SpoolEntry]) -> std::io::Result<usize> {
    std::fs::create_dir_all(dir)?;
    let mut present = scan(dir)?;
    let mut total: u64 = present.iter().map(|(_, _, size)| size).sum();
    let mut written = 0;
    for e in entries {
        let name = entry_name(e.job_id, &e.digest);
        let path = dir.join(&name);
        if path.exists() {
            continue;
        }
        let bytes = encode_entry(e);
        let size = bytes.len() as u64;
        if size > max_bytes {
            warn!(job_id = %e.job_id, bytes = size, max_bytes, "audio larger than worker.spool_max_bytes is not spooled");
            continue;
        }
        // Oldest first, until the new entry fits.
        while total + size > max_bytes && !present.is_empty() {
            let (_, old, old_size) = present.remove(0);
            match std::fs::remove_file(&old) {
                Ok(()) => debug!(path = %old.display(), "spool entry evicted"),
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
                Err(err) => warn!(path = %old.display(), error = %err, "could not evict a spool entry"),
            }
            total = total.saturating_sub(old_size);
        }
        let temp = dir.join(format!(".{name}.{}.{}.tmp", std::process::id(), Uuid::new_v4().simple()));
        let made = (|| {
            let mut f = std::fs::File::create(&temp)?;
            f.write_all(&bytes)?;
            f.sync_all()?;
            std::fs::rename(&temp, &path)
        })();
        if let Err(err) = made {
            let _ = std::fs::remove_file(&temp);
            return Err(err);
        }
        total += size;
        present.push((SystemTime::now(), path, size));
        written += 1;
    }
    Ok(written)
}

/// Blocking: the spool's entries, oldest first (modification time, size); removes stale
/// temporary files on the way.
fn scan(dir: &Path) -> std::io::Result<Vec<(SystemTime, PathBuf, u64)>> {
    let mut out = Vec::new();
    for item in std::fs::read_dir(dir)? {
        let Ok(item) = item else { continue };
        let name = item.file_name();
        let name = name.to_string_lossy();
        let Ok(meta) = item.metadata() else { continue };
        let modified = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
        if name.starts_with('.') && name.ends_with(".tmp") {
            if modified.elapsed().is_ok_and(|age| age > STALE_TEMP) {
                let _ = std::fs::remove_file(item.path());
            }
        } else if name.ends_with(SUFFIX) && meta.is_file() {
            out.push((modified, item.path(), meta.len()));
        }
    }
    out.sort_by_key(|(t, _, _)| *t);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spool(dir: &Path, max_bytes: u64) -> Spool {
        let mut cfg = crate::config::Config::defaults().unwrap();
        cfg.worker.spool_dir = Some(dir.to_path_buf());
        cfg.worker.spool_max_bytes = max_bytes;
        Spool::new(&cfg.worker, "tiny", &cfg.output)
    }

    fn entry(s: &Spool, job: &Job, len: usize) -> SpoolEntry {
        let audio = crate::audio::encode_wav(&vec![0.25; len], 24_000);
        SpoolEntry { job_id: job.job_id, digest: s.digest(job), audio, infer_ms: 12.5 }
    }

    fn key(s: &Spool, job: &Job) -> (Uuid, String) {
        (job.job_id, s.digest(job))
    }

    #[tokio::test]
    async fn a_kept_entry_is_taken_back_whole_and_forgotten_once_committed() {
        let dir = tempfile::tempdir().unwrap();
        let s = spool(dir.path(), 1 << 20);
        let job = Job::new("Kept through an outage.");
        let e = entry(&s, &job, 2400);
        s.keep(vec![e.clone()]).await;
        let got = s.take(vec![key(&s, &job)]).await.pop().unwrap().expect("an entry");
        assert_eq!((got.audio.bytes, got.audio.sha256, got.audio.format, got.infer_ms), (e.audio.bytes, e.audio.sha256, e.audio.format, 12.5));
        assert_eq!(got.audio.seconds, e.audio.seconds);
        s.forget(vec![key(&s, &job)]).await;
        assert!(s.take(vec![key(&s, &job)]).await[0].is_none());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "nothing left behind");
    }

    #[tokio::test]
    async fn an_entry_serves_only_the_same_content_and_output_settings() {
        let dir = tempfile::tempdir().unwrap();
        let s = spool(dir.path(), 1 << 20);
        let job = Job::new("Same id, same content.");
        s.keep(vec![entry(&s, &job, 100)]).await;
        let mut other = job.clone();
        other.text.push('!');
        let mut faster = job.clone();
        faster.speed = Some(1.5);
        let mut mp3 = job.clone();
        mp3.format = Some(OutputFormat::Mp3);
        let mut voice = job.clone();
        voice.voice = "other".into();
        for changed in [&other, &faster, &mp3, &voice] {
            assert_ne!(s.digest(changed), s.digest(&job));
            assert!(s.take(vec![key(&s, changed)]).await[0].is_none());
        }
        let mut cfg = crate::config::Config::defaults().unwrap();
        cfg.worker.spool_dir = Some(dir.path().to_path_buf());
        cfg.output.bitrates.mp3_kbps = 128;
        let other_bitrate = Spool::new(&cfg.worker, "tiny", &cfg.output);
        assert_ne!(other_bitrate.digest(&mp3), s.digest(&mp3), "an mp3 job's digest covers the bitrate");
        assert_eq!(other_bitrate.digest(&job), s.digest(&job), "a wav job's does not");
        assert!(s.take(vec![key(&s, &job)]).await[0].is_some());
    }

    #[tokio::test]
    async fn a_corrupt_or_partial_entry_is_ignored_and_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let s = spool(dir.path(), 1 << 20);
        let (a, b) = (Job::new("Flipped."), Job::new("Cut short."));
        s.keep(vec![entry(&s, &a, 500), entry(&s, &b, 500)]).await;
        let path = |j: &Job| dir.path().join(entry_name(j.job_id, &s.digest(j)));
        let mut flipped = std::fs::read(path(&a)).unwrap();
        let mid = flipped.len() / 2;
        flipped[mid] ^= 1;
        std::fs::write(path(&a), flipped).unwrap();
        let cut = std::fs::read(path(&b)).unwrap();
        std::fs::write(path(&b), &cut[..cut.len() - 40]).unwrap();
        let got = s.take(vec![key(&s, &a), key(&s, &b)]).await;
        assert!(got.iter().all(Option::is_none));
        assert!(!path(&a).exists() && !path(&b).exists(), "corrupt entries are deleted");
    }

    #[tokio::test]
    async fn the_oldest_entries_are_evicted_first_to_stay_within_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let probe = spool(dir.path(), 1 << 20);
        let size = encode_entry(&entry(&probe, &Job::new("x"), 1000)).len() as u64;
        let s = spool(dir.path(), size * 3 + size / 2);
        let jobs: Vec<Job> = (0..5).map(|i| Job::new(format!("Job {i}."))).collect();
        for j in &jobs {
            s.keep(vec![entry(&s, j, 1000)]).await;
            std::thread::sleep(Duration::from_millis(20));
        }
        let got = s.take(jobs.iter().map(|j| key(&s, j)).collect()).await;
        let kept: Vec<bool> = got.iter().map(Option::is_some).collect();
        assert_eq!(kept, [false, false, true, true, true], "the two oldest evicted");
        let huge = spool(dir.path(), size / 2);
        huge.keep(vec![entry(&huge, &jobs[0], 1000)]).await;
        assert!(huge.take(vec![key(&huge, &jobs[0])]).await[0].is_none(), "an entry over the limit is not kept");
    }

    #[tokio::test]
    async fn a_spool_of_zero_bytes_keeps_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let s = spool(&dir.path().join("off"), 0);
        let job = Job::new("Off.");
        s.keep(vec![entry(&s, &job, 10)]).await;
        assert!(!dir.path().join("off").exists());
        assert!(s.take(vec![key(&s, &job)]).await[0].is_none());
    }
}
