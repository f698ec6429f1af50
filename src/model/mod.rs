//! The model seam: a model directory, its manifest, its tokenizer, and inference on a dedicated
//! thread.
//!
//! A model directory holds `model.toml` (the [`Manifest`]) and the weights its `kind` names:
//! `model.pt` (TorchScript, kind `torchscript`, the reference CNN) or safetensors (kinds
//! `cosyvoice2-token2wav` and `cosyvoice2`, [`cosyvoice2`]; the latter adds the LLM and takes text
//! jobs; kind `cosyvoice3-token2wav`, [`cosyvoice3`]). A model family's folder holds what is its
//! own; what the families share sits beside them: [`layers`], [`weights`], [`pre_lookahead`],
//! [`flow_matching`], [`vocoder`], [`token2wav`], [`flow_graphs`]. [`load`] is the one loader. [`ModelHandle::start`] loads it on its own OS thread (libtorch calls block), returning
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
pub mod flow_graphs;
pub mod flow_matching;
mod input;
pub mod layers;
mod manifest;
pub mod memory;
pub mod pre_lookahead;
pub mod profiler;
pub(crate) use crate::torch_shim as shim;
pub mod token2wav;
mod torchscript;
pub mod vocoder;
pub mod voice_prompt;
pub mod weights;

use std::time::{Duration, Instant};

use tokio::sync::oneshot;

pub use crate::device::{Device, ParseError, Precision};
pub use input::{model_input, ModelInput};
pub use voice_prompt::VoicePrompt;
pub use cosyvoice2::tts::TextInput;
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
    /// gives `cosyvoice2::tts::TextPlan::small` over the built-in `[llm]` settings.
    pub text: Option<cosyvoice2::tts::TextPlan>,
    /// CosyVoice2 and CosyVoice3 kinds: small batches' compiled flow steps as CUDA graphs
    /// (`[model] flow_graphs`; default none).
    pub flow_graphs: flow_graphs::FlowGraphSettings,
    /// On CUDA, cuDNN's per-shape algorithm search (`[model] cudnn_benchmark`; process-wide).
    pub cudnn_benchmark: bool,
}

