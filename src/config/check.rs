//! Value checks shared by the sections' `validate`.

use std::time::Duration;

use serde::Deserialize;

use super::ConfigError;

pub fn positive(key: &'static str, v: i64) -> Result<usize, ConfigError> {
    if v <= 0 {
        return Err(ConfigError::Invalid { key, reason: format!("must be > 0, got {v}") });
    }
    usize::try_from(v).map_err(|_| ConfigError::Invalid { key, reason: format!("{v} is too large") })
}

pub fn non_negative(key: &'static str, v: i64) -> Result<u64, ConfigError> {
    u64::try_from(v).map_err(|_| ConfigError::Invalid { key, reason: format!("must be >= 0, got {v}") })
}

/// A duration written as in humantime: `250ms`, `5s`, `1m 30s`, `2h`.
#[derive(Debug, Clone, Deserialize)]
#[serde(transparent)]
pub struct RawDuration(pub String);

impl RawDuration {
    /// The duration, which must be more than zero (and below ~115 days).
    pub fn positive(&self, key: &'static str) -> Result<Duration, ConfigError> {
        let d = self.any(key)?;
        if d.is_zero() {
            return Err(ConfigError::Invalid { key, reason: "must be more than 0".into() });
        }
        Ok(d)
    }

    /// The duration, zero allowed.
    pub fn any(&self, key: &'static str) -> Result<Duration, ConfigError> {
        let d = humantime::parse_duration(self.0.trim())
            .map_err(|e| ConfigError::Invalid { key, reason: format!("`{}` is not a duration ({e}); write e.g. 250ms, 5s, 2m", self.0) })?;
        if d > Duration::from_secs(10_000_000) {
            return Err(ConfigError::Invalid { key, reason: format!("`{}` is too long", self.0) });
        }
        Ok(d)
    }
}

pub fn name(key: &'static str, v: String) -> Result<String, ConfigError> {
    if v.is_empty() || v.len() > 255 {
        return Err(ConfigError::Invalid { key, reason: "must be 1 to 255 bytes long".into() });
    }
    Ok(v)
}

pub fn fraction(key: &'static str, v: f64) -> Result<f64, ConfigError> {
    if v > 0.0 && v <= 1.0 {
        Ok(v)
    } else {
        Err(ConfigError::Invalid { key, reason: format!("must be in (0, 1], got {v}") })
    }
}

pub fn price(key: &'static str, v: f64) -> Result<f64, ConfigError> {
    if v >= 0.0 && v.is_finite() {
        Ok(v)
    } else {
        Err(ConfigError::Invalid { key, reason: format!("must be a price >= 0, got {v}") })
    }
}
