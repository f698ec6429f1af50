//! `[frontend]`: the text frontend of CosyVoice2 jobs (segmenting as the reference's
//! `split_paragraph`) and the estimates `voxbatch text` prints before any GPU time is bought.

use serde::Deserialize;

use super::check::positive;
use super::ConfigError;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawFrontend {
    pub segment_max_tokens: i64,
    pub segment_min_tokens: i64,
    pub segment_merge_tokens: i64,
    pub zh_chars_per_second: f64,
    pub en_chars_per_second: f64,
    pub estimate_audio_seconds_per_gpu_second: f64,
    pub threads: i64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct FrontendConfig {
    pub segment_max_tokens: usize,
    pub segment_min_tokens: usize,
    pub segment_merge_tokens: usize,
    /// Speaking rates the dry run estimates audio length with (characters of normalised text a second).
    pub zh_chars_per_second: f64,
    pub en_chars_per_second: f64,
    /// Throughput the dry run prices GPU time with.
    pub estimate_audio_seconds_per_gpu_second: f64,
    /// Text jobs a worker prepares at once; 0: half the host's cores (see [`FrontendConfig::threads`]).
    pub threads: usize,
}

/// Most frontend threads `threads = 0` picks.
const AUTO_THREADS_MAX: usize = 8;

impl FrontendConfig {
    /// Text jobs a worker prepares at once: `threads`, or for 0 half the host's cores, between 1
    /// and 8 (the model thread, the intake and uploads need the rest).
    pub fn threads(&self) -> usize {
        if self.threads > 0 {
            return self.threads;
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        (cores / 2).clamp(1, AUTO_THREADS_MAX)
    }
}

fn rate(key: &'static str, v: f64) -> Result<f64, ConfigError> {
    if v.is_finite() && v > 0.0 {
        Ok(v)
    } else {
        Err(ConfigError::Invalid { key, reason: format!("must be a positive number, got {v}") })
    }
}

impl RawFrontend {
    pub fn validate(self) -> Result<FrontendConfig, ConfigError> {
        let c = FrontendConfig {
            segment_max_tokens: positive("frontend.segment_max_tokens", self.segment_max_tokens)?,
            segment_min_tokens: positive("frontend.segment_min_tokens", self.segment_min_tokens)?,
            segment_merge_tokens: positive("frontend.segment_merge_tokens", self.segment_merge_tokens)?,
            zh_chars_per_second: rate("frontend.zh_chars_per_second", self.zh_chars_per_second)?,
            en_chars_per_second: rate("frontend.en_chars_per_second", self.en_chars_per_second)?,
            estimate_audio_seconds_per_gpu_second: rate("frontend.estimate_audio_seconds_per_gpu_second", self.estimate_audio_seconds_per_gpu_second)?,
            threads: usize::try_from(self.threads).map_err(|_| ConfigError::Invalid { key: "frontend.threads", reason: "must be >= 0".into() })?,
        };
        if c.segment_min_tokens >= c.segment_max_tokens {
            return Err(ConfigError::Invalid { key: "frontend.segment_min_tokens", reason: "must be below segment_max_tokens".into() });
        }
        Ok(c)
    }
}
