//! Storage: where finished audio goes. `s3://BUCKET` (the default; SeaweedFS locally) or
//! `file:///DIR`, both with the key layout `<key_prefix><campaign>/<job_id>.wav` and the object
//! metadata job-id, model, voice and sha256.
//!
//! Uploads are idempotent (same key, same bytes), so a retried or duplicated upload is harmless;
//! Postgres, not the store, says whether a job is done.
//!
//! Neighbours: `audio` produces the bytes; `worker` uploads each batch's files here before it
//! records them in `db`.

mod file;
mod s3;

use std::collections::BTreeMap;

use uuid::Uuid;

use crate::config::{StorageConfig, StorageTarget};

pub use file::FileStore;
pub use s3::S3Store;

/// Errors of the storage stage. All of them are treated as transient by the worker (retried with
/// backoff while the batch's messages stay unacked).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StorageError {
    #[error("s3 {op} of {key} failed: {message}")]
    S3 { op: &'static str, key: String, message: String },
    #[error("file store {op} of {path} failed")]
    File { op: &'static str, path: String, source: std::io::Error },
    #[error("object {0} not found")]
    NotFound(String),
}

/// Object metadata stored beside each audio file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AudioMeta {
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

    /// The object key of a job's audio, relative to the bucket or directory.
    pub fn key(&self, campaign: &str, job_id: Uuid) -> String {
        let prefix = match self {
            Storage::S3(s) => s.key_prefix(),
            Storage::File(f) => f.key_prefix(),
        };
        format!("{prefix}{campaign}/{job_id}.wav")
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

    /// Deletes every object under `prefix` (tests clean up with this).
    pub async fn delete_prefix(&self, prefix: &str) -> Result<usize, StorageError> {
        match self {
            Storage::S3(s) => s.delete_prefix(prefix).await,
            Storage::File(f) => f.delete_prefix(prefix).await,
        }
    }
}
