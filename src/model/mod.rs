//! The model seam: a model directory, its manifest, its tokenizer, and inference on a dedicated
//! thread.
//!
//! A model directory holds `model.toml` (the [`Manifest`]) and the weights its `kind` names:
//! `model.pt` (TorchScript, kind `torchscript`, the reference CNN) or safetensors (kind
//! `cosyvoice2-token2wav`, [`cosyvoice2`]). [`ModelHandle::spawn`] loads it on its own OS thread
//! (libtorch calls block) and serves batches sent from async code; every model implements
//! [`Synthesizer`].
//!
//! Neighbours: `sizing` sizes batches from the manifest (frames per token, weights);
//! `worker::infer` sends each batch here; `worker::commit` hands the audio to `audio`.

pub mod cosyvoice2;
mod manifest;
pub mod memory;
pub mod cuda_graph;
pub(crate) mod shim;
mod torchscript;

use std::fmt;
use std::str::FromStr;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

pub use manifest::{Cosyvoice2Dims, LlmDims, Manifest, ModelKind, TokenizerSpec};
pub use torchscript::TorchScriptModel;

/// Where inference runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    Cpu,
    Cuda(usize),
}

/// A value that is not a device or a precision.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{value}` is not a {what}: use {expected}")]
pub struct ParseError {
    pub value: String,
    pub what: &'static str,
    pub expected: &'static str,
}

impl FromStr for Device {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, ParseError> {
        match s.trim() {
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda(0)),
            other => other
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Device::Cuda)
                .ok_or_else(|| ParseError { value: other.to_string(), what: "device", expected: "cpu or cuda:N" }),
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

impl Device {
    pub fn to_tch(self) -> tch::Device {
        match self {
            Device::Cpu => tch::Device::Cpu,
            Device::Cuda(n) => tch::Device::Cuda(n),
        }
    }
}

/// Numeric precision of inference. Weights stay fp32; fp16/bf16 run under autocast with that
/// dtype; tf32 lets fp32 matmuls and convolutions use TF32 tensor cores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    Fp32,
    Tf32,
    Fp16,
    Bf16,
}

impl FromStr for Precision {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, ParseError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "fp32" | "float32" => Ok(Precision::Fp32),
            "tf32" => Ok(Precision::Tf32),
            "fp16" | "float16" | "half" => Ok(Precision::Fp16),
            "bf16" | "bfloat16" => Ok(Precision::Bf16),
            other => Err(ParseError { value: other.to_string(), what: "precision", expected: "fp32, tf32, fp16 or bf16" }),
        }
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Precision::Fp32 => "fp32",
            Precision::Tf32 => "tf32",
            Precision::Fp16 => "fp16",
            Precision::Bf16 => "bf16",
        })
    }
}

