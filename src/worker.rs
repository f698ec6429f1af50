//! The worker: wires the stages together.
//!
//! ```text
//!  RabbitMQ ──consume──▶ parse/validate ──▶ batch policy ──(chan 1)──▶ claim (Postgres) + infer (model thread)
//!     ▲         │ poison: dead-letter with reason + rejections row + ack                     │
//!     │                                                                             (chan 1) ▼
//!     └──────────────── ack ◀── record (Postgres, one tx) ◀── upload (S3) ◀── encode (WAV)
//! ```
//!
//! Stages are tasks joined by bounded channels, so batch N+1's inference overlaps batch N's
//! encode/upload/record. Invariants (each has a test in `tests/`):
//! - a job is acked only after its audio object and its Postgres rows are committed;
//! - a redelivered job that is already `done` is acked without recomputation;
//! - a malformed message goes straight to the dead-letter queue with its reason (a `rejected`
//!   row too when its job_id can be read); it is never retried;
//! - an outage of S3 or Postgres delays work (retries with backoff, messages held unacked) but
//!   never drops it; a lost broker connection is re-established with backoff and whatever was
//!   unacked is redelivered;
//! - shutdown (the injected future) finishes the batch in progress and returns every unstarted
//!   message to the queue.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use futures::{StreamExt, TryStreamExt};
use lapin::Acker;
use lapin::options::{BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions, ConfirmSelectOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, info_span, warn, Instrument};
use uuid::Uuid;

use crate::audio::encode_wavs;
use crate::batch::memory::{MemoryBudget, Profile};
use crate::batch::split::{run_splitting, AttemptError, SplitEvent};
use crate::batch::{BatchOutcome, BatchPolicy, Decision, Flush, LengthBucketing, Pending};
use crate::config::{Config, SizingPolicy};
use crate::db::{BatchEvent, BatchRecord, Claim, Db, JobResult, WorkerRow};
use crate::gpu::sampler::{GpuSampler, GpuStats};
use crate::job::{model_tokens, parse_job, Job, Rejection};
use crate::model::{ModelError, ModelHandle, SynthItem};
use crate::queue::{self, QueueError};
use crate::storage::{AudioMeta, Storage};

