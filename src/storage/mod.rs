//! Storage: where finished audio goes. `s3://BUCKET` (the default; SeaweedFS locally) or
//! `file:///DIR`, both with the key layout `<key_prefix><campaign>/<job_id>.<wav|flac|mp3|opus>`
//! (`<job_id>.<claim>.<ext>` from a job's second claim on: [`object_key`]) and the object metadata
//! job-id, claim, batch-id, model, voice and sha256.
//!
//! Each claim of a job writes its own key, so an upload is written by one claim's holder only: a
//! retried upload of that claim is harmless (same key, same bytes), and a worker paused past its
//! lease cannot overwrite the audio of the claim that replaced it. Postgres, not the store, says
//! whether a job is done and which key holds its audio (`jobs.s3_key`).
//!
//! Neighbours: `audio` produces the bytes; `worker::commit` uploads each batch's files here before
//! it records them in `db`; `commands::audit` lists them.

mod file;
mod s3;

use std::collections::BTreeMap;

use uuid::Uuid;

use crate::config::{StorageConfig, StorageTarget};

pub use file::FileStore;
pub use s3::S3Store;

/// Errors of the storage stage. [`StorageError::is_permanent`] tells refused credentials and
/// access from outages; the worker retries the latter with back-off while it holds the messages.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StorageError {
    #[error("s3 {op} of {key} failed: {kind}{}{}", code.as_deref().map(|c| format!(" {c}")).unwrap_or_default(), status.map(|s| format!(" (HTTP {s})")).unwrap_or_default())]
    S3 {
        op: &'static str,
        key: String,
        /// timeout, connection failed, service error, …
        kind: &'static str,
        status: Option<u16>,
        /// The service's error code (AccessDenied, InvalidAccessKeyId, NoSuchBucket, …).
        code: Option<String>,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("file store {op} of {path} failed")]
    File { op: &'static str, path: String, source: std::io::Error },
    #[error("object {0} not found")]
    NotFound(String),
    #[error("metadata of {key} is unreadable")]
    Corrupt { key: String, source: serde_json::Error },
}

/// S3 error codes that waiting does not fix.
const PERMANENT_S3_CODES: &[&str] =
    &["AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "NoSuchBucket", "InvalidBucketName", "AllAccessDisabled"];

impl StorageError {
    /// Refused credentials or access, a missing bucket: retrying cannot help.
    pub fn is_permanent(&self) -> bool {
        match self {
            StorageError::S3 { status, code, .. } => {
                matches!(status, Some(401 | 403)) || code.as_deref().is_some_and(|c| PERMANENT_S3_CODES.contains(&c))
            }
            StorageError::File { source, .. } => source.kind() == std::io::ErrorKind::PermissionDenied,
            StorageError::NotFound(_) | StorageError::Corrupt { .. } => false,
        }
    }
}

impl crate::transience::Transience for StorageError {
    fn is_permanent(&self) -> bool {
        StorageError::is_permanent(self)
    }
}

/// The object key of a job's audio made under claim number `claim`: `<prefix><campaign>/<job_id>.<ext>`
/// for the first claim (the usual case), `<prefix><campaign>/<job_id>.<claim>.<ext>` for a later one
/// (the job was given back, or its worker was lost or paused past its lease). One key per claim is
/// the fence on the store's side: only the holder of a claim writes its key. The one place the key
/// layout is written.
pub fn object_key(prefix: &str, campaign: &str, job_id: Uuid, format: crate::audio::OutputFormat, claim: i32) -> String {
    let ext = format.extension();
    match claim {
        ..=1 => format!("{}{job_id}.{ext}", campaign_prefix(prefix, campaign)),
        n => format!("{}{job_id}.{n}.{ext}", campaign_prefix(prefix, campaign)),
    }
}

/// The prefix every claim's key of a job's audio starts with: `<prefix><campaign>/<job_id>.`.
pub fn job_key_prefix(prefix: &str, campaign: &str, job_id: Uuid) -> String {
    format!("{}{job_id}.", campaign_prefix(prefix, campaign))
}

/// The prefix under which a campaign's objects live: `<prefix><campaign>/`.
pub fn campaign_prefix(prefix: &str, campaign: &str) -> String {
    format!("{prefix}{campaign}/")
}

/// Object metadata stored beside each audio file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AudioMeta {
    /// The stored file's Content-Type ([`crate::audio::OutputFormat::content_type`]).
    pub content_type: &'static str,
    pub job_id: Uuid,
    /// The claim the audio was made under ([`object_key`]).
    pub claim: i32,
    /// The batch that made it (`jobs.batch_id` once committed).
    pub batch_id: Uuid,
    pub model: String,
    pub voice: String,
    pub sha256: String,
}

