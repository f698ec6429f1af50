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
//!   drops it; past the hold limit messages are given back without spending their delivery budget,
//!   their finished audio kept in the spool (`spool.rs`) so that it is not synthesized again;
//! - two deliveries of one job are never synthesized at once (claims in one transaction);
//! - shutdown (the injected future) finishes the batch in progress and gives back the rest.
//!
//! [`run`] wires the stages and nothing else; `lifecycle.rs` prepares a worker (checks, loads,
//! registration) and ends it (the stages' ends, last events, summary).
//!
//! Neighbours: `commands::work` builds a worker per device; `sizing` chooses the batch policy.

mod commit;
mod delivery;
pub mod events;
mod gate;
mod infer;
mod intake;
mod lifecycle;
pub mod retry;
mod spool;
mod text_prep;

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::warn;
use uuid::Uuid;

pub use delivery::RETURNED_HEADER;
pub use infer::{error_chain, synthesize_splitting, ModelRun};

use crate::config::Config;
use crate::db::{ClaimLease, Db};
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
    /// Jobs the model made audio for (a job given back and synthesized again counts twice).
    pub jobs_synthesized: u64,
    /// Jobs whose audio came from the spool (made by an earlier claim, not synthesized again).
    pub jobs_from_spool: u64,
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
    synthesized: AtomicU64,
    from_spool: AtomicU64,
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
    fn add_synthesized(&self, n: u64) {
        self.synthesized.fetch_add(n, Ordering::SeqCst);
    }
    fn add_from_spool(&self, n: u64) {
        self.from_spool.fetch_add(n, Ordering::SeqCst);
        crate::metrics::jobs_from_spool(n);
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
            jobs_synthesized: self.synthesized.load(Ordering::SeqCst),
            jobs_from_spool: self.from_spool.load(Ordering::SeqCst),
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

/// Runs a worker until `shutdown` resolves (or, with `drain`, until the queue is empty): wires
/// the stages (`lifecycle` prepares them and ends them).
pub async fn run(
    cfg: Config,
    model: ModelHandle,
    db: Db,
    storage: Storage,
    opts: WorkerOptions,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<WorkerSummary, WorkerError> {
    let worker_id = opts.worker_id.clone().or_else(|| cfg.worker.id.clone()).unwrap_or_else(new_worker_id);
    let lifecycle::Setup { manifest, device, precision, sampler, hourly_usd, frontend, sizing, voices } =
        lifecycle::prepare(&cfg, &model, &db, &worker_id).await?;
    let loading = model.clone();
    let (stop, counters, clock, fatal) = (CancellationToken::new(), Arc::new(Counters::default()), Arc::new(WorkerClock::new()), Arc::new(retry::Fatal::default()));
    let retry = retry::Retry { min: cfg.worker.retry_min, max: cfg.worker.retry_max, max_hold: cfg.worker.max_hold, stop: stop.clone(), fatal: fatal.clone() };
    let outbox = Arc::new(delivery::Outbox::new(cfg.amqp.clone()));
    let settler = Arc::new(delivery::Settler { db: db.clone(), outbox: outbox.clone(), retry, worker_id: worker_id.clone(), counters: counters.clone() });
    // Text models form each batch when the inference stage is idle (gate.rs says why); the model
    // may still be loading (`ModelHandle::start`): the gate is held until it is ready.
    let gate = frontend.is_some().then(|| Arc::new(gate::InferenceGate::loading()));
    let ((batch_tx, batch_rx), (post_tx, post_rx)) = (mpsc::channel(1), mpsc::channel(1));
    let ((outcome_tx, outcome_rx), (return_tx, return_rx)) = (mpsc::unbounded_channel(), mpsc::unbounded_channel());
    let spool = Arc::new(spool::Spool::new(&cfg.worker, &manifest.name, &cfg.output));
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
        spool: spool.clone(),
    };
    let (events_wake, events_stop) = (Arc::new(tokio::sync::Notify::new()), CancellationToken::new());
    let sweep = events::EventSweep::for_worker(&cfg, db.clone(), storage.clone(), events_wake.clone());
    let commit = commit::Commit {
        db: db.clone(),
        storage,
        events: events_wake,
        output: cfg.output.clone(),
        spool,
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
    // A text model's manifest has its LM (`Manifest::load` refuses one without).
    let family = manifest.llm().map_or(crate::model::llm::family::LmFamily::Cosyvoice2, |(f, _)| f);
    let text = frontend.map(|(frontend, threads)| text_prep::TextPrep::new(frontend, family, threads, &cfg, settler.clone(), stop.clone(), return_tx.clone()));
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
        held: delivery::HeldCount::default(),
        stop,
        fatal: fatal.clone(),
        outbox,
        settler,
    };
    let channels = intake::IntakeChannels { batches: batch_tx, outcomes: outcome_rx, returns: return_rx, prepared: return_tx.clone(), gate };
    let tasks = lifecycle::Tasks {
        infer: tokio::spawn(infer.run(batch_rx, post_tx, outcome_tx, return_tx)),
        commit: tokio::spawn(commit.run(post_rx)),
        events: tokio::spawn(sweep.run(events_stop.clone())),
        events_stop,
        heartbeat: tokio::spawn(heartbeat_loop(db.clone(), worker_id.clone(), clock.clone(), cfg.worker.heartbeat)),
        voice_poll: tokio::spawn(voice_poll_loop(voices, cfg.voices.refresh)),
    };
    let intake_result = intake.run(sizing.policy, channels, shutdown).await;
    lifecycle::finish(tasks, intake_result, loading, &db, worker_id, &clock, &counters, &fatal).await
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
