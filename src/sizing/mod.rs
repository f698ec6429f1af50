//! Batch sizing: which batch policy a worker (or a bench) runs, from configuration, the device's
//! memory and the calibration profile.
//!
//! [`worker_policy`] builds the policy and the prefetch it needs; [`memory_admission`] builds
//! the memory budget (fraction × device memory − other processes − margin, or a fixed budget)
//! around the matching profile, or a conservative built-in when there is none. Both read NVML
//! and files: call them off the async runtime (`spawn_blocking`).
//!
//! Neighbours: `batch` holds the pure policy and memory model; `worker` and `bench::policy` call
//! this; `calibrate` writes the profiles read here (`profile.rs`).

pub mod llm;
pub mod profile;

use tracing::{info, warn};

use crate::batch::memory::{MemoryBudget, Profile};
use crate::batch::{BatchPolicy, LengthBucketing};
use crate::config::{Config, SizingPolicy};
use crate::model::{Device, Manifest, Precision};
pub use profile::ProfileError;

/// Errors choosing a batch size.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SizingError {
    #[error("cannot size batches by memory on {device}; set memory.budget_bytes, or memory.policy = \"tokens\"")]
    NoDeviceMemory { device: Device, source: crate::gpu::GpuError },
    #[error("no memory left for batches on {gpu}: {fraction:.0}% of {total} bytes minus other processes ({others} bytes) minus the margin is {budget:.0}")]
    NoBudget { gpu: String, fraction: f64, total: u64, others: u64, budget: f64 },
    #[error(transparent)]
    Profile(#[from] ProfileError),
}

/// A worker's batch policy and the prefetch it needs.
pub struct Sizing<T> {
    pub policy: Box<dyn BatchPolicy<T>>,
    pub prefetch: u16,
}

/// The batch policy the configuration asks for, and the prefetch it needs (three batches of the
/// largest size it would admit for short jobs, unless `amqp.prefetch` is set).
pub fn worker_policy<T: Send + 'static>(cfg: &Config, manifest: &Manifest, device: Device, precision: Precision) -> Result<Sizing<T>, SizingError> {
    let b = &cfg.batching;
    match cfg.memory.policy {
        SizingPolicy::Tokens => {
            info!(max_batch = b.max_batch, max_batch_tokens = b.max_batch_tokens, "batch sizing: padded-token cap");
            let policy = LengthBucketing::new(b.max_batch, b.max_wait, b.max_batch_tokens).with_max_length_ratio(b.max_length_ratio);
            Ok(Sizing { policy: Box::new(policy), prefetch: cfg.amqp.effective_prefetch(b.max_batch) })
        }
        SizingPolicy::Memory => {
            let (admission, _) = memory_admission(cfg, manifest, device, precision)?;
            let short_batch = admission.largest_batch(16, b.max_batch);
            let prefetch = cfg.amqp.effective_prefetch(short_batch);
            let policy = LengthBucketing::with_admission(b.max_batch, b.max_wait, admission).with_max_length_ratio(b.max_length_ratio);
            Ok(Sizing { policy: Box::new(policy), prefetch })
        }
    }
}

/// The memory budget for `device` around the matching calibration profile (or the built-in),
/// and that profile.
pub fn memory_admission(cfg: &Config, manifest: &Manifest, device: Device, precision: Precision) -> Result<(MemoryBudget, Profile), SizingError> {
    let m = &cfg.memory;
    let info = match (crate::gpu::memory_info(device), m.budget_bytes) {
        (Ok(i), _) => Some(i),
        (Err(_), Some(_)) => None,
        (Err(source), None) => return Err(SizingError::NoDeviceMemory { device, source }),
    };
    let gpu_name = match (&info, device) {
        (Some(i), _) => i.name.clone(),
        (None, Device::Cpu) => "cpu".to_string(),
        (None, Device::Cuda(_)) => "unknown-gpu".to_string(),
    };
    let budget = match (m.budget_bytes, &info) {
        (Some(bytes), _) => bytes as f64,
        (None, Some(i)) => m.vram_fraction * i.total_bytes as f64 - i.used_by_others_bytes as f64 - m.safety_margin_bytes as f64,
        (None, None) => 0.0,
    };
    if budget <= 0.0 {
        return Err(SizingError::NoBudget {
            gpu: gpu_name,
            fraction: m.vram_fraction * 100.0,
            total: info.as_ref().map(|i| i.total_bytes).unwrap_or(0),
            others: info.as_ref().map(|i| i.used_by_others_bytes).unwrap_or(0),
            budget,
        });
    }
    let precision = precision.to_string();
    let profile = match profile::load_matching(&m.calibration_dir, &manifest.name, &gpu_name, &precision)? {
        Some(p) => {
            info!(model = %manifest.name, gpu = %gpu_name, %precision, r2 = p.fit.r2, worst_rel_error = p.fit.worst_rel_error, "using calibration profile");
            p
        }
        None => {
            warn!(
                "no calibration profile for model {} on {gpu_name} {precision} in {}; using a conservative built-in. \
                 Run `voxbatch calibrate --model {} --device {device} --precision {precision}` for full batches",
                manifest.name,
                m.calibration_dir.display(),
                manifest.dir.display()
            );
            Profile::builtin(&manifest.name, &gpu_name, &precision, manifest.frames_per_token, manifest.samples_per_frame, manifest.weights_bytes())
        }
    };
    let admission = MemoryBudget::new(profile.fit.model, manifest.frames_per_token as usize, budget, cfg.batching.max_batch_tokens, m.aimd);
    info!(budget_bytes = budget as u64, gpu = %gpu_name, source = %profile.source, "batch sizing: predicted peak memory under budget");
    Ok((admission, profile))
}

/// How a profile reads in a bench table.
pub fn describe(profile: &Profile) -> String {
    if profile.source == "built-in" {
        "built-in (no calibration)".to_string()
    } else {
        format!("calibrated {} (R² {:.4}, worst error {:.1}%)", profile.created_at, profile.fit.r2, profile.fit.worst_rel_error * 100.0)
    }
}
