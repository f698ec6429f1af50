//! `[output]`: the file format of jobs' audio (a job's own `format` wins) and the lossy codecs'
//! bitrates.

use serde::Deserialize;

use super::ConfigError;
use crate::audio::{Bitrates, OutputFormat};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawOutput {
    pub format: String,
    pub mp3_kbps: u32,
    pub opus_kbps: u32,
}

#[derive(Debug, Clone, PartialEq)]
pub struct OutputConfig {
    pub format: OutputFormat,
    pub bitrates: Bitrates,
}

impl RawOutput {
    pub fn validate(self) -> Result<OutputConfig, ConfigError> {
        let format = self.format.trim().parse().map_err(|reason| ConfigError::Invalid { key: "output.format", reason })?;
        if !(8..=320).contains(&self.mp3_kbps) {
            return Err(ConfigError::Invalid { key: "output.mp3_kbps", reason: format!("{} is outside MP3's 8–320 kbit/s", self.mp3_kbps) });
        }
        if !(6..=510).contains(&self.opus_kbps) {
            return Err(ConfigError::Invalid { key: "output.opus_kbps", reason: format!("{} is outside Opus's 6–510 kbit/s", self.opus_kbps) });
        }
        Ok(OutputConfig { format, bitrates: Bitrates { mp3_kbps: self.mp3_kbps, opus_kbps: self.opus_kbps } })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bitrates_outside_the_codecs_ranges_are_refused_with_the_key() {
        let raw = |mp3_kbps, opus_kbps| RawOutput { format: "mp3".into(), mp3_kbps, opus_kbps };
        assert_eq!(raw(64, 32).validate().unwrap().bitrates, Bitrates { mp3_kbps: 64, opus_kbps: 32 });
        assert!(matches!(raw(4, 32).validate(), Err(ConfigError::Invalid { key: "output.mp3_kbps", .. })));
        assert!(matches!(raw(64, 600).validate(), Err(ConfigError::Invalid { key: "output.opus_kbps", .. })));
    }
}