/// Errors of the model stage.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    #[error("model directory {dir}: {reason}")]
    Manifest { dir: String, reason: String },
    #[error("cannot load model weights from {path}")]
    Load { path: String, source: tch::TchError },
    #[error("device {device} is not available: {reason}")]
    DeviceUnavailable { device: Device, reason: String },
    #[error("precision {precision} is not supported on {device}: {reason}")]
    PrecisionUnsupported { precision: Precision, device: Device, reason: String },
    #[error("inference failed")]
    Inference(#[source] tch::TchError),
    #[error("device out of memory running a batch of {batch_size}")]
    OutOfMemory { batch_size: usize, source: tch::TchError },
    #[error("the batch cannot be run: {0}")]
    BadInput(String),
    #[error("model returned an unexpected output: {0}")]
    BadOutput(String),
    #[error("the inference thread has stopped")]
    ThreadGone,
    #[error(transparent)]
    Shim(#[from] shim::ShimError),
}

impl ModelError {
    /// True when the error is the device running out of memory (retrying smaller may work).
    pub fn is_oom(&self) -> bool {
        matches!(self, ModelError::OutOfMemory { .. })
    }
}

/// One item of a batch: token ids and the index of its voice in [`Manifest::voices`].
#[derive(Debug, Clone, PartialEq)]
pub struct SynthItem {
    pub tokens: Vec<i64>,
    pub voice: i64,
}

/// The result of one batch: audio per item (trimmed to its own length) and timings.
#[derive(Debug)]
pub struct SynthOutput {
    pub audio: Vec<Vec<f32>>,
    /// Wall time of the forward pass, device synchronised.
    pub infer: Duration,
    /// Peak memory of the forward pass (CUDA: allocated bytes; CPU: process resident bytes).
    pub peak_bytes: Option<u64>,
}

/// A loaded model that turns a batch of token sequences into waveforms.
pub trait Synthesizer {
    fn manifest(&self) -> &Manifest;
    /// Runs one padded batch. Implementations trim each output to its item's length.
    fn synthesize(&mut self, items: &[SynthItem]) -> Result<Vec<Vec<f32>>, ModelError>;
}

/// Loads a model directory for `device` and `precision`.
pub fn load(dir: &std::path::Path, device: Device, precision: Precision) -> Result<Box<dyn Synthesizer>, ModelError> {
    let manifest = Manifest::load(dir)?;
    match manifest.kind {
        ModelKind::TorchScript => Ok(Box::new(TorchScriptModel::load(dir, manifest, device, precision)?)),
        ModelKind::Cosyvoice2Token2Wav => Ok(Box::new(cosyvoice2::Token2Wav::load(dir, manifest, device, precision)?)),
    }
}

type Request = (Vec<SynthItem>, oneshot::Sender<Result<SynthOutput, ModelError>>);

/// Handle to the inference thread. Cheap to clone; the thread ends when every handle is dropped.
#[derive(Clone)]
pub struct ModelHandle {
    tx: tokio::sync::mpsc::Sender<Request>,
    manifest: std::sync::Arc<Manifest>,
    device: Device,
    precision: Precision,
}

impl ModelHandle {
    /// Starts the inference thread and loads the model on it. Returns once the model is loaded.
    pub fn spawn(dir: &std::path::Path, device: Device, precision: Precision, cpu_threads: usize) -> Result<ModelHandle, ModelError> {
        // One request waits while one runs: async senders wait for room without blocking.
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Request>(1);
        let (ready_tx, ready_rx) = mpsc::sync_channel::<Result<Manifest, ModelError>>(1);
        let dir = dir.to_path_buf();
        std::thread::Builder::new()
            .name(format!("voxbatch-infer-{device}"))
            .spawn(move || {
                if cpu_threads > 0 {
                    tch::set_num_threads(cpu_threads as i32);
                }
                let mut model = match load(&dir, device, precision) {
                    Ok(m) => {
                        let _ = ready_tx.send(Ok(m.manifest().clone()));
                        m
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let probe = memory::MemoryProbe::new(device);
                while let Some((items, reply)) = rx.blocking_recv() {
                    probe.reset();
                    let started = Instant::now();
                    let result = model.synthesize(&items);
                    let infer = started.elapsed();
                    let peak_bytes = probe.peak();
                    if matches!(result, Err(ModelError::OutOfMemory { .. })) {
                        probe.release_cached();
                    }
                    let _ = reply.send(result.map(|audio| SynthOutput { audio, infer, peak_bytes }));
                }
            })
            .map_err(|e| ModelError::DeviceUnavailable { device, reason: format!("cannot start inference thread: {e}") })?;
        let manifest = ready_rx.recv().map_err(|_| ModelError::ThreadGone)??;
        Ok(ModelHandle { tx, manifest: std::sync::Arc::new(manifest), device, precision })
    }

    /// [`ModelHandle::spawn`] from async code.
    pub async fn load(dir: &std::path::Path, device: Device, precision: Precision, cpu_threads: usize) -> Result<ModelHandle, ModelError> {
        let dir = dir.to_path_buf();
        tokio::task::spawn_blocking(move || ModelHandle::spawn(&dir, device, precision, cpu_threads))
            .await
            .map_err(|_| ModelError::ThreadGone)?
    }

    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }
    pub fn device(&self) -> Device {
        self.device
    }
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// Runs one batch on the inference thread.
    pub async fn synthesize(&self, items: Vec<SynthItem>) -> Result<SynthOutput, ModelError> {
        let (reply_tx, reply_rx) = oneshot::channel();
        self.tx.send((items, reply_tx)).await.map_err(|_| ModelError::ThreadGone)?;
        reply_rx.await.map_err(|_| ModelError::ThreadGone)?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_and_precisions_parse() {
        assert_eq!("cpu".parse::<Device>().unwrap(), Device::Cpu);
        assert_eq!("cuda:3".parse::<Device>().unwrap(), Device::Cuda(3));
        assert!("gpu".parse::<Device>().is_err());
        assert_eq!("BF16".parse::<Precision>().unwrap(), Precision::Bf16);
        assert!("int8".parse::<Precision>().is_err());
        assert_eq!(Device::Cuda(1).to_string(), "cuda:1");
    }
}
