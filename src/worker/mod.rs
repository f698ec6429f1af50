//! The worker: one pipeline of stages, a file each.
//!
//! ```text
//!  RabbitMQ ─▶ intake.rs ──(chan 1)──▶ infer.rs ──(chan 1)──▶ commit.rs ─▶ ack
//!   consume, validate,      claim (Postgres),      encode (WAV), upload (S3),
//!   batch policy            model thread, split     record (Postgres, one tx)
//!       │ poison, conflicts, failures ─▶ delivery.rs (dead letter with reason, give back)
//!       └─ retry.rs: back-off for every stage
//! ```
//!
//! Stages are tasks joined by bounded channels, so batch N+1's inference overlaps batch N's
//! commit. Invariants (each has a test in `tests/`):
//! - a job is acked only after its audio object and its Postgres rows are committed;
//! - a redelivered job that is already `done` is acked without recomputation;
//! - a malformed message goes straight to the dead-letter queue with its reason; never retried;
//! - an outage of S3 or Postgres delays work (retries with back-off, messages held) but never
//!   drops it; past the hold limit messages are given back without spending their delivery budget;
//! - two deliveries of one job are never synthesized at once (claims in one transaction);
//! - shutdown (the injected future) finishes the batch in progress and gives back the rest.
//!
//! Neighbours: `commands::work` builds a worker per device; `sizing` chooses the batch policy.

mod commit;
mod delivery;
pub mod events;
mod gate;
mod infer;
mod intake;
pub mod retry;

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};
use uuid::Uuid;

pub use delivery::RETURNED_HEADER;
pub use infer::{error_chain, synthesize_splitting, ModelRun};

use crate::config::Config;
use crate::db::{ClaimLease, Db, WorkerRow};
use crate::gpu::sampler::GpuSampler;
use crate::model::ModelHandle;
use crate::voice::VoiceBook;
use crate::queue::QueueError;
use crate::sizing::SizingError;
use crate::storage::Storage;

