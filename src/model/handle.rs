//! The model's thread and the handle async code holds: [`ModelHandle::start`] starts an OS thread
//! that loads the model ([`super::load`]) and then serves batches and voices sent from async code;
//! the handle says when the load is over or why it failed. Each batch runs through
//! `tch_panic::caught`; the one `[model] profile_batch` names runs under the profiler
//! (`profiler::Profiling`, its files and a log line). Neighbours: `worker::infer` sends each batch
//! here; `worker::lifecycle` starts and waits for the thread.

use std::time::Instant;

use tokio::sync::oneshot;

use super::{check_voice, load, text_plan_or_default, Device, LoadOptions, Manifest, ModelError, Precision, SynthItem, SynthOutput, VoicePrompt};

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
        let manifest = Manifest::load(dir)?;
        let text = match options.loads_text(manifest.kind) {
            true => Some(text_plan_or_default(dir, options.text)?),
            false => None,
        };
        let LoadOptions { cpu_threads, flow_graphs, cudnn_benchmark, cudnn_attention, profile, .. } = options;
        // What the loaded model will say (`Synthesizer::llm_slots`), known before it loads.
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
                    if cudnn_benchmark {
                        tracing::info!(%device, "cuDNN benchmark mode: each new convolution shape is timed first");
                    }
                    // Flags in libtorch's global context: setting them does not fail in practice.
                    if let Err(e) = crate::torch_shim::set_cudnn(cudnn_benchmark, cudnn_attention) {
                        tracing::warn!(%device, error = %e, "setting cuDNN's switches ([model] cudnn_benchmark, cudnn_attention) failed: libtorch chooses");
                    }
                    tracing::debug!(%device, allowed = crate::torch_shim::cudnn_attention(), "cuDNN attention");
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
                let probe = super::memory::MemoryProbe::new(device);
                let mut batches: u64 = 0;
                while let Some(BatchRequest(items, reply)) = rx.blocking_recv() {
                    batches += 1;
                    // Every voice set before this batch was sent is in the channel by now.
                    while let Ok(VoiceRequest(index, prompt)) = voices_rx.try_recv() {
                        if let Err(e) = model.set_voice(index, &prompt) {
                            tracing::warn!(voice = %prompt.name, index, error = %e, "the inference thread could not set the voice; batches naming it fail");
                        }
                    }
                    probe.reset();
                    let profiling = start_profile(profile.as_ref(), batches, device);
                    let started = Instant::now();
                    let result = super::tch_panic::caught(items.len(), || model.synthesize_items(&items));
                    let infer = started.elapsed();
                    if let Some(profiling) = profiling {
                        finish_profile(profiling, batches, infer);
                    }
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

/// `[model] profile_batch`: the profiler started for this thread's batch `n` if it is the one
/// asked for; a profile that cannot start (another under way in the process, a directory that
/// cannot be made) is a warning, and the batch runs unprofiled.
fn start_profile(profile: Option<&crate::config::BatchProfile>, n: u64, device: Device) -> Option<super::profiler::Profiling> {
    let profile = profile.filter(|p| p.batch == n)?;
    let table = profile.dir.join(format!("batch-{n}-{}-{}.tsv", device.to_string().replace(':', ""), std::process::id()));
    let started = std::fs::create_dir_all(&profile.dir)
        .map_err(|e| e.to_string())
        .and_then(|()| super::profiler::Profiling::start(device, &table).map_err(|e| e.to_string()));
    match started {
        Ok(profiling) => Some(profiling),
        Err(error) => {
            tracing::warn!(batch = n, %error, "the batch runs without the profile [model] profile_batch asked for");
            None
        }
    }
}

/// Stops the batch's profile, writes its files and logs what they say: the device's busy time,
/// the CUDA streams' (and so how long the LLM's decode and token2wav ran at once), the kernels'
/// time by category.
fn finish_profile(profiling: super::profiler::Profiling, n: u64, infer: std::time::Duration) {
    let table = profiling.table().display().to_string();
    match profiling.finish() {
        Ok((rows, streams)) => {
            let categories: Vec<String> = super::profiler::by_category(&rows).iter().map(|(c, s)| format!("{c} {s:.3} s")).collect();
            let by_stream: Vec<String> = streams.streams.iter().map(|(id, events, s)| format!("stream {id}: {events} events, {s:.3} s")).collect();
            tracing::info!(
                batch = n,
                %table,
                infer_s = format!("{:.3}", infer.as_secs_f64()),
                device_busy_s = format!("{:.3}", streams.busy_seconds),
                kernels_span_s = format!("{:.3}", streams.span_seconds),
                streams_overlap_s = format!("{:.3}", streams.overlap_seconds()),
                streams = %by_stream.join("; "),
                categories = %categories.join("; "),
                "batch profiled"
            );
        }
        Err(error) => tracing::warn!(batch = n, %table, %error, "the batch's profile could not be written"),
    }
}
