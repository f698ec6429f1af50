//! `[model]`: which model directory runs where, at which precision.

use std::path::PathBuf;

use serde::Deserialize;

use super::ConfigError;
use crate::model::{Device, Precision};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawModel {
    pub dir: PathBuf,
    pub device: String,
    pub precision: String,
    pub cpu_threads: i64,
}

#[derive(Debug, Clone)]
pub struct ModelConfig {
    pub dir: PathBuf,
    pub device: Device,
    pub precision: Precision,
    pub cpu_threads: usize,
}

impl RawModel {
    pub fn validate(self) -> Result<ModelConfig, ConfigError> {
        Ok(ModelConfig {
            dir: self.dir,
            device: self.device.parse().map_err(|e: crate::model::ParseError| ConfigError::Invalid { key: "model.device", reason: e.to_string() })?,
            precision: self.precision.parse().map_err(|e: crate::model::ParseError| ConfigError::Invalid { key: "model.precision", reason: e.to_string() })?,
            cpu_threads: usize::try_from(self.cpu_threads).map_err(|_| ConfigError::Invalid { key: "model.cpu_threads", reason: "must be >= 0".into() })?,
        })
    }
}
