//! The model seam: a model directory, its manifest, its tokenizer, and inference on a dedicated
//! thread.
//!
//! A model directory holds `model.toml` (the [`Manifest`]) and the weights its `kind` names:
//! `model.pt` (TorchScript, kind `torchscript`, the reference CNN) or safetensors (kinds
//! `cosyvoice2-token2wav` and `cosyvoice2`, [`cosyvoice2`]; the latter adds the LLM and takes text
//! jobs). [`ModelHandle::spawn`] loads it on its own OS thread (libtorch calls block) and serves
//! batches sent from async code; every model implements [`Synthesizer`]. A batch's items may fail
//! one by one ([`ItemAudio`]), and a model with stages says where its time went ([`StageTime`])
//! and which kernels its flow steps ran on ([`kernels`]: a [`compiled`] package or the eager port).
//!
//! Neighbours: `sizing` sizes batches from the manifest (frames per token, weights);
//! `worker::infer` sends each batch here; `worker::commit` hands the audio to `audio`.

pub mod compiled;
pub mod cosyvoice2;
mod manifest;
pub mod memory;
pub mod cuda_graph;
pub mod profiler;
pub(crate) mod shim;
mod torchscript;

use std::fmt;
use std::str::FromStr;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

pub use cosyvoice2::tts::TextInput;
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

impl<'de> serde::Deserialize<'de> for Precision {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Precision, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
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

/// One item of a batch: token ids and the index of its voice — in [`Manifest::voices`] for a
/// TorchScript model; for CosyVoice2, in the model thread's voice table, which a worker's
/// `voice::VoiceBook` fills from Postgres (the directory's own voices until then) — and, for a
/// text job of a `cosyvoice2` model, its prepared text (segments) instead of tokens.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SynthItem {
    pub tokens: Vec<i64>,
    pub voice: i64,
    pub text: Option<std::sync::Arc<TextInput>>,
}

impl SynthItem {
    /// An item of tokens (text tokens or speech tokens, as the model takes).
    pub fn tokens(tokens: Vec<i64>, voice: i64) -> SynthItem {
        SynthItem { tokens, voice, text: None }
    }

    /// Input tokens: its tokens, or a text item's text tokens over all its segments.
    pub fn len(&self) -> usize {
        self.text.as_ref().map_or(self.tokens.len(), |t| t.text_tokens())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One item's audio (a text job's segments as pieces, joined where it is encoded), or why that
/// item alone failed (the batch's other items are unaffected).
pub type ItemAudio = Result<crate::audio::Waveform, String>;

/// A stage of a model with several (CosyVoice2: the speech-token LM, then token2wav).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Stage {
    Llm,
    Token2Wav,
}

impl Stage {
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Llm => "llm",
            Stage::Token2Wav => "token2wav",
        }
    }
}

/// Device time one stage took over a batch, and what it processed (segments, tokens out); for
/// token2wav also how its compilable calls ran — each flow estimator step and each vocoder body,
/// on a compiled package or the eager port (`*_steps` counts calls of both).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StageTime {
    pub stage: Stage,
    pub seconds: f64,
    pub items: u64,
    pub tokens: u64,
    pub compiled_steps: u64,
    pub eager_steps: u64,
}

impl StageTime {
    /// No work yet.
    pub fn idle(stage: Stage) -> StageTime {
        StageTime { stage, seconds: 0.0, items: 0, tokens: 0, compiled_steps: 0, eager_steps: 0 }
    }
}

/// Which kernels a batch's compilable calls (estimator steps, vocoder bodies) ran on: `compiled`,
/// `eager`, `mixed` (calls of both: a stage without a package, or parts outside a package's
/// limits), or `None` for a model without such calls.
pub fn kernels(stages: &[StageTime]) -> Option<&'static str> {
    let (compiled, eager) = stages.iter().fold((0, 0), |(c, e), s| (c + s.compiled_steps, e + s.eager_steps));
    match (compiled > 0, eager > 0) {
        (true, true) => Some("mixed"),
        (true, false) => Some("compiled"),
        (false, true) => Some("eager"),
        (false, false) => None,
    }
}