/// Errors that stop a worker (everything else is retried, given back or dead-lettered).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkerError {
    #[error(transparent)]
    Queue(#[from] QueueError),
    #[error(transparent)]
    Db(#[from] crate::db::DbError),
    #[error("a pipeline stage stopped unexpectedly: {0}")]
    Stage(String),
    #[error(transparent)]
    Sizing(#[from] SizingError),
    #[error("cannot load the text frontend")]
    Frontend(#[from] crate::frontend::FrontendError),
    #[error("cannot load the model's voices")]
    Voices(#[from] crate::voice::BookError),
    #[error("`[output] format` cannot be written on this host")]
    OutputFormat(#[source] crate::audio::EncodeError),
    #[error("stopped on a permanent error: {error}")]
    Permanent { error: String, hint: Option<&'static str> },
}

/// How a worker runs.
#[derive(Debug, Clone, Default)]
pub struct WorkerOptions {
    /// Exit once the queue is empty and every job taken is committed.
    pub drain: bool,
    /// Worker id (default: from config, else host-pid-random).
    pub worker_id: Option<String>,
}

/// What a worker did, returned when it stops.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WorkerSummary {
    pub worker_id: String,
    pub batches: u64,
    pub jobs_done: u64,
    pub jobs_failed: u64,
    pub already_done: u64,
    /// Acked without synthesis: their campaign is cancelled.
    pub cancelled: u64,
    pub rejected: u64,
    pub audio_seconds: f64,
}

/// What the stages count.
#[derive(Default)]
pub struct Counters {
    batches: AtomicU64,
    jobs_done: AtomicU64,
    jobs_failed: AtomicU64,
    already_done: AtomicU64,
    cancelled: AtomicU64,
    rejected: AtomicU64,
    audio_ms: AtomicU64,
}

/// The one place a worker counts its outcomes: its summary's counters and the process's metrics.
impl Counters {
    fn add_rejected(&self, n: u64) {
        self.rejected.fetch_add(n, Ordering::SeqCst);
        crate::metrics::jobs_settled("rejected", n);
    }
    fn add_failed(&self, n: u64) {
        self.jobs_failed.fetch_add(n, Ordering::SeqCst);
        crate::metrics::jobs_settled("failed", n);
    }
    fn add_already_done(&self, n: u64) {
        self.already_done.fetch_add(n, Ordering::SeqCst);
        crate::metrics::jobs_settled("already_done", n);
    }
    fn add_cancelled(&self, n: u64) {
        self.cancelled.fetch_add(n, Ordering::SeqCst);
        crate::metrics::jobs_settled("cancelled", n);
    }
    /// A committed batch of `record.batch_size` done jobs (`segments` text segments among them).
    fn add_batch(&self, record: &crate::db::BatchRecord, segments: u64) {
        self.batches.fetch_add(1, Ordering::SeqCst);
        self.jobs_done.fetch_add(record.batch_size.max(0) as u64, Ordering::SeqCst);
        self.audio_ms.fetch_add((record.audio_seconds * 1000.0) as u64, Ordering::SeqCst);
        crate::metrics::batch_committed(record, segments);
    }
    fn summary(&self, worker_id: String) -> WorkerSummary {
        WorkerSummary {
            worker_id,
            batches: self.batches.load(Ordering::SeqCst),
            jobs_done: self.jobs_done.load(Ordering::SeqCst),
            jobs_failed: self.jobs_failed.load(Ordering::SeqCst),
            already_done: self.already_done.load(Ordering::SeqCst),
            cancelled: self.cancelled.load(Ordering::SeqCst),
            rejected: self.rejected.load(Ordering::SeqCst),
            audio_seconds: self.audio_ms.load(Ordering::SeqCst) as f64 / 1000.0,
        }
    }
}

/// The worker's busy (inference) time against its life, for the `workers` row.
pub struct WorkerClock {
    started: Instant,
    busy_us: AtomicU64,
}

impl WorkerClock {
    fn new() -> WorkerClock {
        WorkerClock { started: Instant::now(), busy_us: AtomicU64::new(0) }
    }
    fn add_busy(&self, d: Duration) {
        self.busy_us.fetch_add(d.as_micros() as u64, Ordering::SeqCst);
    }
    /// (busy, alive) milliseconds so far.
    fn busy_alive_ms(&self) -> (f64, f64) {
        (self.busy_us.load(Ordering::SeqCst) as f64 / 1000.0, self.started.elapsed().as_secs_f64() * 1000.0)
    }
}

/// A fresh worker id: `<host>-<pid>-<random>`.
pub fn new_worker_id() -> String {
    format!("{}-{}-{}", crate::db::hostname(), std::process::id(), &Uuid::new_v4().simple().to_string()[..8])
}

/// Runs a worker until `shutdown` resolves (or, with `drain`, until the queue is empty).
pub async fn run(
    cfg: Config,
    model: ModelHandle,
    db: Db,
    storage: Storage,
    opts: WorkerOptions,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<WorkerSummary, WorkerError> {
    let worker_id = opts.worker_id.clone().or_else(|| cfg.worker.id.clone()).unwrap_or_else(new_worker_id);
    let manifest = Arc::new(model.manifest().clone());
    let loading = model.clone();
    let (device, precision) = (model.device(), model.precision());
    // The configured format must be writable here (codec library, model rate); a job asking for
    // another that is not gets WAV, so say which those are now.
    // Opening a codec library reads files: off the async runtime.
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
    // NVML and calibration files: blocking calls, off the async runtime.
    let interval = cfg.cost.sample_interval;
    let sampler = tokio::task::spawn_blocking(move || GpuSampler::start(device, interval))
        .await
        .map_err(|e| WorkerError::Stage(format!("gpu sampler: {e}")))?
        .map(Arc::new);
    let gpu_name = sampler.as_ref().map(|s| s.name().to_string());
    let hourly_usd = cfg.cost.prices.hourly(device, gpu_name.as_deref());
    // Kind cosyvoice2: the text frontend (grammars, tokenizer) runs at the intake, `[frontend]
    // threads` jobs at a time on the blocking pool, so bad text is refused before it takes a place
    // in a batch.
    let frontend = if manifest.kind == crate::model::ModelKind::Cosyvoice2 {
        let (dir, limits) = (manifest.dir.clone(), crate::frontend::segment::SegmentLimits::from_config(&cfg));
        let frontend_cfg = cfg.frontend.clone();
        let (loaded, threads) = tokio::task::spawn_blocking(move || {
            // `threads()` may read the host's cgroup files: here, off the runtime.
            let threads = frontend_cfg.threads();
            crate::frontend::Frontend::load_for_threads(&dir, limits, threads).map(|f| (f, threads))
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
    // The voices jobs may name: a CosyVoice2 model's come from Postgres (its directory's own are
    // imported first) and reach the model thread before any batch names them.
    let voices = Arc::new(if manifest.kind.has_prompt_voices() {
        VoiceBook::shared(db.clone(), model.clone()).await?
    } else {
        VoiceBook::fixed(&manifest)
    });
    db.register_worker(&WorkerRow {
        worker_id: &worker_id,
        device: &device.to_string(),
        model: &manifest.name,
        precision: &precision.to_string(),
        gpu_name: gpu_name.as_deref(),
        hourly_usd,
    })
    .await?;
    info!(worker_id, model = %manifest.name, %device, %precision, "worker started");

    let stop = CancellationToken::new();
    let counters = Arc::new(Counters::default());
    let clock = Arc::new(WorkerClock::new());
    let held = delivery::HeldCount::default();
    let fatal = Arc::new(retry::Fatal::default());
    let retry = retry::Retry {
        min: cfg.worker.retry_min,
        max: cfg.worker.retry_max,
        max_hold: cfg.worker.max_hold,
        stop: stop.clone(),
        fatal: fatal.clone(),
    };
    let outbox = Arc::new(delivery::Outbox::new(cfg.amqp.clone()));
    let settler = Arc::new(delivery::Settler {
        db: db.clone(),
        outbox: outbox.clone(),
        retry,
        worker_id: worker_id.clone(),
        counters: counters.clone(),
    });

    let (batch_tx, batch_rx) = mpsc::channel(1);
    // Text models form each batch when the inference stage is idle (gate.rs says why).
    // The model may still be loading (`ModelHandle::start`): the gate is held until it is ready.
    let gate = frontend.is_some().then(|| Arc::new(gate::InferenceGate::loading()));
    let (outcome_tx, outcome_rx) = mpsc::unbounded_channel();
    let (return_tx, return_rx) = mpsc::unbounded_channel();
    let (post_tx, post_rx) = mpsc::channel(1);
    let infer = infer::Infer {
        db: db.clone(),
        model,
        worker_id: worker_id.clone(),
        lease: ClaimLease::for_worker(&cfg.worker),
        recheck: cfg.worker.heartbeat,
        sampler,
        clock: clock.clone(),
        counters: counters.clone(),
        settler: settler.clone(),
        stop: stop.clone(),
        gate: gate.clone(),
    };
    let events_wake = Arc::new(tokio::sync::Notify::new());
    let events_storage = storage.clone();
    let sweep = events::EventSweep::new(
        db.clone(),
        cfg.amqp.clone(),
        Arc::new(move |key: &str| events_storage.url(key)),
        cfg.worker.events_sweep,
        events_wake.clone(),
    );
    let events_stop = CancellationToken::new();
    let events_task = tokio::spawn(sweep.run(events_stop.clone()));
    let commit = commit::Commit {
        db: db.clone(),
        storage,
        events: events_wake,
        output: cfg.output.clone(),
        manifest: manifest.clone(),
        device,
        precision,
        worker_id: worker_id.clone(),
        prices: cfg.cost.prices.clone(),
        hourly_usd,
        upload_concurrency: cfg.storage.upload_concurrency,
        counters: counters.clone(),
        settler: settler.clone(),
    };
    let text = frontend.map(|(frontend, threads)| intake::TextPrep {
        frontend,
        slots: Arc::new(tokio::sync::Semaphore::new(threads)),
        rates: crate::frontend::SpeakingRates::from_config(&cfg.frontend),
        force_lengths: cfg.llm.force_lengths,
        preparing: Arc::default(),
        settler: settler.clone(),
        stop: stop.clone(),
        returns: return_tx.clone(),
    });
    let intake = intake::Intake {
        amqp: cfg.amqp.clone(),
        limits: cfg.limits.clone(),
        manifest,
        voices: voices.clone(),
        text,
        worker_id: worker_id.clone(),
        prefetch: sizing.prefetch,
        hold_work: sizing.hold_work,
        drain: opts.drain,
        drain_poll: cfg.worker.drain_poll,
        held,
        stop: stop.clone(),
        fatal: fatal.clone(),
        outbox,
        settler,
    };
    let prepared = return_tx.clone();
    let infer_task = tokio::spawn(infer.run(batch_rx, post_tx, outcome_tx, return_tx));
    let commit_task = tokio::spawn(commit.run(post_rx));
    let heartbeat = tokio::spawn(heartbeat_loop(db.clone(), worker_id.clone(), clock.clone(), cfg.worker.heartbeat));
    let voice_poll = tokio::spawn(voice_poll_loop(voices, cfg.voices.refresh));

    let channels = intake::IntakeChannels { batches: batch_tx, outcomes: outcome_rx, returns: return_rx, prepared, gate };
    let intake_result = intake.run(sizing.policy, channels, shutdown).await;

    // The intake has stopped and dropped its sender: the stages finish what they hold.
    let infer_result = infer_task.await;
    let commit_result = commit_task.await;
    // A worker that stops while its model still loads (a drained queue, a shutdown) waits for the
    // load to end: a process that exits while libtorch loads on the inference thread crashes in
    // libtorch's teardown (a `--drain` worker of the 16-process fleet test with no job to do did,
    // SIGSEGV, 2026-12-05).
    if !loading.is_settled() {
        info!("waiting for the model to finish loading before the worker stops");
    }
    let _ = loading.ready().await;
    events_stop.cancel();
    if tokio::time::timeout(Duration::from_secs(30), events_task).await.is_err() {
        warn!("the last completion events are still pending; another worker's sweep publishes them");
    }
    heartbeat.abort();
    voice_poll.abort();
    let (busy, alive) = clock.busy_alive_ms();
    if let Err(e) = db.worker_stopped(&worker_id, busy, alive).await {
        warn!(error = %e, "could not record worker stop");
    }
    if let Some((error, hint)) = fatal.error() {
        return Err(WorkerError::Permanent { error: error.to_string(), hint });
    }
    intake_result?;
    infer_result.map_err(|e| WorkerError::Stage(format!("infer: {e}")))?;
    commit_result.map_err(|e| WorkerError::Stage(format!("commit: {e}")))?;
    let summary = counters.summary(worker_id);
    info!(?summary, "worker stopped");
    Ok(summary)
}

/// Looks for voices added, replaced or removed in Postgres (CosyVoice2 models).
async fn voice_poll_loop(voices: Arc<VoiceBook>, every: Duration) {
    if !voices.is_shared() {
        return;
    }
    let mut tick = tokio::time::interval(every);
    tick.tick().await;
    loop {
        tick.tick().await;
        if let Err(e) = voices.refresh().await {
            warn!(error = %error_chain(&e), "could not refresh the voices; keeping the ones known");
        }
    }
}

async fn heartbeat_loop(db: Db, worker_id: String, clock: Arc<WorkerClock>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        let (busy, alive) = clock.busy_alive_ms();
        if let Err(e) = db.heartbeat(&worker_id, busy, alive).await {
            warn!(error = %e, "heartbeat failed");
        }
    }
}
