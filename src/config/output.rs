//! `[output]`: the file format of jobs' audio (a job's own `format` wins).

use serde::Deserialize;

use super::ConfigError;
use crate::audio::OutputFormat;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawOutput {
    pub format: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct OutputConfig {
    pub format: OutputFormat,
}

impl RawOutput {
    pub fn validate(self) -> Result<OutputConfig, ConfigError> {
        let format = self.format.trim().parse().map_err(|reason| ConfigError::Invalid { key: "output.format", reason })?;
        Ok(OutputConfig { format })
    }
}
