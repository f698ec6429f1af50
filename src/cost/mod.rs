//! Cost: what a GPU-hour (or CPU-hour) costs, and what each batch cost.
//!
//! A batch costs its inference time × the hourly price / 3600, plus its measured energy × the
//! energy price when one is set. The rest of a worker's life is idle time, recorded per worker
//! (`workers.busy_ms` / `alive_ms`) so that reports show utilisation and the cost of idling.
//!
//! Neighbours: `config` holds the price table; `worker` prices each batch; `report` sums.

use std::collections::BTreeMap;

use crate::model::Device;

/// The price table.
#[derive(Debug, Clone, PartialEq)]
pub struct Prices {
    /// USD per GPU-hour by (upper-cased) name fragment.
    pub gpu_hourly_usd: BTreeMap<String, f64>,
    pub cpu_hourly_usd: f64,
    pub default_gpu_hourly_usd: f64,
    pub energy_usd_per_kwh: f64,
}

/// A batch's cost.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BatchCost {
    pub hourly_usd: f64,
    /// Time share plus energy.
    pub cost_usd: f64,
    /// The energy part (when energy is priced and measured).
    pub energy_usd: Option<f64>,
}

impl Prices {
    /// Hourly price of `device`: the longest table key contained in the GPU's name, else the
    /// default; the CPU price on CPU.
    pub fn hourly(&self, device: Device, gpu_name: Option<&str>) -> f64 {
        if device == Device::Cpu {
            return self.cpu_hourly_usd;
        }
        let name = gpu_name.unwrap_or("").to_uppercase();
        self.gpu_hourly_usd
            .iter()
            .filter(|(k, _)| !k.is_empty() && name.contains(&k.to_uppercase()))
            .max_by_key(|(k, _)| k.len())
            .map(|(_, &p)| p)
            .unwrap_or(self.default_gpu_hourly_usd)
    }

    /// Cost of `infer_ms` of work at `hourly_usd`, plus `energy_j` at the energy price.
    pub fn batch_cost(&self, hourly_usd: f64, infer_ms: f64, energy_j: Option<f64>) -> BatchCost {
        let time = hourly_usd * infer_ms / 3_600_000.0;
        let energy_usd = match energy_j {
            Some(j) if self.energy_usd_per_kwh > 0.0 => Some(j / 3.6e6 * self.energy_usd_per_kwh),
            _ => None,
        };
        BatchCost { hourly_usd, cost_usd: time + energy_usd.unwrap_or(0.0), energy_usd }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prices() -> Prices {
        Prices {
            gpu_hourly_usd: BTreeMap::from([("H100".into(), 3.0), ("H200".into(), 4.0), ("A100".into(), 1.3), ("L4".into(), 0.8), ("L40S".into(), 1.2)]),
            cpu_hourly_usd: 0.1,
            default_gpu_hourly_usd: 0.5,
            energy_usd_per_kwh: 0.0,
        }
    }

    #[test]
    fn the_longest_matching_name_wins_and_cpu_has_its_own_price() {
        let p = prices();
        assert_eq!(p.hourly(Device::Cuda(0), Some("NVIDIA H200")), 4.0);
        assert_eq!(p.hourly(Device::Cuda(0), Some("NVIDIA A100-SXM4-80GB")), 1.3);
        assert_eq!(p.hourly(Device::Cuda(0), Some("NVIDIA L40S")), 1.2, "L40S, not L4");
        assert_eq!(p.hourly(Device::Cuda(0), Some("NVIDIA L4")), 0.8);
        assert_eq!(p.hourly(Device::Cuda(0), Some("Radeon")), 0.5);
        assert_eq!(p.hourly(Device::Cuda(0), None), 0.5);
        assert_eq!(p.hourly(Device::Cpu, Some("NVIDIA H200")), 0.1);
    }

    #[test]
    fn batch_cost_is_time_times_price_plus_priced_energy() {
        let mut p = prices();
        // 90 s of inference at $4/h = $0.10
        let c = p.batch_cost(4.0, 90_000.0, Some(36_000.0));
        assert!((c.cost_usd - 0.1).abs() < 1e-12);
        assert_eq!(c.energy_usd, None, "energy not priced");
        p.energy_usd_per_kwh = 0.25;
        // 36 kJ = 0.01 kWh → $0.0025
        let c = p.batch_cost(4.0, 90_000.0, Some(36_000.0));
        assert!((c.energy_usd.unwrap() - 0.0025).abs() < 1e-12);
        assert!((c.cost_usd - 0.1025).abs() < 1e-12);
        assert_eq!(p.batch_cost(4.0, 90_000.0, None).energy_usd, None, "no reading, no energy cost");
    }
}
