//! `[model]`: which model directory runs where, at which precision.

use std::path::PathBuf;

use serde::Deserialize;

use super::ConfigError;
use crate::model::cosyvoice2::flow_graphs::FlowGraphSettings;
use crate::model::{Device, Precision};

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
}

#[derive(Debug, Clone)]
pub struct ModelConfig {
    pub dir: PathBuf,
    pub device: Device,
    pub precision: Precision,
    pub cpu_threads: usize,
    /// CosyVoice2: small batches' compiled flow steps as CUDA graphs (`flow_graphs` kept at most,
    /// each of at most `flow_graph_max_frames` rows × frames).
    pub flow_graphs: FlowGraphSettings,
    /// On CUDA: cuDNN searches each convolution's fastest algorithm for every new input shape
    /// (`cudnn.benchmark`, process-wide); memory profiles are filed apart (`+cudnn-benchmark`).
    pub cudnn_benchmark: bool,
}

impl RawModel {
    pub fn validate(self) -> Result<ModelConfig, ConfigError> {
        Ok(ModelConfig {
            dir: self.dir,
            device: self.device.parse().map_err(|e: crate::model::ParseError| ConfigError::Invalid { key: "model.device", reason: e.to_string() })?,
            precision: self.precision.parse().map_err(|e: crate::model::ParseError| ConfigError::Invalid { key: "model.precision", reason: e.to_string() })?,
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
        })
    }
}
