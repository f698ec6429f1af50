//! The model seam: a model directory, its manifest, its tokenizer, and inference on a dedicated
//! thread.
//!
//! A model directory holds `model.toml` (the [`Manifest`]) and the weights its `kind` names:
//! `model.pt` (TorchScript, kind `torchscript`, the reference CNN) or safetensors (kinds
//! `cosyvoice2-token2wav` and `cosyvoice2`, [`cosyvoice2`]; kinds `cosyvoice3-token2wav` and
//! `cosyvoice3`, [`cosyvoice3`]; the whole kinds add the LLM and take text jobs through [`tts`]).
//! A model family's folder holds what is its own; what the families share sits beside them:
//! [`layers`], [`weights`], [`pre_lookahead`], [`flow_matching`], [`vocoder`], [`token2wav`],
//! [`flow_graphs`], [`tts`]. [`load`] is the one loader (a family's token2wav half:
//! [`family_token2wav`]).
//! [`ModelHandle::start`] (`handle.rs`) loads it on its own OS thread (libtorch calls block), returning
//! before the load is over ([`ModelHandle::spawn`] waits for it), and serves batches sent from
//! async code; every model implements [`Synthesizer`]. A batch's items may fail
//! one by one ([`ItemAudio`]), and a model with stages says where its time went ([`StageTime`])
//! and which kernels its flow steps ran on ([`kernels`]: a [`compiled`] package or the eager port).
//!
//! Neighbours: `sizing` sizes batches from the manifest (frames per token, weights);
//! `worker::infer` sends each batch here; `worker::commit` hands the audio to `audio`.

pub mod compiled;
pub mod cosyvoice2;
pub mod cosyvoice3;
pub mod cuda_graph;
pub mod cuda_stream;
pub mod flow_graphs;
pub mod flow_matching;
mod input;
pub mod layers;
pub mod llm;
mod handle;
mod manifest;
pub mod memory;
pub mod pre_lookahead;
pub mod profiler;
pub(crate) use crate::torch_shim as shim;
pub mod tch_panic;
pub mod token2wav;
pub mod tts;
mod torchscript;
pub mod vocoder;
pub mod voice_prompt;
pub mod weights;

use std::time::Duration;


pub use crate::device::{Device, ParseError, Precision};
pub use handle::ModelHandle;
pub use input::{model_input, ModelInput};
pub use voice_prompt::VoicePrompt;
pub use tts::TextInput;
pub use manifest::{Cosyvoice2Dims, Cosyvoice3Dims, LlmDims, Manifest, ModelKind, TokenizerSpec};
pub use torchscript::TorchScriptModel;

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
    /// The model's load on its inference thread failed (every later call says so).
    #[error("the model did not load")]
    NotLoaded(#[source] std::sync::Arc<ModelError>),
    #[error(transparent)]
    Shim(#[from] shim::ShimError),
}

impl ModelError {
    /// True when the error is the device running out of memory (retrying smaller may work).
    pub fn is_oom(&self) -> bool {
        matches!(self, ModelError::OutOfMemory { .. })
    }

    /// True when the GPU itself failed running the batch — a CUDA, cuBLAS or cuDNN error other than
    /// out-of-memory (an execution failure, an illegal address, a launch failure). That is no job's
    /// fault, and the CUDA context may be unusable from here on: the worker gives its work back and
    /// stops rather than fail jobs one by one (`worker::infer`). On an H100 on 2026-12-07 a worker
    /// whose decode ran on a green context of 12 SMs failed a job this way
    /// (docs/PERFORMANCE.md#2026-12-07-h100l-e2e).
    pub fn is_device_fault(&self) -> bool {
        if self.is_oom() {
            return false;
        }
        let mut text = self.to_string();
        let mut source = std::error::Error::source(self);
        while let Some(cause) = source {
            text.push_str(&cause.to_string());
            source = cause.source();
        }
        if text.contains("out of memory") {
            return false;
        }
        DEVICE_FAULTS.iter().any(|marker| text.contains(marker))
    }
}

/// What libtorch's messages say when the GPU failed (CUDA's runtime errors, cuBLAS's and cuDNN's
/// statuses); out-of-memory is told apart before.
const DEVICE_FAULTS: &[&str] = &["CUDA error", "CUBLAS_STATUS_", "CUDNN_STATUS_", "cuDNN error", "an illegal memory access", "unspecified launch failure"];

/// One item of a batch: token ids and the index of its voice — in [`Manifest::voices`] for a
/// TorchScript model; for CosyVoice2, in the model thread's voice table, which a worker's
/// `voice::VoiceBook` fills from Postgres (the directory's own voices until then) — and, for a
/// text job of a `cosyvoice2` model, its prepared text (segments) instead of tokens.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SynthItem {
    pub tokens: Vec<i64>,
    pub voice: i64,
    pub text: Option<std::sync::Arc<TextInput>>,
    /// The job's `speed` (CosyVoice2: each segment's mel stretched to frames / speed before the
    /// vocoder); `None`: 1.
    pub speed: Option<f64>,
}

