//! Storage: where finished audio goes. `s3://BUCKET` (the default; SeaweedFS locally) or
//! `file:///DIR`, both with the key layout `<key_prefix><campaign>/<job_id>.<wav|flac|mp3|opus>` and the object
//! metadata job-id, model, voice and sha256.
//!
//! Uploads are idempotent (same key, same bytes), so a retried or duplicated upload is harmless;
//! Postgres, not the store, says whether a job is done.
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

impl crate::worker::retry::Transience for StorageError {
    fn is_permanent(&self) -> bool {
        StorageError::is_permanent(self)
    }
}

/// The object key of a job's audio: `<prefix><campaign>/<job_id>.<ext>` (the format's extension). The one
/// place the key layout is written.
pub fn object_key(prefix: &str, campaign: &str, job_id: Uuid, format: crate::audio::OutputFormat) -> String {
    format!("{}{job_id}.{}", campaign_prefix(prefix, campaign), format.extension())
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
    pub model: String,
    pub voice: String,
    pub sha256: String,
}

impl AudioMeta {
    pub fn to_map(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            ("job-id".to_string(), self.job_id.to_string()),
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

    /// The object key of a job's audio, relative to the bucket or directory ([`object_key`]).
    pub fn key(&self, campaign: &str, job_id: Uuid, format: crate::audio::OutputFormat) -> String {
        object_key(self.key_prefix(), campaign, job_id, format)
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
