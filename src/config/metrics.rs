//! `[metrics]`: where a worker process serves its Prometheus metrics.

use std::net::SocketAddr;

use serde::Deserialize;

use super::ConfigError;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMetrics {
    pub listen: String,
    pub linger: super::check::RawDuration,
}

#[derive(Debug, Clone, PartialEq)]
pub struct MetricsConfig {
    /// `None`: no endpoint (`listen = "off"`).
    pub listen: Option<SocketAddr>,
    /// How long `work --drain` keeps serving after the queue drained, so the last batch is scraped.
    pub linger: std::time::Duration,
}

impl RawMetrics {
    pub fn validate(self) -> Result<MetricsConfig, ConfigError> {
        let listen = match self.listen.trim() {
            "off" | "" => None,
            addr => Some(addr.parse::<SocketAddr>().map_err(|e| ConfigError::Invalid {
                key: "metrics.listen",
                reason: format!("{addr:?} is not an address:port or \"off\" ({e})"),
            })?),
        };
        Ok(MetricsConfig { listen, linger: self.linger.any("metrics.linger")? })
    }
}
