//! `[voices]`: CosyVoice2 voices from recordings (`voxbatch voice add`) and how workers pick up
//! the ones added while they run.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::check::RawDuration;
use super::ConfigError;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawVoices {
    pub refresh: RawDuration,
    pub onnxruntime: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct VoicesConfig {
    /// How often a worker polls Postgres for voices added, replaced or removed (a job naming a
    /// voice the worker does not know makes it look at once).
    pub refresh: Duration,
    /// onnxruntime's shared library for `voice add`; `None`: `ORT_DYLIB_PATH`, else pip's
    /// onnxruntime in the project venv.
    pub onnxruntime: Option<PathBuf>,
}

impl RawVoices {
    pub fn validate(self) -> Result<VoicesConfig, ConfigError> {
        let onnxruntime = Some(self.onnxruntime.trim()).filter(|s| !s.is_empty()).map(PathBuf::from);
        Ok(VoicesConfig { refresh: self.refresh.positive("voices.refresh")?, onnxruntime })
    }
}