/// Errors that stop a worker (everything else is retried or dead-lettered).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkerError {
    #[error(transparent)]
    Queue(#[from] QueueError),
    #[error(transparent)]
    Db(#[from] crate::db::DbError),
    #[error("a pipeline stage stopped unexpectedly: {0}")]
    Stage(String),
    #[error("cannot size batches by memory: {0}")]
    Sizing(String),
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
    pub rejected: u64,
    pub audio_seconds: f64,
}

#[derive(Default)]
struct Counters {
    batches: AtomicU64,
    jobs_done: AtomicU64,
    jobs_failed: AtomicU64,
    already_done: AtomicU64,
    rejected: AtomicU64,
    audio_ms: AtomicU64,
}

/// A delivery the worker holds. Settling it (ack / nack) consumes it; dropping it unsettled
/// leaves it to the broker (redelivered when the channel closes). Either way the held count
/// goes down, which is what `--drain` watches.
struct Held {
    acker: Acker,
    held: Arc<AtomicUsize>,
}

impl Held {
    async fn ack(self) -> bool {
        match self.acker.ack(BasicAckOptions::default()).await {
            Ok(true) => true,
            Ok(false) => {
                warn!("ack was not sent (channel closed or delivery already settled); the broker will redeliver");
                false
            }
            Err(e) => {
                warn!(error = %e, "ack failed; the broker will redeliver and the job will be acked as already done");
                false
            }
        }
    }

    async fn requeue(self) {
        if let Err(e) = self.acker.nack(BasicNackOptions { requeue: true, multiple: false }).await {
            debug!(error = %e, "nack failed; the broker requeues when the channel closes");
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.held.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A parsed job and its delivery.
struct Received {
    job: Job,
    tokens: Vec<i64>,
    voice: i64,
    delivery: Held,
}

/// A batch on its way through the pipeline.
struct InferredBatch {
    batch_id: Uuid,
    flush_reason: &'static str,
    started_at: DateTime<Utc>,
    queue_ms: f64,
    infer_ms: f64,
    claim_ms: f64,
    tokens: usize,
    padded_tokens: usize,
    padding_waste: f64,
    predicted_peak: Option<f64>,
    measured_peak: Option<u64>,
    gpu: Option<GpuStats>,
    /// Jobs with their audio, in batch order.
    done: Vec<(Received, Vec<f32>)>,
    /// Extra deliveries of a job in `done` (same job_id twice in one batch): acked with it.
    duplicates: Vec<Received>,
}

struct Shared {
    cfg: Config,
    db: Db,
    storage: Storage,
    model: ModelHandle,
    worker_id: String,
    stop: CancellationToken,
    counters: Counters,
    held: Arc<AtomicUsize>,
    /// A channel in confirm mode for dead-lettering, replaced on reconnect.
    dlq_channel: tokio::sync::RwLock<Option<Channel>>,
    /// NVML sampler (None on CPU or without NVML).
    sampler: Option<GpuSampler>,
    /// Price of an hour of this worker's device.
    hourly_usd: f64,
    started: Instant,
    /// Inference time so far (the rest of `started.elapsed()` is idle).
    busy_us: AtomicU64,
}

impl Shared {
    /// (busy, alive) milliseconds so far.
    fn busy_alive_ms(&self) -> (f64, f64) {
        (self.busy_us.load(Ordering::SeqCst) as f64 / 1000.0, self.started.elapsed().as_secs_f64() * 1000.0)
    }
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
    let worker_id = opts
        .worker_id
        .clone()
        .or_else(|| cfg.worker.id.clone())
        .unwrap_or_else(|| format!("{}-{}-{}", crate::db::hostname(), std::process::id(), &Uuid::new_v4().to_string()[..8]));
    let manifest = model.manifest().clone();
    let sampler = GpuSampler::start(model.device(), cfg.cost.sample_interval);
    let gpu_name = sampler.as_ref().map(|s| s.name().to_string());
    let hourly_usd = cfg.cost.prices.hourly(model.device(), gpu_name.as_deref());
    db.register_worker(&WorkerRow {
        worker_id: &worker_id,
        device: &model.device().to_string(),
        model: &manifest.name,
        precision: &model.precision().to_string(),
        gpu_name: gpu_name.as_deref(),
        hourly_usd,
    })
    .await?;
    info!(worker_id, model = %manifest.name, device = %model.device(), precision = %model.precision(), "worker started");

    let shared = Arc::new(Shared {
        cfg,
        db,
        storage,
        model,
        worker_id: worker_id.clone(),
        stop: CancellationToken::new(),
        counters: Counters::default(),
        held: Arc::new(AtomicUsize::new(0)),
        dlq_channel: tokio::sync::RwLock::new(None),
        sampler,
        hourly_usd,
        started: Instant::now(),
        busy_us: AtomicU64::new(0),
    });

    let (policy, prefetch) = build_policy(&shared.cfg, shared.model.manifest(), shared.model.device(), shared.model.precision())?;
    let (infer_tx, infer_rx) = mpsc::channel::<Assembled>(1);
    let (outcome_tx, outcome_rx) = mpsc::unbounded_channel::<BatchOutcome>();
    let (post_tx, post_rx) = mpsc::channel::<InferredBatch>(1);
    let infer_task = tokio::spawn(infer_stage(shared.clone(), infer_rx, post_tx, outcome_tx));
    let post_task = tokio::spawn(post_stage(shared.clone(), post_rx));
    let heartbeat = tokio::spawn(heartbeat_loop(shared.clone()));

    let intake = intake_loop(shared.clone(), policy, prefetch, infer_tx, outcome_rx, opts.drain, shutdown).await;

    // The intake has stopped and dropped its sender: the stages finish what they hold.
    let infer_res = infer_task.await;
    let post_res = post_task.await;
    heartbeat.abort();
    let (busy, alive) = shared.busy_alive_ms();
    if let Err(e) = shared.db.worker_stopped(&worker_id, busy, alive).await {
        warn!(error = %e, "could not record worker stop");
    }
    intake?;
    infer_res.map_err(|e| WorkerError::Stage(format!("infer: {e}")))?;
    post_res.map_err(|e| WorkerError::Stage(format!("post: {e}")))?;
    let c = &shared.counters;
    let summary = WorkerSummary {
        worker_id,
        batches: c.batches.load(Ordering::SeqCst),
        jobs_done: c.jobs_done.load(Ordering::SeqCst),
        jobs_failed: c.jobs_failed.load(Ordering::SeqCst),
        already_done: c.already_done.load(Ordering::SeqCst),
        rejected: c.rejected.load(Ordering::SeqCst),
        audio_seconds: c.audio_ms.load(Ordering::SeqCst) as f64 / 1000.0,
    };
    info!(?summary, "worker stopped");
    Ok(summary)
}

/// A batch as assembled, with the peak memory the policy predicted for it.
struct Assembled {
    flush: Flush<Received>,
    predicted_peak: Option<f64>,
}

/// The batch policy the configuration asks for, and the prefetch it needs (three batches of the
/// largest size it would admit for short jobs).
fn build_policy(
    cfg: &Config,
    manifest: &crate::model::Manifest,
    device: crate::model::Device,
    precision: crate::model::Precision,
) -> Result<(Box<dyn BatchPolicy<Received>>, u16), WorkerError> {
    let b = &cfg.batching;
    let admission = match cfg.memory.policy {
        SizingPolicy::Tokens => {
            info!(max_batch = b.max_batch, max_batch_tokens = b.max_batch_tokens, "batch sizing: padded-token cap");
            let policy = LengthBucketing::new(b.max_batch, b.max_wait, b.max_batch_tokens).with_max_length_ratio(b.max_length_ratio);
            return Ok((Box::new(policy), cfg.amqp.effective_prefetch(b.max_batch)));
        }
        SizingPolicy::Memory => memory_admission(cfg, manifest, device, precision)?,
    };
    let short_batch = admission.largest_batch(16, b.max_batch);
    let prefetch = if cfg.amqp.prefetch > 0 { cfg.amqp.prefetch } else { cfg.amqp.effective_prefetch(short_batch) };
    let policy = LengthBucketing::with_admission(b.max_batch, b.max_wait, admission).with_max_length_ratio(b.max_length_ratio);
    Ok((Box::new(policy), prefetch))
}

/// The memory budget for `device` and the matching calibration profile (or the built-in).
pub fn memory_admission(
    cfg: &Config,
    manifest: &crate::model::Manifest,
    device: crate::model::Device,
    precision: crate::model::Precision,
) -> Result<MemoryBudget, WorkerError> {
    let m = &cfg.memory;
    let info = crate::gpu::memory_info(device);
    let gpu_name = match (&info, device) {
        (Ok(i), _) => i.name.clone(),
        (Err(_), crate::model::Device::Cpu) => "cpu".to_string(),
        (Err(e), _) if m.budget_bytes.is_none() => {
            return Err(WorkerError::Sizing(format!(
                "{e}; set memory.budget_bytes, or memory.policy = \"tokens\""
            )))
        }
        (Err(_), _) => "unknown-gpu".to_string(),
    };
    let budget = match (m.budget_bytes, &info) {
        (Some(bytes), _) => bytes as f64,
        (None, Ok(i)) => m.vram_fraction * i.total_bytes as f64 - i.used_by_others_bytes as f64 - m.safety_margin_bytes as f64,
        (None, Err(e)) => return Err(WorkerError::Sizing(e.to_string())),
    };
    if budget <= 0.0 {
        return Err(WorkerError::Sizing(format!(
            "no memory left for batches on {gpu_name}: {:.0}% of {} bytes minus other processes ({} bytes) minus the margin is {budget:.0}",
            m.vram_fraction * 100.0,
            info.as_ref().map(|i| i.total_bytes).unwrap_or(0),
            info.as_ref().map(|i| i.used_by_others_bytes).unwrap_or(0),
        )));
    }
    let precision = precision.to_string();
    let profile = match Profile::load_matching(&m.calibration_dir, &manifest.name, &gpu_name, &precision) {
        Ok(Some(p)) => {
            info!(model = %manifest.name, gpu = %gpu_name, %precision, r2 = p.fit.r2, worst_rel_error = p.fit.worst_rel_error, "using calibration profile");
            p
        }
        Ok(None) | Err(_) => {
            warn!(
                "no calibration profile for model {} on {gpu_name} {precision} in {}; using a conservative built-in. \
                 Run `voxbatch calibrate --model {} --device {device} --precision {precision}` for full batches",
                manifest.name,
                m.calibration_dir.display(),
                manifest.dir.display()
            );
            Profile::builtin(&manifest.name, &gpu_name, &precision, manifest.frames_per_token, manifest.samples_per_frame, manifest.weights_bytes())
        }
    };
    let admission = MemoryBudget::new(
        profile.fit.model,
        manifest.frames_per_token as usize,
        budget,
        cfg.batching.max_batch_tokens,
        m.aimd,
    );
    info!(budget_bytes = budget as u64, gpu = %gpu_name, source = %profile.source, "batch sizing: predicted peak memory under budget");
    Ok(admission)
}

async fn heartbeat_loop(shared: Arc<Shared>) {
    let mut tick = tokio::time::interval(shared.cfg.worker.heartbeat);
    loop {
        tick.tick().await;
        let (busy, alive) = shared.busy_alive_ms();
        if let Err(e) = shared.db.heartbeat(&shared.worker_id, busy, alive).await {
            warn!(error = %e, "heartbeat failed");
        }
    }
}

/// Exponential backoff with jitter between `min` and `max`.
fn backoff(attempt: u32, min: Duration, max: Duration) -> Duration {
    let base = min.as_secs_f64() * 2f64.powi(attempt.min(30) as i32);
    let capped = base.min(max.as_secs_f64());
    Duration::from_secs_f64(capped * (0.5 + rand::random::<f64>() * 0.5))
}

/// Retries `f` with backoff until it succeeds. Gives up (returning the last error; the caller then
/// requeues what it holds) after `worker.max_hold` — so that messages are never held unacked
/// into RabbitMQ's consumer timeout — or, once the worker is stopping, after a few more attempts.
async fn retry<T, E, F, Fut>(shared: &Shared, what: &'static str, mut f: F) -> Result<T, E>
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let (min, max) = (shared.cfg.worker.retry_min, shared.cfg.worker.retry_max);
    let mut attempt = 0u32;
    let mut after_stop = 0u32;
    let started = Instant::now();
    loop {
        match f().await {
            Ok(v) => {
                if attempt > 0 {
                    info!(what, attempts = attempt + 1, "succeeded after retrying");
                }
                return Ok(v);
            }
            Err(e) => {
                if started.elapsed() >= shared.cfg.worker.max_hold {
                    error!(what, error = %e, held_s = started.elapsed().as_secs(), "giving up for now: messages go back to the queue (consumer-timeout guard)");
                    return Err(e);
                }
                if shared.stop.is_cancelled() {
                    after_stop += 1;
                    if after_stop > 3 {
                        error!(what, error = %e, "giving up: the worker is stopping; messages go back to the queue");
                        return Err(e);
                    }
                }
                let wait = backoff(attempt, min, max);
                warn!(what, error = %e, attempt = attempt + 1, retry_in_ms = wait.as_millis() as u64, "will retry");
                attempt += 1;
                tokio::time::sleep(wait).await;
            }
        }
    }
}

/// Connects to the broker, retrying with backoff until it works or the worker stops.
async fn connect_consumer(shared: &Shared, prefetch: u16) -> Option<(Connection, Channel, lapin::Consumer)> {
    let cfg = &shared.cfg.amqp;
    let mut attempt = 0;
    loop {
        if shared.stop.is_cancelled() {
            return None;
        }
        let result: Result<_, QueueError> = async {
            let conn = queue::connect(cfg, &format!("voxbatch-worker {}", shared.worker_id)).await?;
            let channel = conn.create_channel().await.map_err(|source| QueueError::Amqp { op: "channel.open", source })?;
            queue::declare_topology(&channel, cfg).await?;
            channel
                .basic_qos(prefetch, BasicQosOptions { global: false })
                .await
                .map_err(|source| QueueError::Amqp { op: "basic.qos", source })?;
            let dlq = conn.create_channel().await.map_err(|source| QueueError::Amqp { op: "channel.open", source })?;
            dlq.confirm_select(ConfirmSelectOptions::default())
                .await
                .map_err(|source| QueueError::Amqp { op: "confirm.select", source })?;
            let consumer = channel
                .basic_consume(
                    cfg.queue.as_str().into(),
                    shared.worker_id.as_str().into(),
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await
                .map_err(|source| QueueError::Amqp { op: "basic.consume", source })?;
            Ok((conn, channel, dlq, consumer))
        }
        .await;
        match result {
            Ok((conn, channel, dlq, consumer)) => {
                *shared.dlq_channel.write().await = Some(dlq);
                info!(queue = %cfg.queue, prefetch, "consuming");
                return Some((conn, channel, consumer));
            }
            Err(e) => {
                let wait = backoff(attempt, cfg.reconnect_min, cfg.reconnect_max);
                if matches!(e, QueueError::TopologyMismatch { .. }) {
                    error!(error = %e, source = ?std::error::Error::source(&e), retry_in_ms = wait.as_millis() as u64, "cannot consume");
                } else {
                    warn!(error = %e, retry_in_ms = wait.as_millis() as u64, "broker unavailable; reconnecting");
                }
                attempt += 1;
                tokio::select! { _ = tokio::time::sleep(wait) => {}, _ = shared.stop.cancelled() => return None }
            }
        }
    }
}

/// Consumes deliveries, validates them, and feeds the batch policy; flushes batches to the
/// inference stage. Returns when shutdown resolves (or the drain finds nothing left).
#[allow(clippy::too_many_arguments)]
async fn intake_loop(
    shared: Arc<Shared>,
    mut policy: Box<dyn BatchPolicy<Received>>,
    prefetch: u16,
    infer_tx: mpsc::Sender<Assembled>,
    mut outcomes: mpsc::UnboundedReceiver<BatchOutcome>,
    drain: bool,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), WorkerError> {
    let manifest = shared.model.manifest().clone();
    let mut seq = 0u64;
    tokio::pin!(shutdown);
    let mut shutdown_fired = false;
    let mut drain_tick = tokio::time::interval(shared.cfg.worker.drain_poll);
    let mut empty_polls = 0;

    'connection: while !shutdown_fired {
        let connected = tokio::select! {
            c = connect_consumer(&shared, prefetch) => c,
            _ = &mut shutdown => { shutdown_fired = true; None }
        };
        let Some((conn, channel, mut consumer)) = connected else {
            break;
        };
        loop {
            while let Ok(outcome) = outcomes.try_recv() {
                policy.observe(&outcome);
            }
            // A batch is formed only when the inference stage can take it: until then the pool keeps
            // absorbing deliveries, so each batch is chosen from everything held at that moment
            // (not from a stale pool while the previous batch waits in the channel).
            let room = infer_tx.capacity() > 0;
            let deadline = if room {
                match policy.decide(Instant::now(), false) {
                    Decision::Flush(flush) => {
                        let max_tokens = flush.items.iter().map(|p| p.tokens).max().unwrap_or(0);
                        let predicted_peak = policy.predicted_peak(flush.items.len(), max_tokens);
                        send_batch(&infer_tx, Assembled { flush, predicted_peak }).await?;
                        continue;
                    }
                    Decision::Wait(at) => at,
                }
            } else {
                None
            };
            tokio::select! {
                _ = &mut shutdown => break,
                permit = infer_tx.reserve(), if !room => {
                    // The inference stage took the queued batch: decide again with a full view.
                    drop(permit.map_err(|_| WorkerError::Stage("inference stage stopped".into()))?);
                }
                delivery = consumer.next() => match delivery {
                    Some(Ok(delivery)) => {
                        empty_polls = 0;
                        shared.held.fetch_add(1, Ordering::SeqCst);
                        let held = Held { acker: delivery.acker.clone(), held: shared.held.clone() };
                        let parsed = parse_job(&delivery.data, &shared.cfg.limits, Some(&manifest.voices), true).and_then(|job| {
                            // What the job gives this model: tokenized text or its speech tokens.
                            match model_tokens(&job, &manifest) {
                                Ok(tokens) => Ok((job, tokens)),
                                Err(kind) => Err(Rejection { job_id: Some(job.job_id), kind }),
                            }
                        });
                        match parsed {
                            Ok((job, tokens)) => {
                                let voice = manifest.voice_index(&job.voice).unwrap_or(0);
                                seq += 1;
                                let length = tokens.len() + manifest.prompt_tokens(voice);
                                policy.push(Pending { tokens: length, priority: job.priority, arrived: Instant::now(), seq,
                                    item: Received { job, tokens, voice, delivery: held } });
                            }
                            Err(rejection) => {
                                let shared = shared.clone();
                                tokio::spawn(async move { reject(&shared, rejection, delivery.data, held).await });
                            }
                        }
                    }
                    Some(Err(e)) => {
                        warn!(error = %e, "consumer failed; reconnecting (unacked messages will be redelivered)");
                        drop_held(policy.as_mut());
                        let _ = conn.close(0, "reconnecting".into()).await;
                        continue 'connection;
                    }
                    None => {
                        warn!("the broker cancelled the consumer; re-subscribing");
                        drop_held(policy.as_mut());
                        let _ = conn.close(0, "re-subscribing".into()).await;
                        continue 'connection;
                    }
                },
                _ = sleep_until(deadline), if deadline.is_some() => {}
                _ = drain_tick.tick(), if drain => {
                    if policy.is_empty() && shared.held.load(Ordering::SeqCst) == 0 {
                        match queue::queue_depths(&channel, &shared.cfg.amqp).await {
                            Ok((0, _)) => {
                                empty_polls += 1;
                                if empty_polls >= 2 {
                                    info!("queue drained");
                                    let _ = channel.basic_cancel(shared.worker_id.as_str().into(), BasicCancelOptions::default()).await;
                                    break;
                                }
                            }
                            Ok(_) => empty_polls = 0,
                            Err(e) => debug!(error = %e, "queue depth check failed"),
                        }
                    } else {
                        empty_polls = 0;
                    }
                }
            }
        }
        // Stopping: no new deliveries; return what was never started to the queue.
        shared.stop.cancel();
        let _ = channel.basic_cancel(shared.worker_id.as_str().into(), BasicCancelOptions::default()).await;
        let unstarted = policy.take_all();
        if !unstarted.is_empty() {
            info!(count = unstarted.len(), "returning unstarted jobs to the queue");
        }
        for p in unstarted {
            p.item.delivery.requeue().await;
        }
        drop(infer_tx);
        // Keep the connection open until the stages have acked what they hold.
        while shared.held.load(Ordering::SeqCst) > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = conn.close(200, "worker stopping".into()).await;
        return Ok(());
    }
    shared.stop.cancel();
    drop(infer_tx);
    Ok(())
}

/// Jobs received on a dead channel cannot be acked; the broker redelivers them.
fn drop_held(policy: &mut dyn BatchPolicy<Received>) {
    let lost = policy.take_all();
    if !lost.is_empty() {
        info!(count = lost.len(), "dropping jobs of the closed channel; the broker redelivers them");
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

async fn send_batch(tx: &mpsc::Sender<Assembled>, batch: Assembled) -> Result<(), WorkerError> {
    tx.send(batch).await.map_err(|_| WorkerError::Stage("inference stage stopped".into()))
}

/// Dead-letters a message with its reason, records it, and acks the original.
async fn reject(shared: &Shared, rejection: Rejection, body: Vec<u8>, held: Held) {
    warn!(job_id = ?rejection.job_id, code = rejection.kind.code(), reason = %rejection, "rejecting message");
    if let Err(e) = retry(shared, "record rejection", || shared.db.record_rejection(&rejection, &body, &shared.worker_id)).await {
        warn!(error = %e, "rejection not recorded in postgres; requeueing");
        held.requeue().await;
        return;
    }
    let channel = shared.dlq_channel.read().await.clone();
    let published = match channel {
        Some(ch) => {
            queue::dead_letter(&ch, &shared.cfg.amqp, &body, rejection.kind.code(), &rejection.to_string(), rejection.job_id).await
        }
        None => Err(QueueError::Timeout { op: "dead-letter (no channel)" }),
    };
    match published {
        Ok(()) => {
            shared.counters.rejected.fetch_add(1, Ordering::SeqCst);
            held.ack().await;
        }
        Err(e) => {
            warn!(error = %e, "could not dead-letter; requeueing");
            held.requeue().await;
        }
    }
}

/// Claims each batch in Postgres and runs it on the model.
async fn infer_stage(
    shared: Arc<Shared>,
    mut rx: mpsc::Receiver<Assembled>,
    post_tx: mpsc::Sender<InferredBatch>,
    outcomes: mpsc::UnboundedSender<BatchOutcome>,
) {
    while let Some(Assembled { flush, predicted_peak }) = rx.recv().await {
        let batch_id = Uuid::new_v4();
        if shared.stop.is_cancelled() {
            // Not started: back to the queue.
            for p in flush.items {
                p.item.delivery.requeue().await;
            }
            continue;
        }
        let span = info_span!("batch", %batch_id, size = flush.items.len(), reason = flush.reason.as_str());
        if let Some(batch) = run_batch(&shared, batch_id, flush, predicted_peak, &outcomes).instrument(span.clone()).await {
            if post_tx.send(batch).await.is_err() {
                error!(parent: &span, "post stage stopped; the batch's messages go back to the queue");
            }
        }
    }
}

/// Claim + inference for one batch. Returns `None` when nothing is left to upload.
async fn run_batch(
    shared: &Shared,
    batch_id: Uuid,
    flush: Flush<Received>,
    predicted_peak: Option<f64>,
    outcomes: &mpsc::UnboundedSender<BatchOutcome>,
) -> Option<InferredBatch> {
    let reason = flush.reason.as_str();
    let oldest = flush.items.iter().map(|p| p.arrived).min().unwrap_or_else(Instant::now);
    let queue_ms = oldest.elapsed().as_secs_f64() * 1000.0;
    let items: Vec<Received> = flush.items.into_iter().map(|p| p.item).collect();

    // Duplicates inside the batch ride along with their first copy.
    let mut first: HashMap<Uuid, usize> = HashMap::new();
    let mut unique = Vec::with_capacity(items.len());
    let mut duplicates = Vec::new();
    for r in items {
        if first.contains_key(&r.job.job_id) {
            duplicates.push(r);
        } else {
            first.insert(r.job.job_id, unique.len());
            unique.push(r);
        }
    }

    let claim_started = Instant::now();
    let jobs: Vec<Job> = unique.iter().map(|r| r.job.clone()).collect();
    let decisions = match retry(shared, "claim jobs", || shared.db.claim(&jobs, &shared.worker_id)).await {
        Ok(d) => d,
        Err(_) => {
            for r in unique.into_iter().chain(duplicates) {
                r.delivery.requeue().await;
            }
            return None;
        }
    };
    let claim_ms = claim_started.elapsed().as_secs_f64() * 1000.0;

    let mut to_run = Vec::new();
    let mut settled_ids = Vec::new();
    for (r, decision) in unique.into_iter().zip(decisions) {
        match decision {
            Claim::Proceed => to_run.push(r),
            Claim::AlreadyDone => {
                info!(job_id = %r.job.job_id, "already done; acking without synthesis");
                shared.counters.already_done.fetch_add(1, Ordering::SeqCst);
                settled_ids.push(r.job.job_id);
                r.delivery.ack().await;
            }
            Claim::Conflict(kind) => {
                settled_ids.push(r.job.job_id);
                let rejection = Rejection { job_id: Some(r.job.job_id), kind };
                reject(shared, rejection, r.job.to_json(), r.delivery).await;
            }
        }
    }
    // Duplicates of settled jobs are settled the same way (acked: their first copy decided).
    let (dup_settled, duplicates): (Vec<_>, Vec<_>) = duplicates.into_iter().partition(|d| settled_ids.contains(&d.job.job_id));
    for d in dup_settled {
        d.delivery.ack().await;
    }
    if to_run.is_empty() {
        return None;
    }

    let started_at = Utc::now();
    let tokens: usize = to_run.iter().map(|r| r.tokens.len()).sum();
    let max_len = to_run.iter().map(|r| r.tokens.len()).max().unwrap_or(0);
    let padded_tokens = max_len * to_run.len();
    let padding_waste = if padded_tokens == 0 { 0.0 } else { 1.0 - tokens as f64 / padded_tokens as f64 };
    if let Some(s) = &shared.sampler {
        s.begin();
    }
    let infer_started = Instant::now();
    let run = synthesize_splitting(shared, to_run).await;
    let infer_elapsed = infer_started.elapsed();
    let gpu = shared.sampler.as_ref().map(|s| s.end());
    shared.busy_us.fetch_add(infer_elapsed.as_micros() as u64, Ordering::SeqCst);
    let infer_ms = infer_elapsed.as_secs_f64() * 1000.0;
    let oom = run.events.iter().any(|e| matches!(e, SplitEvent::OutOfMemory { .. }));
    let _ = outcomes.send(if oom { BatchOutcome::OutOfMemory } else { BatchOutcome::Clean });
    record_events(shared, batch_id, &run.events).await;
    for r in run.given_back {
        r.delivery.requeue().await;
    }
    if !run.failed.is_empty() {
        fail_jobs(shared, run.failed).await;
    }
    let measured_peak = run.peak;
    let done = run.done;
    if done.is_empty() {
        return None;
    }
    let done_ids: Vec<Uuid> = done.iter().map(|(r, _)| r.job.job_id).collect();
    let (duplicates, orphans): (Vec<_>, Vec<_>) = duplicates.into_iter().partition(|d| done_ids.contains(&d.job.job_id));
    for o in orphans {
        o.delivery.ack().await; // its first copy failed and was dead-lettered with the reason
    }
    info!(jobs = done.len(), infer_ms = infer_ms as u64, "inferred");
    Some(InferredBatch {
        batch_id,
        flush_reason: reason,
        started_at,
        queue_ms,
        infer_ms,
        claim_ms,
        tokens,
        padded_tokens,
        padding_waste,
        predicted_peak,
        measured_peak,
        gpu,
        done,
        duplicates,
    })
}

/// The outcome of running one batch with splitting.
struct BatchRun {
    done: Vec<(Received, Vec<f32>)>,
    failed: Vec<(Received, String)>,
    given_back: Vec<Received>,
    events: Vec<SplitEvent>,
    /// Highest peak memory over the forward passes.
    peak: Option<u64>,
}

/// Runs the batch on the model; on an out-of-memory error (cached memory is released by the
/// model thread) or any inference error, splits it in two and retries each half, down to single
/// jobs (see `batch::split`).
async fn synthesize_splitting(shared: &Shared, batch: Vec<Received>) -> BatchRun {
    let peak = Arc::new(AtomicU64::new(0));
    let run = run_splitting(batch, |r: &Received| r.tokens.len(), |part: &[Received]| {
        let items: Vec<SynthItem> = part.iter().map(|r| SynthItem { tokens: r.tokens.clone(), voice: r.voice }).collect();
        let model = shared.model.clone();
        let peak = peak.clone();
        async move {
            match model.synthesize(items).await {
                Ok(out) => {
                    if let Some(p) = out.peak_bytes {
                        peak.fetch_max(p, Ordering::SeqCst);
                    }
                    Ok(out.audio)
                }
                Err(ModelError::ThreadGone) => Err(AttemptError::Fatal("the inference thread is gone".into())),
                Err(e) if e.is_oom() => Err(AttemptError::OutOfMemory(error_chain(&e))),
                Err(e) => Err(AttemptError::Failed(error_chain(&e))),
            }
        }
    })
    .await;
    for e in &run.events {
        match e {
            SplitEvent::OutOfMemory { size, max_tokens } => warn!(size, max_tokens, "out of memory; splitting the batch"),
            SplitEvent::Split { size, into } => debug!(size, ?into, "split"),
            SplitEvent::FailedAlone { reason } => warn!(%reason, "a job failed alone"),
        }
    }
    let peak = peak.load(Ordering::SeqCst);
    BatchRun { done: run.done, failed: run.failed, given_back: run.given_back, events: run.events, peak: (peak > 0).then_some(peak) }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(cause) = src {
        s.push_str(": ");
        s.push_str(&cause.to_string());
        src = cause.source();
    }
    s
}

/// Records a batch's OOM/split/failure events (best effort: they are also in the logs).
async fn record_events(shared: &Shared, batch_id: Uuid, events: &[SplitEvent]) {
    let rows: Vec<BatchEvent> = events
        .iter()
        .map(|e| match e {
            SplitEvent::OutOfMemory { size, max_tokens } => {
                BatchEvent { kind: "oom", batch_size: *size as i32, max_tokens: Some(*max_tokens as i32), detail: None }
            }
            SplitEvent::Split { size, into } => {
                BatchEvent { kind: "split", batch_size: *size as i32, max_tokens: None, detail: Some(format!("{} + {}", into.0, into.1)) }
            }
            SplitEvent::FailedAlone { reason } => {
                BatchEvent { kind: "failed_alone", batch_size: 1, max_tokens: None, detail: Some(reason.clone()) }
            }
        })
        .collect();
    if let Err(e) = shared.db.record_batch_events(batch_id, &shared.worker_id, &rows).await {
        warn!(error = %e, "batch events not recorded");
    }
}

/// Marks jobs `failed` and dead-letters them with the reason.
async fn fail_jobs(shared: &Shared, failed: Vec<(Received, String)>) {
    for (r, reason) in failed {
        error!(job_id = %r.job.job_id, %reason, "job failed");
        let ids = [r.job.job_id];
        if retry(shared, "mark failed", || shared.db.mark_failed(&ids, &reason)).await.is_err() {
            r.delivery.requeue().await;
            continue;
        }
        shared.counters.jobs_failed.fetch_add(1, Ordering::SeqCst);
        let ch = shared.dlq_channel.read().await.clone();
        let published = match ch {
            Some(ch) => queue::dead_letter(&ch, &shared.cfg.amqp, &r.job.to_json(), "synthesis_failed", &reason, Some(r.job.job_id)).await,
            None => Err(QueueError::Timeout { op: "dead-letter (no channel)" }),
        };
        match published {
            Ok(()) => {
                r.delivery.ack().await;
            }
            Err(e) => {
                warn!(error = %e, "could not dead-letter a failed job; requeueing");
                r.delivery.requeue().await;
            }
        }
    }
}

/// Encodes, uploads, records and acks each inferred batch.
async fn post_stage(shared: Arc<Shared>, mut rx: mpsc::Receiver<InferredBatch>) {
    while let Some(batch) = rx.recv().await {
        let span = info_span!("batch", batch_id = %batch.batch_id, size = batch.done.len());
        commit_batch(&shared, batch).instrument(span).await;
    }
}

async fn commit_batch(shared: &Arc<Shared>, batch: InferredBatch) {
    let manifest = shared.model.manifest();
    let sample_rate = manifest.sample_rate;
    let encode_started = Instant::now();
    let (received, audio): (Vec<Received>, Vec<Vec<f32>>) = batch.done.into_iter().unzip();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(16);
    let encoded = match tokio::task::spawn_blocking(move || encode_wavs(&audio, sample_rate, threads)).await {
        Ok(e) => e,
        Err(e) => {
            error!(error = %e, "encoding panicked; requeueing the batch");
            for r in received.into_iter().chain(batch.duplicates) {
                r.delivery.requeue().await;
            }
            return;
        }
    };
    let encode_ms = encode_started.elapsed().as_secs_f64() * 1000.0;

    let upload_started = Instant::now();
    let keys: Vec<String> = received.iter().map(|r| shared.storage.key(&r.job.campaign, r.job.job_id)).collect();
    let uploads: Vec<(String, Vec<u8>, AudioMeta)> = received
        .iter()
        .zip(&encoded)
        .zip(&keys)
        .map(|((r, enc), key)| {
            let meta = AudioMeta { job_id: r.job.job_id, model: manifest.name.clone(), voice: r.job.voice.clone(), sha256: enc.sha256.clone() };
            (key.clone(), enc.wav.clone(), meta)
        })
        .collect();
    let uploaded = futures::stream::iter(uploads.into_iter().map(|(key, wav, meta)| {
        let shared = shared.clone();
        async move { retry(&shared, "upload audio", || shared.storage.put(&key, wav.clone(), &meta)).await }
    }))
    .buffer_unordered(shared.cfg.storage.upload_concurrency)
    .try_collect::<Vec<()>>()
    .await;
    if uploaded.is_err() {
        for r in received.into_iter().chain(batch.duplicates) {
            r.delivery.requeue().await;
        }
        return;
    }
    let upload_ms = upload_started.elapsed().as_secs_f64() * 1000.0;

    let results: Vec<JobResult> = received
        .iter()
        .zip(&encoded)
        .zip(&keys)
        .map(|((r, enc), key)| JobResult { job_id: r.job.job_id, s3_key: key.clone(), audio_seconds: enc.seconds, sha256: enc.sha256.clone() })
        .collect();
    let audio_seconds: f64 = results.iter().map(|r| r.audio_seconds).sum();
    let db_started = Instant::now();
    let cost = shared.cfg.cost.prices.batch_cost(shared.hourly_usd, batch.infer_ms, batch.gpu.as_ref().and_then(|g| g.energy_j));
    let mut record = BatchRecord {
        batch_id: batch.batch_id,
        worker_id: shared.worker_id.clone(),
        model: manifest.name.clone(),
        device: shared.model.device().to_string(),
        precision: shared.model.precision().to_string(),
        batch_size: results.len() as i32,
        tokens: batch.tokens as i64,
        padded_tokens: batch.padded_tokens as i64,
        flush_reason: batch.flush_reason.to_string(),
        queue_ms: batch.queue_ms,
        infer_ms: batch.infer_ms,
        encode_ms,
        upload_ms,
        db_ms: batch.claim_ms,
        audio_seconds,
        started_at: batch.started_at,
        finished_at: Utc::now(),
        padding_waste: Some(batch.padding_waste as f32),
        predicted_peak_bytes: batch.predicted_peak.map(|p| p as i64),
        measured_peak_bytes: batch.measured_peak.map(|p| p as i64),
        process_mem_max_bytes: match shared.model.device() {
            // On CPU the measured peak is the process's resident set.
            crate::model::Device::Cpu => batch.measured_peak.map(|p| p as i64),
            crate::model::Device::Cuda(_) => batch.gpu.as_ref().and_then(|g| g.process_mem_max_bytes).map(|b| b as i64),
        },
        hourly_usd: Some(cost.hourly_usd),
        cost_usd: Some(cost.cost_usd),
        energy_usd: cost.energy_usd,
        gpu: batch.gpu,
    };
    let committed = retry(shared, "record batch", || {
        record.finished_at = Utc::now();
        record.db_ms = batch.claim_ms + db_started.elapsed().as_secs_f64() * 1000.0;
        let record = record.clone();
        let results = &results;
        async move { shared.db.complete_batch(&record, results).await }
    })
    .await;
    if committed.is_err() {
        for r in received.into_iter().chain(batch.duplicates) {
            r.delivery.requeue().await;
        }
        return;
    }
    // Committed: now, and only now, ack.
    let n = received.len() as u64;
    for r in received.into_iter().chain(batch.duplicates) {
        r.delivery.ack().await;
    }
    let c = &shared.counters;
    c.batches.fetch_add(1, Ordering::SeqCst);
    c.jobs_done.fetch_add(n, Ordering::SeqCst);
    c.audio_ms.fetch_add((audio_seconds * 1000.0) as u64, Ordering::SeqCst);
    info!(
        jobs = n,
        audio_seconds = format!("{audio_seconds:.1}"),
        infer_ms = batch.infer_ms as u64,
        encode_ms = encode_ms as u64,
        upload_ms = upload_ms as u64,
        "batch committed"
    );
}