impl AudioMeta {
    pub fn to_map(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            ("job-id".to_string(), self.job_id.to_string()),
            ("claim".to_string(), self.claim.to_string()),
            ("batch-id".to_string(), self.batch_id.to_string()),
            ("model".to_string(), self.model.clone()),
            ("voice".to_string(), self.voice.clone()),
            ("sha256".to_string(), self.sha256.clone()),
        ])
    }
}

/// An audio store.
#[derive(Clone)]
pub enum Storage {
    S3(S3Store),
    File(FileStore),
}

impl Storage {
    /// Opens the store the configuration names (no network calls yet).
    pub async fn open(cfg: &StorageConfig) -> Result<Storage, StorageError> {
        Ok(match &cfg.target {
            StorageTarget::S3 { bucket } => Storage::S3(S3Store::new(cfg, bucket).await),
            StorageTarget::File { root } => Storage::File(FileStore::new(root.clone(), cfg.key_prefix.clone())),
        })
    }

    fn key_prefix(&self) -> &str {
        match self {
            Storage::S3(s) => s.key_prefix(),
            Storage::File(f) => f.key_prefix(),
        }
    }

    /// The object key of a job's audio under claim `claim`, relative to the bucket or directory ([`object_key`]).
    pub fn key(&self, campaign: &str, job_id: Uuid, format: crate::audio::OutputFormat, claim: i32) -> String {
        object_key(self.key_prefix(), campaign, job_id, format, claim)
    }

    /// The prefix of every claim's key of a job's audio ([`job_key_prefix`]).
    pub fn job_prefix(&self, campaign: &str, job_id: Uuid) -> String {
        job_key_prefix(self.key_prefix(), campaign, job_id)
    }

    /// The prefix of a campaign's objects ([`campaign_prefix`]).
    pub fn campaign_prefix(&self, campaign: &str) -> String {
        campaign_prefix(self.key_prefix(), campaign)
    }

    /// A URL for humans: `s3://bucket/key` or `file:///dir/key`.
    pub fn url(&self, key: &str) -> String {
        match self {
            Storage::S3(s) => format!("s3://{}/{key}", s.bucket()),
            Storage::File(f) => format!("file://{}", f.path(key).display()),
        }
    }

    /// Creates the bucket or directory if missing.
    pub async fn ensure_ready(&self, create: bool) -> Result<(), StorageError> {
        match self {
            Storage::S3(s) => s.ensure_bucket(create).await,
            Storage::File(f) => f.ensure_root().await,
        }
    }

    pub async fn put(&self, key: &str, body: Vec<u8>, meta: &AudioMeta) -> Result<(), StorageError> {
        match self {
            Storage::S3(s) => s.put(key, body, meta).await,
            Storage::File(f) => f.put(key, body, meta).await,
        }
    }

    /// The object's bytes and metadata.
    pub async fn get(&self, key: &str) -> Result<(Vec<u8>, BTreeMap<String, String>), StorageError> {
        match self {
            Storage::S3(s) => s.get(key).await,
            Storage::File(f) => f.get(key).await,
        }
    }

    /// Keys under `prefix` (relative to the bucket or directory).
    pub async fn list(&self, prefix: &str) -> Result<Vec<String>, StorageError> {
        Ok(self.list_sizes(prefix).await?.into_iter().map(|(k, _)| k).collect())
    }

    /// Keys under `prefix` with their objects' sizes in bytes, sorted by key.
    pub async fn list_sizes(&self, prefix: &str) -> Result<Vec<(String, u64)>, StorageError> {
        match self {
            Storage::S3(s) => s.list(prefix).await,
            Storage::File(f) => f.list(prefix).await,
        }
    }

    /// Deletes one object (and its metadata).
    pub async fn delete(&self, key: &str) -> Result<(), StorageError> {
        match self {
            Storage::S3(s) => s.delete(key).await,
            Storage::File(f) => f.delete(key).await,
        }
    }
}