/// Adds `more` into `into`, one entry per stage.
pub fn add_stages(into: &mut Vec<StageTime>, more: &[StageTime]) {
    for m in more {
        match into.iter_mut().find(|s| s.stage == m.stage) {
            Some(s) => {
                s.seconds += m.seconds;
                s.items += m.items;
                s.tokens += m.tokens;
                s.compiled_steps += m.compiled_steps;
                s.eager_steps += m.eager_steps;
            }
            None => into.push(*m),
        }
    }
    into.sort_by_key(|s| s.stage);
}

/// The result of one batch: audio per item (trimmed to its own length) and timings.
#[derive(Debug)]
pub struct SynthOutput {
    pub audio: Vec<ItemAudio>,
    /// Wall time of the forward pass, device synchronised.
    pub infer: Duration,
    /// Peak memory of the forward pass (CUDA: allocated bytes; CPU: process resident bytes).
    pub peak_bytes: Option<u64>,
    /// Where the time went, for models with stages (empty otherwise).
    pub stages: Vec<StageTime>,
}

/// A loaded model that turns a batch of token sequences into waveforms.
pub trait Synthesizer {
    fn manifest(&self) -> &Manifest;
    /// Runs one padded batch. Implementations trim each output to its item's length.
    fn synthesize(&mut self, items: &[SynthItem]) -> Result<Vec<Vec<f32>>, ModelError>;
    /// Runs one batch whose items may fail alone: what the inference thread calls. `Err` fails
    /// the whole batch (out of memory above all: the caller splits it).
    fn synthesize_items(&mut self, items: &[SynthItem]) -> Result<Vec<ItemAudio>, ModelError> {
        Ok(self.synthesize(items)?.into_iter().map(|a| Ok(a.into())).collect())
    }
    /// Where the time of the calls since the last `take_stages` went, per stage (empty for a
    /// model of one stage).
    fn take_stages(&mut self) -> Vec<StageTime> {
        Vec::new()
    }
    /// Sequences the speech-token LM decodes at once (models with an LLM).
    fn llm_slots(&self) -> Option<usize> {
        None
    }
    /// Puts a voice at `index` (replacing, or appending at the end): models whose voices come
    /// from Postgres (CosyVoice2). Others keep the voices their directory fixes.
    fn set_voice(&mut self, index: usize, prompt: &crate::voice::prompt::VoicePrompt) -> Result<(), ModelError> {
        let _ = (index, prompt);
        Err(ModelError::BadInput(format!("a {} model's voices are fixed by its directory", self.manifest().kind.as_str())))
    }
}

/// What loading a model needs besides its directory, device and precision.
#[derive(Default)]
pub struct LoadOptions {
    /// libtorch's CPU threads (0: its default).
    pub cpu_threads: usize,
    /// Kind `cosyvoice2`: the LLM's slots and token2wav's batches (`sizing::text_plan`); `None`
    /// gives `cosyvoice2::tts::TextPlan::small` over the built-in `[llm]` settings.
    pub text: Option<cosyvoice2::tts::TextPlan>,
}

/// Loads a model directory for `device` and `precision`: the one model loader.
pub fn load(dir: &std::path::Path, device: Device, precision: Precision, text: Option<cosyvoice2::tts::TextPlan>) -> Result<Box<dyn Synthesizer>, ModelError> {
    let manifest = Manifest::load(dir)?;
    match manifest.kind {
        ModelKind::TorchScript => Ok(Box::new(TorchScriptModel::load(dir, manifest, device, precision)?)),
        ModelKind::Cosyvoice2Token2Wav => Ok(Box::new(cosyvoice2::Token2Wav::load(dir, manifest, device, precision)?)),
        ModelKind::Cosyvoice2 => {
            let plan = match text {
                Some(plan) => plan,
                None => {
                    let defaults = crate::config::Config::defaults()
                        .map_err(|e| ModelError::Manifest { dir: dir.display().to_string(), reason: format!("built-in [llm] settings: {e}") })?;
                    cosyvoice2::tts::TextPlan::small(defaults.llm)
                }
            };
            Ok(Box::new(cosyvoice2::tts::TextToSpeech::load(dir, device, precision, plan)?))
        }
    }
}

