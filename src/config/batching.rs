//! `[batching]` (how batches form) and `[limits]` (what input is accepted).

use std::time::Duration;

use serde::Deserialize;

use super::check::{positive, RawDuration};
use super::ConfigError;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawBatching {
    pub max_batch: i64,
    pub max_text_jobs: i64,
    pub max_wait: RawDuration,
    pub max_batch_tokens: i64,
    pub max_length_ratio: f64,
}

#[derive(Debug, Clone)]
pub struct BatchingConfig {
    /// Jobs per batch; for text models, segments per token2wav bucket.
    pub max_batch: usize,
    /// Text models: jobs per batch (`None`: the LLM's slots × `sizing::TEXT_BATCH_FILLS`).
    pub max_text_jobs: Option<usize>,
    pub max_wait: Duration,
    pub max_batch_tokens: usize,
    pub max_length_ratio: f64,
}

impl RawBatching {
    pub fn validate(self) -> Result<BatchingConfig, ConfigError> {
        if !(self.max_length_ratio >= 1.0 && self.max_length_ratio.is_finite()) {
            return Err(ConfigError::Invalid { key: "batching.max_length_ratio", reason: format!("must be >= 1, got {}", self.max_length_ratio) });
        }
        Ok(BatchingConfig {
            max_batch: positive("batching.max_batch", self.max_batch)?,
            max_text_jobs: match self.max_text_jobs {
                0 => None,
                n => Some(positive("batching.max_text_jobs", n)?),
            },
            max_wait: self.max_wait.any("batching.max_wait")?,
            max_batch_tokens: positive("batching.max_batch_tokens", self.max_batch_tokens)?,
            max_length_ratio: self.max_length_ratio,
        })
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLimits {
    pub max_text_chars: i64,
    pub max_message_bytes: i64,
    pub max_speech_tokens: i64,
}

/// Limits on accepted input.
#[derive(Debug, Clone)]
pub struct Limits {
    pub max_text_chars: usize,
    pub max_message_bytes: usize,
    pub max_speech_tokens: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_text_chars: 20_000, max_message_bytes: 262_144, max_speech_tokens: 7_000 }
    }
}

impl RawLimits {
    pub fn validate(self) -> Result<Limits, ConfigError> {
        Ok(Limits {
            max_text_chars: positive("limits.max_text_chars", self.max_text_chars)?,
            max_message_bytes: positive("limits.max_message_bytes", self.max_message_bytes)?,
            max_speech_tokens: positive("limits.max_speech_tokens", self.max_speech_tokens)?,
        })
    }
}
