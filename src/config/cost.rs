//! `[cost]`: prices and GPU-metric sampling.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use super::check::{price, RawDuration};
use super::ConfigError;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCost {
    pub gpu_hourly_usd: BTreeMap<String, f64>,
    pub cpu_hourly_usd: f64,
    pub default_gpu_hourly_usd: f64,
    pub energy_usd_per_kwh: f64,
    pub sample_interval: RawDuration,
}

/// Prices and metric sampling.
#[derive(Debug, Clone)]
pub struct CostConfig {
    pub prices: crate::cost::Prices,
    pub sample_interval: Duration,
}

impl RawCost {
    pub fn validate(self) -> Result<CostConfig, ConfigError> {
        for v in self.gpu_hourly_usd.values() {
            price("cost.gpu_hourly_usd", *v)?;
        }
        Ok(CostConfig {
            prices: crate::cost::Prices {
                gpu_hourly_usd: self.gpu_hourly_usd,
                cpu_hourly_usd: price("cost.cpu_hourly_usd", self.cpu_hourly_usd)?,
                default_gpu_hourly_usd: price("cost.default_gpu_hourly_usd", self.default_gpu_hourly_usd)?,
                energy_usd_per_kwh: price("cost.energy_usd_per_kwh", self.energy_usd_per_kwh)?,
            },
            sample_interval: self.sample_interval.positive("cost.sample_interval")?,
        })
    }
}
