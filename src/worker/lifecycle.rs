//! What a worker settles before its stages run and after they stop: the checks and loads that
//! can refuse to start it (the output format, the text frontend, the batch sizing, the voices),
//! its NVML sampler, price and `workers` row; and, once the intake has stopped, the stages'
//! ends, the last completion events, the stop row and the summary.
//!
//! Neighbours: `worker::run` (mod.rs) wires the stages between the two.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tracing::{info, warn};

use super::intake::Received;
use super::{Counters, WorkerClock, WorkerError, WorkerSummary};
use crate::config::Config;
use crate::db::{Db, WorkerRow};
use crate::frontend::Frontend;
use crate::gpu::sampler::GpuSampler;
use crate::model::{Device, Manifest, ModelHandle, Precision};
use crate::sizing::Sizing;
use crate::voice::VoiceBook;

/// What a worker has once it may consume.
pub(super) struct Setup {
    pub manifest: Arc<Manifest>,
    pub device: Device,
    pub precision: Precision,
    pub sampler: Option<Arc<GpuSampler>>,
    pub hourly_usd: f64,
    /// Text models: the frontend and how many jobs it prepares at once.
    pub frontend: Option<(Arc<Frontend>, usize)>,
    pub sizing: Sizing<Received>,
    pub voices: Arc<VoiceBook>,
}

/// Checks and loads what the worker needs, then registers it. Blocking reads (codec libraries,
/// NVML, grammars, calibration files) run off the async runtime.
pub(super) async fn prepare(cfg: &Config, model: &ModelHandle, db: &Db, worker_id: &str) -> Result<Setup, WorkerError> {
    let manifest = Arc::new(model.manifest().clone());
    let (device, precision) = (model.device(), model.precision());
    // The configured format must be writable here (codec library, model rate); a job asking for
    // another that is not gets WAV, so say which those are now.
    let (format, rate) = (cfg.output.format, manifest.sample_rate);
    let checks = tokio::task::spawn_blocking(move || crate::audio::OutputFormat::ALL.map(|f| (f, f.check(rate))))
        .await
        .map_err(|e| WorkerError::Stage(format!("output format check: {e}")))?;
    for (f, check) in checks {
        match check {
            Err(e) if f == format => return Err(WorkerError::OutputFormat(e)),
            Err(e) => warn!(format = f.extension(), error = %e, "jobs asking for this format will be stored as WAV"),
            Ok(()) => {}
        }
    }
    let interval = cfg.cost.sample_interval;
    let sampler = tokio::task::spawn_blocking(move || GpuSampler::start(device, interval))
        .await
        .map_err(|e| WorkerError::Stage(format!("gpu sampler: {e}")))?
        .map(Arc::new);
    let gpu_name = sampler.as_ref().map(|s| s.name().to_string());
    let hourly_usd = cfg.cost.prices.hourly(device, gpu_name.as_deref());
    // Text models: the text frontend (grammars, tokenizer) runs at the intake, `[frontend]
    // threads` jobs at a time on the blocking pool, so bad text is refused before it takes a place
    // in a batch.
    let frontend = if manifest.kind.takes_text() {
        let (dir, limits) = (manifest.dir.clone(), crate::frontend::segment::SegmentLimits::from_config(cfg));
        let frontend_cfg = cfg.frontend.clone();
        let (loaded, threads) = tokio::task::spawn_blocking(move || {
            // `threads()` may read the host's cgroup files: here, off the runtime.
            let threads = frontend_cfg.threads();
            Frontend::load_for_threads(&dir, limits, threads).map(|f| (f, threads))
        })
        .await
        .map_err(|e| WorkerError::Stage(format!("text frontend: {e}")))??;
        Some((Arc::new(loaded), threads))
    } else {
        None
    };
    let sizing = {
        let (cfg, manifest, llm_slots) = (cfg.clone(), manifest.clone(), model.llm_slots());
        tokio::task::spawn_blocking(move || crate::sizing::worker_policy(&cfg, &manifest, device, precision, llm_slots))
            .await
            .map_err(|e| WorkerError::Stage(format!("batch sizing: {e}")))??
    };
    // The voices jobs may name: a prompt-voice model's come from Postgres (its directory's own
    // are imported first) and reach the model thread before any batch names them.
    let voices = Arc::new(if manifest.kind.has_prompt_voices() { VoiceBook::shared(db.clone(), model.clone()).await? } else { VoiceBook::fixed(&manifest) });
    db.register_worker(&WorkerRow {
        worker_id,
        device: &device.to_string(),
        model: &manifest.name,
        precision: &precision.to_string(),
        gpu_name: gpu_name.as_deref(),
        hourly_usd,
    })
    .await?;
    info!(worker_id, model = %manifest.name, %device, %precision, "worker started");
    Ok(Setup { manifest, device, precision, sampler, hourly_usd, frontend, sizing, voices })
}

/// The tasks a worker runs beside its intake.
pub(super) struct Tasks {
    pub infer: JoinHandle<()>,
    pub commit: JoinHandle<()>,
    pub events: JoinHandle<()>,
    pub events_stop: tokio_util::sync::CancellationToken,
    pub heartbeat: JoinHandle<()>,
    pub voice_poll: JoinHandle<()>,
}

/// After the intake has stopped (and dropped its sender): the stages finish what they hold, the
/// model's load ends, the last events go out, the stop is recorded; then the first permanent
/// error, a stage's failure, or the summary.
pub(super) async fn finish(
    tasks: Tasks,
    intake: Result<(), WorkerError>,
    loading: ModelHandle,
    db: &Db,
    worker_id: String,
    clock: &WorkerClock,
    counters: &Counters,
    fatal: &super::retry::Fatal,
) -> Result<WorkerSummary, WorkerError> {
    let infer = tasks.infer.await;
    let commit = tasks.commit.await;
    // A worker that stops while its model still loads (a drained queue, a shutdown) waits for the
    // load to end: a process that exits while libtorch loads on the inference thread crashes in
    // libtorch's teardown (a `--drain` worker of the 16-process fleet test with no job to do did,
    // SIGSEGV, 2026-12-05).
    if !loading.is_settled() {
        info!("waiting for the model to finish loading before the worker stops");
    }
    let _ = loading.ready().await;
    tasks.events_stop.cancel();
    if tokio::time::timeout(Duration::from_secs(30), tasks.events).await.is_err() {
        warn!("the last completion events are still pending; another worker's sweep publishes them");
    }
    tasks.heartbeat.abort();
    tasks.voice_poll.abort();
    let (busy, alive) = clock.busy_alive_ms();
    if let Err(e) = db.worker_stopped(&worker_id, busy, alive).await {
        warn!(error = %e, "could not record worker stop");
    }
    if let Some((error, hint)) = fatal.error() {
        return Err(WorkerError::Permanent { error: error.to_string(), hint });
    }
    intake?;
    infer.map_err(|e| WorkerError::Stage(format!("infer: {e}")))?;
    commit.map_err(|e| WorkerError::Stage(format!("commit: {e}")))?;
    let summary = counters.summary(worker_id);
    info!(?summary, "worker stopped");
    Ok(summary)
}