/// Loads a model directory (its `manifest` already read) for `device` and `precision`: the one
/// model loader. `flow_graphs`: CosyVoice2 and CosyVoice3 kinds (see [`LoadOptions`]).
pub fn load(
    dir: &std::path::Path,
    manifest: Manifest,
    device: Device,
    precision: Precision,
    text: Option<cosyvoice2::tts::TextPlan>,
    flow_graphs: flow_graphs::FlowGraphSettings,
) -> Result<Box<dyn Synthesizer>, ModelError> {
    match manifest.kind {
        ModelKind::TorchScript => Ok(Box::new(TorchScriptModel::load(dir, manifest, device, precision)?)),
        ModelKind::Cosyvoice2Token2Wav | ModelKind::Cosyvoice3Token2Wav => {
            let model: Box<dyn Synthesizer> = load_token2wav(dir, manifest, device, precision, flow_graphs)?;
            Ok(model)
        }
        ModelKind::Cosyvoice2 => {
            let plan = text_plan_or_default(dir, text)?;
            let mut model = cosyvoice2::tts::TextToSpeech::load(dir, device, precision, plan)?;
            model.token2wav.flow.set_graphs(flow_graphs, device);
            Ok(Box::new(model))
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
    let mut model: Box<dyn token2wav::Token2WavModel> = match manifest.kind {
        ModelKind::Cosyvoice2Token2Wav | ModelKind::Cosyvoice2 => Box::new(cosyvoice2::Token2Wav::load(dir, manifest, device, precision)?),
        ModelKind::Cosyvoice3Token2Wav => Box::new(cosyvoice3::Token2Wav::load(dir, manifest, device, precision)?),
        kind => {
            return Err(ModelError::Manifest {
                dir: dir.display().to_string(),
                reason: format!("kind {} has no token2wav (kinds cosyvoice2-token2wav, cosyvoice2, cosyvoice3-token2wav)", kind.as_str()),
            })
        }
    };
    model.set_flow_graphs(flow_graphs, device);
    Ok(model)
}

/// Whether the model `manifest` describes can use `prompt` (`Err` says why), decided from the
/// manifest alone so that a worker's voice book can answer before the model has loaded: the
/// family's check ([`cosyvoice2::check_voice`], [`cosyvoice3::check_voice`]).
pub fn check_voice(manifest: &Manifest, prompt: &VoicePrompt) -> Result<(), String> {
    match manifest.kind {
        ModelKind::Cosyvoice2Token2Wav | ModelKind::Cosyvoice2 => cosyvoice2::check_voice(manifest, prompt),
        ModelKind::Cosyvoice3Token2Wav => cosyvoice3::check_voice(manifest, prompt),
        kind => Err(format!("a {} model's voices are fixed by its directory", kind.as_str())),
    }
}

/// `text`, or `cosyvoice2::tts::TextPlan::small` over the built-in `[llm]` settings.
fn text_plan_or_default(dir: &std::path::Path, text: Option<cosyvoice2::tts::TextPlan>) -> Result<cosyvoice2::tts::TextPlan, ModelError> {
    match text {
        Some(plan) => Ok(plan),
        None => {
            let defaults = crate::config::Config::defaults()
                .map_err(|e| ModelError::Manifest { dir: dir.display().to_string(), reason: format!("built-in [llm] settings: {e}") })?;
            Ok(cosyvoice2::tts::TextPlan::small(defaults.llm))
        }
    }
}

/// A batch for the inference thread and where its result goes.
struct BatchRequest(Vec<SynthItem>, oneshot::Sender<Result<SynthOutput, ModelError>>);

/// A voice for the inference thread's table: index and prompt, already checked against the
/// manifest ([`check_voice`]).
struct VoiceRequest(usize, Box<VoicePrompt>);

/// Where the inference thread's load stands.
#[derive(Clone)]
enum LoadState {
    Loading,
    Ready,
    Failed(std::sync::Arc<ModelError>),
}

/// Handle to the inference thread. Cheap to clone; the thread ends when every handle is dropped.
///
/// [`ModelHandle::start`] returns while the thread still loads the model, so that a worker's
/// intake and text frontend work meanwhile: batches sent before the load is over wait for it
/// ([`ModelHandle::ready`] says when it is, or why it failed). Voices go to the thread on a
/// channel of their own, which it empties before each batch: a voice set before a batch is sent
/// is there when that batch runs, and setting one never waits for the load.
#[derive(Clone)]
pub struct ModelHandle {
    tx: tokio::sync::mpsc::Sender<BatchRequest>,
    voices: tokio::sync::mpsc::UnboundedSender<VoiceRequest>,
    state: tokio::sync::watch::Receiver<LoadState>,
    manifest: std::sync::Arc<Manifest>,
    device: Device,
    precision: Precision,
    llm_slots: Option<usize>,
    cudnn_benchmark: bool,
}

impl ModelHandle {
    /// Reads `dir`'s manifest and starts the inference thread, which loads the model: returns
    /// before the load is over. Blocking (files): call it off the async runtime.
    pub fn start(dir: &std::path::Path, device: Device, precision: Precision, options: LoadOptions) -> Result<ModelHandle, ModelError> {
        let LoadOptions { cpu_threads, text, flow_graphs, cudnn_benchmark } = options;
        let manifest = Manifest::load(dir)?;
        // What the loaded model will say (`Synthesizer::llm_slots`), known before it loads.
        let text = match manifest.kind {
            ModelKind::Cosyvoice2 => Some(text_plan_or_default(dir, text)?),
            _ => None,
        };
        let llm_slots = text.as_ref().map(|plan| plan.slots.max(1));
        // One batch waits while one runs: async senders wait for room without blocking.
        let (tx, mut rx) = tokio::sync::mpsc::channel::<BatchRequest>(1);
        let (voices_tx, mut voices_rx) = tokio::sync::mpsc::unbounded_channel::<VoiceRequest>();
        let (state_tx, state) = tokio::sync::watch::channel(LoadState::Loading);
        let (thread_dir, thread_manifest) = (dir.to_path_buf(), manifest.clone());
        std::thread::Builder::new()
            .name(format!("voxbatch-infer-{device}"))
            .spawn(move || {
                if cpu_threads > 0 {
                    tch::set_num_threads(cpu_threads as i32);
                }
                if matches!(device, Device::Cuda(_)) {
                    tch::Cuda::cudnn_set_benchmark(cudnn_benchmark);
                    if cudnn_benchmark {
                        tracing::info!(%device, "cuDNN benchmark mode: each new convolution shape is timed first");
                    }
                }
                let started = Instant::now();
                let mut model = match load(&thread_dir, thread_manifest, device, precision, text, flow_graphs) {
                    Ok(m) => {
                        tracing::info!(%device, seconds = format!("{:.2}", started.elapsed().as_secs_f64()), "model loaded");
                        let _ = state_tx.send(LoadState::Ready);
                        m
                    }
                    Err(e) => {
                        let _ = state_tx.send(LoadState::Failed(std::sync::Arc::new(e)));
                        return;
                    }
                };
                let probe = memory::MemoryProbe::new(device);
                while let Some(BatchRequest(items, reply)) = rx.blocking_recv() {
                    // Every voice set before this batch was sent is in the channel by now.
                    while let Ok(VoiceRequest(index, prompt)) = voices_rx.try_recv() {
                        if let Err(e) = model.set_voice(index, &prompt) {
                            tracing::warn!(voice = %prompt.name, index, error = %e, "the inference thread could not set the voice; batches naming it fail");
                        }
                    }
                    probe.reset();
                    let started = Instant::now();
                    let result = model.synthesize_items(&items);
                    let infer = started.elapsed();
                    let peak_bytes = probe.peak();
                    let stages = model.take_stages();
                    if matches!(result, Err(ModelError::OutOfMemory { .. })) {
                        model.release_memory();
                        probe.release_cached();
                    }
                    let _ = reply.send(result.map(|audio| SynthOutput { audio, infer, peak_bytes, stages }));
                }
            })
            .map_err(|e| ModelError::DeviceUnavailable { device, reason: format!("cannot start inference thread: {e}") })?;
        Ok(ModelHandle { tx, voices: voices_tx, state, manifest: std::sync::Arc::new(manifest), device, precision, llm_slots, cudnn_benchmark })
    }

    /// Starts the inference thread and loads the model on it ([`ModelHandle::start`]). Returns
    /// once the model is loaded. Blocking.
    pub fn spawn(dir: &std::path::Path, device: Device, precision: Precision, options: LoadOptions) -> Result<ModelHandle, ModelError> {
        let handle = ModelHandle::start(dir, device, precision, options)?;
        futures::executor::block_on(handle.ready())?;
        Ok(handle)
    }

    /// [`ModelHandle::spawn`] from async code.
    pub async fn load(dir: &std::path::Path, device: Device, precision: Precision, options: LoadOptions) -> Result<ModelHandle, ModelError> {
        let dir = dir.to_path_buf();
        let handle = tokio::task::spawn_blocking(move || ModelHandle::start(&dir, device, precision, options))
            .await
            .map_err(|_| ModelError::ThreadGone)??;
        handle.ready().await?;
        Ok(handle)
    }

    /// Whether the load has ended (loaded or failed).
    pub fn is_settled(&self) -> bool {
        !matches!(*self.state.borrow(), LoadState::Loading)
    }

    /// Resolves once the model is loaded; `Err` (for every caller) when its load failed.
    pub async fn ready(&self) -> Result<(), ModelError> {
        let mut state = self.state.clone();
        let settled = state.wait_for(|s| !matches!(s, LoadState::Loading)).await.map_err(|_| ModelError::ThreadGone)?;
        match &*settled {
            LoadState::Failed(e) => Err(ModelError::NotLoaded(e.clone())),
            _ => Ok(()),
        }
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
    /// Whether it runs with cuDNN's per-shape algorithm search ([`LoadOptions::cudnn_benchmark`]).
    pub fn cudnn_benchmark(&self) -> bool {
        self.cudnn_benchmark
    }
    /// The slots the model's LLM was sized with (`sizing::text_plan`), for models with an LLM.
    pub fn llm_slots(&self) -> Option<usize> {
        self.llm_slots
    }

    /// Runs one batch on the inference thread (after the load, if it is still loading).
    pub async fn synthesize(&self, items: Vec<SynthItem>) -> Result<SynthOutput, ModelError> {
        let (reply_tx, reply_rx) = oneshot::channel();
        if self.tx.send(BatchRequest(items, reply_tx)).await.is_err() {
            return Err(self.gone());
        }
        reply_rx.await.unwrap_or_else(|_| Err(self.gone()))
    }

    /// Why the thread is gone: its load failed (it says so before it ends), or it stopped.
    fn gone(&self) -> ModelError {
        match &*self.state.borrow() {
            LoadState::Failed(e) => ModelError::NotLoaded(e.clone()),
            _ => ModelError::ThreadGone,
        }
    }

    /// Puts voice `index` in the inference thread's table ([`Synthesizer::set_voice`]) after
    /// checking it against the manifest ([`check_voice`]: `BadInput` says why the
    /// model cannot use it). Does not wait for the thread, nor for the load: batches sent after
    /// this returns see the voice.
    pub fn set_voice(&self, index: usize, prompt: VoicePrompt) -> Result<(), ModelError> {
        check_voice(&self.manifest, &prompt).map_err(ModelError::BadInput)?;
        self.voices.send(VoiceRequest(index, Box::new(prompt))).map_err(|_| self.gone())
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
