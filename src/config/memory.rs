//! `[memory]`: the memory-aware batch policy's budget and safety factor.

use std::path::PathBuf;

use serde::Deserialize;

use super::check::{fraction, non_negative, positive};
use super::ConfigError;
use crate::batch::memory::Aimd;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMemory {
    pub policy: String,
    pub vram_fraction: f64,
    pub budget_bytes: i64,
    pub safety_margin_bytes: i64,
    pub safety_initial: f64,
    pub oom_backoff: f64,
    pub recover_step: f64,
    pub recover_after: i64,
    pub calibration_dir: PathBuf,
}

/// How batches are sized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SizingPolicy {
    /// Predicted peak memory under a budget.
    Memory,
    /// Padded tokens only.
    Tokens,
}

/// The memory-aware batch policy's settings.
#[derive(Debug, Clone)]
pub struct MemoryConfig {
    pub policy: SizingPolicy,
    pub vram_fraction: f64,
    /// Fixed budget instead of the fraction.
    pub budget_bytes: Option<u64>,
    pub safety_margin_bytes: u64,
    pub aimd: Aimd,
    pub calibration_dir: PathBuf,
}

impl RawMemory {
    pub fn validate(self) -> Result<MemoryConfig, ConfigError> {
        Ok(MemoryConfig {
            policy: match self.policy.as_str() {
                "memory" => SizingPolicy::Memory,
                "tokens" => SizingPolicy::Tokens,
                other => return Err(ConfigError::Invalid { key: "memory.policy", reason: format!("`{other}`: use memory or tokens") }),
            },
            vram_fraction: fraction("memory.vram_fraction", self.vram_fraction)?,
            budget_bytes: Some(non_negative("memory.budget_bytes", self.budget_bytes)?).filter(|b| *b > 0),
            safety_margin_bytes: non_negative("memory.safety_margin_bytes", self.safety_margin_bytes)?,
            aimd: Aimd {
                initial: fraction("memory.safety_initial", self.safety_initial)?,
                backoff: fraction("memory.oom_backoff", self.oom_backoff)?,
                step: fraction("memory.recover_step", self.recover_step)?,
                recover_after: u32::try_from(positive("memory.recover_after", self.recover_after)?).unwrap_or(u32::MAX),
                floor: 0.2,
            },
            calibration_dir: self.calibration_dir,
        })
    }
}