impl SynthItem {
    /// An item of tokens (text tokens or speech tokens, as the model takes).
    pub fn tokens(tokens: Vec<i64>, voice: i64) -> SynthItem {
        SynthItem { tokens, voice, text: None, speed: None }
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
    /// Drops what the model holds on the device beyond its weights and can make again
    /// (CosyVoice2's and CosyVoice3's flow step graphs). The model thread calls it after a whole batch ran out of
    /// memory, before giving the caching allocator's free blocks back.
    fn release_memory(&self) {}
    /// Puts a voice at `index` (replacing, or appending at the end): models whose voices come
    /// from Postgres (CosyVoice2). Others keep the voices their directory fixes.
    fn set_voice(&mut self, index: usize, prompt: &VoicePrompt) -> Result<(), ModelError> {
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
    /// gives `tts::TextPlan::small` over the built-in `[llm]` settings.
    pub text: Option<tts::TextPlan>,
    /// CosyVoice2 and CosyVoice3 kinds: small batches' compiled flow steps as CUDA graphs
    /// (`[model] flow_graphs`; default none).
    pub flow_graphs: flow_graphs::FlowGraphSettings,
    /// On CUDA, cuDNN's per-shape algorithm search (`[model] cudnn_benchmark`; process-wide).
    pub cudnn_benchmark: bool,
    /// On CUDA, whether attention may run as cuDNN's (`[model] cudnn_attention`; process-wide;
    /// off by default, as the worker's default runs).
    pub cudnn_attention: bool,
    /// Kinds `cosyvoice2` and `cosyvoice3`: their token2wav half alone (speech-token items, run as
    /// the batch given, no LLM, no text plan) — what `voxbatch calibrate` and the policy bench
    /// measure, since the memory policy sizes token2wav batches. The whole model re-buckets
    /// speech-token items by its text plan (a calibration of kind `cosyvoice3` on an H100 on
    /// 2026-12-06 saw its peaks stop growing at the small plan's buckets of 16).
    pub token2wav_only: bool,
    /// `[model] profile_batch`: which batch of the inference thread runs under the profiler.
    pub profile: Option<crate::config::BatchProfile>,
}

impl LoadOptions {
    /// Whether a model of `kind` loads whole, as a text model (its LLM, sized by a text plan): a
    /// text kind unless `token2wav_only`. The one place this is decided: `commands::start_model`
    /// sizes a plan by it, [`ModelHandle::start`] passes [`load`] a plan by it.
    pub fn loads_text(&self, kind: ModelKind) -> bool {
        kind.takes_text() && !self.token2wav_only
    }
}

/// Loads a model directory (its `manifest` already read) for `device` and `precision`: the one
/// model loader. `text`: a text kind's plan when it loads whole ([`LoadOptions::loads_text`]);
/// a text kind given none loads its token2wav half alone. `flow_graphs`: CosyVoice2 and
/// CosyVoice3 kinds (see [`LoadOptions`]).
pub fn load(
    dir: &std::path::Path,
    manifest: Manifest,
    device: Device,
    precision: Precision,
    text: Option<tts::TextPlan>,
    flow_graphs: flow_graphs::FlowGraphSettings,
) -> Result<Box<dyn Synthesizer>, ModelError> {
    match (manifest.kind, text) {
        (ModelKind::TorchScript, _) => Ok(Box::new(TorchScriptModel::load(dir, manifest, device, precision)?)),
        (ModelKind::Cosyvoice2 | ModelKind::Cosyvoice3, Some(plan)) => {
            let mut model = tts::TextToSpeech::load(dir, device, precision, plan)?;
            model.token2wav.set_flow_graphs(flow_graphs, device);
            Ok(Box::new(model))
        }
        // The token2wav kinds, and a text kind's token2wav half alone (`token2wav_only`).
        (ModelKind::Cosyvoice2Token2Wav | ModelKind::Cosyvoice3Token2Wav | ModelKind::Cosyvoice2 | ModelKind::Cosyvoice3, _) => {
            let model: Box<dyn Synthesizer> = load_token2wav(dir, manifest, device, precision, flow_graphs)?;
            Ok(model)
        }
    }
}

/// A model's token2wav half (kinds `cosyvoice2-token2wav` and `cosyvoice3-token2wav` as [`load`]
/// loads them; kind `cosyvoice2`'s without its LLM) as the bench drives it
/// ([`token2wav::Token2WavModel`]).
pub fn load_token2wav(
    dir: &std::path::Path,
    manifest: Manifest,
    device: Device,
    precision: Precision,
    flow_graphs: flow_graphs::FlowGraphSettings,
) -> Result<Box<dyn token2wav::Token2WavModel>, ModelError> {
    let mut model: Box<dyn token2wav::Token2WavModel> = family_token2wav(dir, manifest, device, precision)?;
    model.set_flow_graphs(flow_graphs, device);
    Ok(model)
}

/// The token2wav half of a CosyVoice directory, whichever family it is: what [`load_token2wav`]
/// and the text pipeline (`tts::TextToSpeech::load`) load.
pub fn family_token2wav(dir: &std::path::Path, manifest: Manifest, device: Device, precision: Precision) -> Result<Box<dyn token2wav::TextToken2Wav>, ModelError> {
    Ok(match manifest.kind {
        ModelKind::Cosyvoice2Token2Wav | ModelKind::Cosyvoice2 => Box::new(cosyvoice2::Token2Wav::load(dir, manifest, device, precision)?),
        ModelKind::Cosyvoice3Token2Wav | ModelKind::Cosyvoice3 => Box::new(cosyvoice3::Token2Wav::load(dir, manifest, device, precision)?),
        kind => {
            return Err(ModelError::Manifest {
                dir: dir.display().to_string(),
                reason: format!("kind {} has no token2wav (kinds cosyvoice2-token2wav, cosyvoice2, cosyvoice3-token2wav, cosyvoice3)", kind.as_str()),
            })
        }
    })
}

/// Whether the model `manifest` describes can use `prompt` (`Err` says why), decided from the
/// manifest alone so that a worker's voice book can answer before the model has loaded: the
/// family's check ([`cosyvoice2::check_voice`], [`cosyvoice3::check_voice`]).
pub fn check_voice(manifest: &Manifest, prompt: &VoicePrompt) -> Result<(), String> {
    match manifest.kind {
        ModelKind::Cosyvoice2Token2Wav | ModelKind::Cosyvoice2 => cosyvoice2::check_voice(manifest, prompt),
        ModelKind::Cosyvoice3Token2Wav | ModelKind::Cosyvoice3 => cosyvoice3::check_voice(manifest, prompt),
        kind => Err(format!("a {} model's voices are fixed by its directory", kind.as_str())),
    }
}

/// `text`, or `tts::TextPlan::small` over the built-in `[llm]` settings.
fn text_plan_or_default(dir: &std::path::Path, text: Option<tts::TextPlan>) -> Result<tts::TextPlan, ModelError> {
    match text {
        Some(plan) => Ok(plan),
        None => {
            let defaults = crate::config::Config::defaults()
                .map_err(|e| ModelError::Manifest { dir: dir.display().to_string(), reason: format!("built-in [llm] settings: {e}") })?;
            Ok(tts::TextPlan::small(defaults.llm))
        }
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

    /// A GPU failure is the worker's to stop on, not a job's to fail: the messages libtorch gave on
    /// an H100 on 2026-12-07 (cuBLAS on a green context) and CUDA's sticky errors are device faults;
    /// out-of-memory (split and retried) and errors of the input are not.
    #[test]
    fn a_cuda_or_cublas_failure_is_a_device_fault_and_out_of_memory_or_bad_input_is_not() {
        let torch = |m: &str| tch::TchError::Torch(m.to_string());
        let fault = |m: &str| ModelError::Inference(torch(m)).is_device_fault();
        assert!(fault("CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasGemmEx( handle, opa, opb, m, n, k, &falpha, a, CUDA_R_16BF, lda, b, CUDA_R_16BF, ldb, &fbeta, c, CUDA_R_16BF, ldc, compute_type, CUBLAS_GEMM_DEFAULT_TENSOR_OP)`"));
        assert!(fault("CUDA error: an illegal memory access was encountered"));
        assert!(fault("CUDA error: unspecified launch failure"));
        assert!(fault("cuDNN error: CUDNN_STATUS_EXECUTION_FAILED"));
        assert!(!fault("CUDA error: out of memory"));
        assert!(!ModelError::OutOfMemory { batch_size: 8, source: torch("CUDA out of memory. Tried to allocate 7.33 GiB") }.is_device_fault());
        assert!(!fault("ZeroDivisionError"));
        assert!(!fault("index 70000 is out of bounds for dimension 0 with size 6561"));
        assert!(!ModelError::BadInput("a segment of no speech tokens".into()).is_device_fault());
        // Through the model thread's wrapper, as the worker sees it.
        assert!(ModelError::NotLoaded(std::sync::Arc::new(ModelError::Inference(torch("CUDA error: unspecified launch failure")))).is_device_fault());
    }
}
