//! `[metrics]`: where a worker process serves its Prometheus metrics.

use std::net::SocketAddr;

use serde::Deserialize;

use super::ConfigError;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMetrics {
    pub listen: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct MetricsConfig {
    /// `None`: no endpoint (`listen = "off"`).
    pub listen: Option<SocketAddr>,
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
        Ok(MetricsConfig { listen })
    }
}