/// What the inference thread is asked, in order: a voice set before a batch that uses it is
/// there when that batch runs.
enum Request {
    Batch(Vec<SynthItem>, oneshot::Sender<Result<SynthOutput, ModelError>>),
    SetVoice(usize, Box<crate::voice::prompt::VoicePrompt>, oneshot::Sender<Result<(), ModelError>>),
}

/// Handle to the inference thread. Cheap to clone; the thread ends when every handle is dropped.
#[derive(Clone)]
pub struct ModelHandle {
    tx: tokio::sync::mpsc::Sender<Request>,
    manifest: std::sync::Arc<Manifest>,
    device: Device,
    precision: Precision,
    llm_slots: Option<usize>,
}

impl ModelHandle {
    /// Starts the inference thread and loads the model on it. Returns once the model is loaded.
    pub fn spawn(dir: &std::path::Path, device: Device, precision: Precision, options: LoadOptions) -> Result<ModelHandle, ModelError> {
        let LoadOptions { cpu_threads, text } = options;
        // One request waits while one runs: async senders wait for room without blocking.
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Request>(1);
        let (ready_tx, ready_rx) = mpsc::sync_channel::<Result<(Manifest, Option<usize>), ModelError>>(1);
        let dir = dir.to_path_buf();
        std::thread::Builder::new()
            .name(format!("voxbatch-infer-{device}"))
            .spawn(move || {
                if cpu_threads > 0 {
                    tch::set_num_threads(cpu_threads as i32);
                }
                let mut model = match load(&dir, device, precision, text) {
                    Ok(m) => {
                        let _ = ready_tx.send(Ok((m.manifest().clone(), m.llm_slots())));
                        m
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let probe = memory::MemoryProbe::new(device);
                while let Some(request) = rx.blocking_recv() {
                    let (items, reply) = match request {
                        Request::Batch(items, reply) => (items, reply),
                        Request::SetVoice(index, prompt, reply) => {
                            let _ = reply.send(model.set_voice(index, &prompt));
                            continue;
                        }
                    };
                    probe.reset();
                    let started = Instant::now();
                    let result = model.synthesize_items(&items);
                    let infer = started.elapsed();
                    let peak_bytes = probe.peak();
                    let stages = model.take_stages();
                    if matches!(result, Err(ModelError::OutOfMemory { .. })) {
                        probe.release_cached();
                    }
                    let _ = reply.send(result.map(|audio| SynthOutput { audio, infer, peak_bytes, stages }));
                }
            })
            .map_err(|e| ModelError::DeviceUnavailable { device, reason: format!("cannot start inference thread: {e}") })?;
        let (manifest, llm_slots) = ready_rx.recv().map_err(|_| ModelError::ThreadGone)??;
        Ok(ModelHandle { tx, manifest: std::sync::Arc::new(manifest), device, precision, llm_slots })
    }

    /// [`ModelHandle::spawn`] from async code.
    pub async fn load(dir: &std::path::Path, device: Device, precision: Precision, options: LoadOptions) -> Result<ModelHandle, ModelError> {
        let dir = dir.to_path_buf();
        tokio::task::spawn_blocking(move || ModelHandle::spawn(&dir, device, precision, options))
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
    /// The slots the model's LLM was sized with (`sizing::text_plan`), for models with an LLM.
    pub fn llm_slots(&self) -> Option<usize> {
        self.llm_slots
    }

    /// Runs one batch on the inference thread.
    pub async fn synthesize(&self, items: Vec<SynthItem>) -> Result<SynthOutput, ModelError> {
        let (reply_tx, reply_rx) = oneshot::channel();
        self.tx.send(Request::Batch(items, reply_tx)).await.map_err(|_| ModelError::ThreadGone)?;
        reply_rx.await.map_err(|_| ModelError::ThreadGone)?
    }

    /// Sets voice `index` on the inference thread ([`Synthesizer::set_voice`]); batches sent
    /// after this returns see it.
    pub async fn set_voice(&self, index: usize, prompt: crate::voice::prompt::VoicePrompt) -> Result<(), ModelError> {
        let (reply_tx, reply_rx) = oneshot::channel();
        self.tx.send(Request::SetVoice(index, Box::new(prompt), reply_tx)).await.map_err(|_| ModelError::ThreadGone)?;
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
