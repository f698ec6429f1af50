//! `[model]`: which model directory runs where, at which precision.

use std::path::PathBuf;

use serde::Deserialize;

use super::ConfigError;
use crate::device::{Device, Precision};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawModel {
    pub dir: PathBuf,
    pub device: String,
    pub precision: String,
    pub cpu_threads: i64,
    pub flow_graphs: i64,
    pub flow_graph_max_frames: i64,
    pub cudnn_benchmark: bool,
    pub cudnn_attention: bool,
    pub profile_batch: i64,
    pub profile_dir: PathBuf,
}

#[derive(Debug, Clone)]
pub struct ModelConfig {
    pub dir: PathBuf,
    pub device: Device,
    pub precision: Precision,
    pub cpu_threads: usize,
    /// CosyVoice2 and CosyVoice3: small batches' compiled flow steps as CUDA graphs (`flow_graphs` kept at most,
    /// each of at most `flow_graph_max_frames` rows × frames).
    pub flow_graphs: FlowGraphSettings,
    /// On CUDA: cuDNN searches each convolution's fastest algorithm for every new input shape
    /// (`cudnn.benchmark`, process-wide); memory profiles are filed apart (`+cudnn-benchmark`).
    pub cudnn_benchmark: bool,
    /// On CUDA: attention may run as cuDNN's (`scaled_dot_product_attention`'s backends,
    /// process-wide); off, it runs FlashAttention or the memory-efficient kernels.
    pub cudnn_attention: bool,
    /// `profile_batch` > 0: that batch of each inference thread runs under libtorch's profiler.
    pub profile: Option<BatchProfile>,
}

/// `[model] profile_batch` and `profile_dir`: which batch of an inference thread (1 = its first)
/// runs under libtorch's profiler, and where its tables go (`model::handle`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchProfile {
    pub batch: u64,
    pub dir: PathBuf,
}

impl RawModel {
    pub fn validate(self) -> Result<ModelConfig, ConfigError> {
        Ok(ModelConfig {
            dir: self.dir,
            device: self.device.parse().map_err(|e: crate::device::ParseError| ConfigError::Invalid { key: "model.device", reason: e.to_string() })?,
            precision: self.precision.parse().map_err(|e: crate::device::ParseError| ConfigError::Invalid { key: "model.precision", reason: e.to_string() })?,
            cpu_threads: usize::try_from(self.cpu_threads).map_err(|_| ConfigError::Invalid { key: "model.cpu_threads", reason: "must be >= 0".into() })?,
            flow_graphs: FlowGraphSettings {
                graphs: usize::try_from(self.flow_graphs).map_err(|_| ConfigError::Invalid { key: "model.flow_graphs", reason: "must be >= 0".into() })?,
                max_frames: if self.flow_graph_max_frames > 0 {
                    self.flow_graph_max_frames
                } else {
                    return Err(ConfigError::Invalid { key: "model.flow_graph_max_frames", reason: "must be > 0".into() });
                },
            },
            cudnn_benchmark: self.cudnn_benchmark,
            cudnn_attention: self.cudnn_attention,
            profile: match u64::try_from(self.profile_batch) {
                Ok(0) => None,
                Ok(batch) => Some(BatchProfile { batch, dir: self.profile_dir }),
                Err(_) => return Err(ConfigError::Invalid { key: "model.profile_batch", reason: "must be >= 0".into() }),
            },
        })
    }
}

/// `[model] flow_graphs` and `[model] flow_graph_max_frames`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowGraphSettings {
    /// Step graphs kept at most (0: none captured).
    pub graphs: usize,
    /// The largest step captured: rows (the doubled batch) × mel frames.
    pub max_frames: i64,
}

impl FlowGraphSettings {
    pub const OFF: FlowGraphSettings = FlowGraphSettings { graphs: 0, max_frames: 0 };

    /// The most device memory the graphs hold, which batches cannot use: each graph's input
    /// buffers and output (x, mu, cond, out: 4 × rows × frames × 80 fp32), and the shared pool's
    /// activations of one call at the largest shape (bounded by [`ACTIVATION_BYTES_PER_FRAME`] (`model::cosyvoice2::flow_graphs` captures the graphs)).
    pub fn reserve_bytes(&self) -> u64 {
        if self.graphs == 0 {
            return 0;
        }
        let frames = self.max_frames.max(0) as u64;
        self.graphs as u64 * 4 * frames * 80 * 4 + frames * ACTIVATION_BYTES_PER_FRAME
    }
}

/// An estimator call's live activations per row × frame, generously: CosyVoice2's estimator keeps
/// 256 channels (fp32 residual stream, bf16 projections, a 1,024-wide feed-forward) and a causal
/// convolution's three taps side by side — a few kilobytes; 16 KiB bounds it.
const ACTIVATION_BYTES_PER_FRAME: u64 = 16 * 1024;

/// None (libraries and tests; the worker takes `[model]`'s).
impl Default for FlowGraphSettings {
    fn default() -> FlowGraphSettings {
        FlowGraphSettings::OFF
    }
}
