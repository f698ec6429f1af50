//! `s3://BUCKET`: aws-sdk-s3 against AWS or any S3-compatible store (SeaweedFS, MinIO).

use std::collections::BTreeMap;
use std::time::Duration;

use aws_sdk_s3::config::{
    BehaviorVersion, Credentials, Region, RequestChecksumCalculation, ResponseChecksumValidation,
};
use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::Client;

use super::{AudioMeta, StorageError};
use crate::config::StorageConfig;

#[derive(Clone, Debug)]
pub struct S3Store {
    client: Client,
    bucket: String,
    key_prefix: String,
}

/// Keeps the SDK error as the source, with the HTTP status and the service's error code lifted out
/// (so a 403 can be told from a timeout).
fn s3_err<E>(op: &'static str, key: &str, e: SdkError<E, HttpResponse>) -> StorageError
where
    E: std::error::Error + ProvideErrorMetadata + Send + Sync + 'static,
{
    let status = e.raw_response().map(|r| r.status().as_u16());
    let code = e.as_service_error().and_then(|se| se.code()).map(str::to_string);
    let kind = match &e {
        SdkError::TimeoutError(_) => "timeout",
        SdkError::DispatchFailure(_) => "connection failed",
        SdkError::ConstructionFailure(_) => "bad request",
        SdkError::ResponseError(_) => "unreadable response",
        _ => "service error",
    };
    StorageError::S3 { op, key: key.to_string(), kind, status, code, source: Box::new(e) }
}

impl S3Store {
    /// Builds the client. Static keys from the config (or `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`,
    /// which override them) when set, else the standard AWS credential chain.
    pub async fn new(cfg: &StorageConfig, bucket: &str) -> S3Store {
        let timeouts = aws_sdk_s3::config::timeout::TimeoutConfig::builder()
            .connect_timeout(Duration::from_secs(3))
            .operation_attempt_timeout(Duration::from_secs(60))
            .build();
        let mut builder = if cfg.access_key_id.is_empty() || cfg.secret_access_key.is_empty() {
            let shared = aws_config::defaults(BehaviorVersion::latest())
                .region(Region::new(cfg.region.clone()))
                .load()
                .await;
            aws_sdk_s3::config::Builder::from(&shared)
        } else {
            aws_sdk_s3::config::Builder::new().behavior_version(BehaviorVersion::latest()).credentials_provider(Credentials::new(
                cfg.access_key_id.clone(),
                cfg.secret_access_key.expose().to_string(),
                None,
                None,
                "voxbatch-config",
            ))
        };
        builder = builder
            .region(Region::new(cfg.region.clone()))
            .force_path_style(cfg.force_path_style)
            .timeout_config(timeouts)
            .retry_config(aws_sdk_s3::config::retry::RetryConfig::standard().with_max_attempts(2))
            // Some S3-compatible stores mishandle the SDK's default trailing checksums.
            .request_checksum_calculation(RequestChecksumCalculation::WhenRequired)
            .response_checksum_validation(ResponseChecksumValidation::WhenRequired);
        if let Some(endpoint) = &cfg.endpoint {
            builder = builder.endpoint_url(endpoint.clone());
        }
        S3Store { client: Client::from_conf(builder.build()), bucket: bucket.to_string(), key_prefix: cfg.key_prefix.clone() }
    }

    pub fn bucket(&self) -> &str {
        &self.bucket
    }
    pub fn key_prefix(&self) -> &str {
        &self.key_prefix
    }

    pub async fn ensure_bucket(&self, create: bool) -> Result<(), StorageError> {
        match self.client.head_bucket().bucket(&self.bucket).send().await {
            Ok(_) => Ok(()),
            Err(e) if create && e.as_service_error().is_some_and(|se| se.is_not_found()) => {
                match self.client.create_bucket().bucket(&self.bucket).send().await {
                    Ok(_) => Ok(()),
                    Err(e) if e.as_service_error().is_some_and(|se| se.is_bucket_already_owned_by_you()) => Ok(()),
                    Err(e) => Err(s3_err("create_bucket", &self.bucket, e)),
                }
            }
            Err(e) => Err(s3_err("head_bucket", &self.bucket, e)),
        }
    }

    pub async fn put(&self, key: &str, body: Vec<u8>, meta: &AudioMeta) -> Result<(), StorageError> {
        let mut req = self
            .client
            .put_object()
            .bucket(&self.bucket)
            .key(key)
            .content_type(meta.content_type)
            .body(ByteStream::from(body));
        for (k, v) in meta.to_map() {
            req = req.metadata(k, v);
        }
        req.send().await.map_err(|e| s3_err("put", key, e))?;
        Ok(())
    }

    pub async fn get(&self, key: &str) -> Result<(Vec<u8>, BTreeMap<String, String>), StorageError> {
        let out = match self.client.get_object().bucket(&self.bucket).key(key).send().await {
            Ok(o) => o,
            Err(e) if e.as_service_error().is_some_and(|se| se.is_no_such_key()) => {
                return Err(StorageError::NotFound(key.to_string()))
            }
            Err(e) => return Err(s3_err("get", key, e)),
        };
        let mut meta: BTreeMap<String, String> = out.metadata().cloned().unwrap_or_default().into_iter().collect();
        if let Some(ct) = out.content_type() {
            meta.insert("content-type".to_string(), ct.to_string());
        }
        let body = out
            .body
            .collect()
            .await
            .map_err(|e| StorageError::S3 { op: "get", key: key.to_string(), kind: "body read failed", status: None, code: None, source: Box::new(e) })?
            .into_bytes()
            .to_vec();
        Ok((body, meta))
    }

    pub async fn list(&self, prefix: &str) -> Result<Vec<(String, u64)>, StorageError> {
        let mut keys = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let out = self
                .client
                .list_objects_v2()
                .bucket(&self.bucket)
                .prefix(prefix)
                .set_continuation_token(token.take())
                .send()
                .await
                .map_err(|e| s3_err("list", prefix, e))?;
            keys.extend(out.contents().iter().filter_map(|o| o.key().map(|k| (k.to_string(), o.size().unwrap_or(0).max(0) as u64))));
            match out.next_continuation_token() {
                Some(t) if out.is_truncated().unwrap_or(false) => token = Some(t.to_string()),
                _ => break,
            }
        }
        keys.sort();
        Ok(keys)
    }

    pub async fn delete(&self, key: &str) -> Result<(), StorageError> {
        self.client.delete_object().bucket(&self.bucket).key(key).send().await.map_err(|e| s3_err("delete", key, e))?;
        Ok(())
    }
}
