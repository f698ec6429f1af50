//! `[storage]`: where audio goes (`s3://BUCKET` or `file:///DIR`) and how to reach it.

use std::path::PathBuf;

use serde::Deserialize;

use super::check::positive;
use super::{ConfigError, Secret};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawStorage {
    pub url: String,
    pub key_prefix: String,
    pub endpoint: String,
    pub region: String,
    pub force_path_style: bool,
    pub access_key_id: String,
    pub secret_access_key: Secret,
    pub create_bucket: bool,
    pub upload_concurrency: i64,
}

/// Where audio objects go.
#[derive(Debug, Clone)]
pub enum StorageTarget {
    S3 { bucket: String },
    File { root: PathBuf },
}

#[derive(Debug, Clone)]
pub struct StorageConfig {
    pub target: StorageTarget,
    pub key_prefix: String,
    pub endpoint: Option<String>,
    pub region: String,
    pub force_path_style: bool,
    pub access_key_id: String,
    pub secret_access_key: Secret,
    pub create_bucket: bool,
    pub upload_concurrency: usize,
}

impl RawStorage {
    pub fn validate(self) -> Result<StorageConfig, ConfigError> {
        let target = if let Some(bucket) = self.url.strip_prefix("s3://") {
            let bucket = bucket.trim_end_matches('/');
            let valid = (3..=63).contains(&bucket.len())
                && bucket.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.');
            if !valid {
                return Err(ConfigError::Invalid { key: "storage.url", reason: format!("`{bucket}` is not a valid bucket name (3-63 of a-z 0-9 . -)") });
            }
            StorageTarget::S3 { bucket: bucket.to_string() }
        } else if let Some(root) = self.url.strip_prefix("file://") {
            if !root.starts_with('/') {
                return Err(ConfigError::Invalid { key: "storage.url", reason: "file:// needs an absolute path, e.g. file:///data/audio".into() });
            }
            StorageTarget::File { root: PathBuf::from(root) }
        } else {
            return Err(ConfigError::Invalid { key: "storage.url", reason: format!("`{}` must be s3://BUCKET or file:///DIR", self.url) });
        };
        if self.key_prefix.starts_with('/') || self.key_prefix.contains("..") {
            return Err(ConfigError::Invalid { key: "storage.key_prefix", reason: "must be relative and must not contain `..`".into() });
        }
        Ok(StorageConfig {
            target,
            key_prefix: self.key_prefix,
            endpoint: Some(self.endpoint).filter(|e| !e.is_empty()),
            region: self.region,
            force_path_style: self.force_path_style,
            access_key_id: self.access_key_id,
            secret_access_key: self.secret_access_key,
            create_bucket: self.create_bucket,
            upload_concurrency: positive("storage.upload_concurrency", self.upload_concurrency)?,
        })
    }
}
