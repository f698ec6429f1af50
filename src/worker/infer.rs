//! Inference: claim a batch's jobs in Postgres, run it on the model thread, hand the audio on.
//!
//! [`synthesize_splitting`] is the one split-on-failure path around the model (the policy bench
//! calls it too): an out-of-memory error or any inference error splits the batch in halves down
//! to single jobs; a job that fails alone is failed with its reason; a GPU failure gives the
//! batch back and stops the worker (no job's fault). Claims decide per job:
//! synthesize it, ack it (already done), reject it (conflicting content), or park it for a
//! while when another delivery of the same job is being synthesized right now. A job claimed
//! again whose finished audio is in the spool (its batch was given back after it was made) goes to
//! the commit stage with that audio, not to the model.
//!
//! Neighbours: `intake` sends [`Assembled`] batches and receives parked jobs back; `commit`
//! receives [`InferredBatch`]es; `spool` keeps finished audio; `delivery` settles; `db` claims;
//! `model` runs.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, info_span, warn, Instrument};
use uuid::Uuid;

use super::delivery::Settler;
use super::gate::InferenceGate;
use super::intake::{Assembled, Received};
use super::spool::Spool;
use super::{Counters, WorkerClock};
use crate::audio::{EncodedAudio, Waveform};
use crate::batch::split::{run_splitting, AttemptError, SplitEvent};
use crate::batch::{padding, BatchOutcome};
use crate::db::{BatchEvent, Claim, ClaimLease, Db};
use crate::gpu::sampler::{GpuSampler, GpuStats};
use crate::model::{add_stages, ModelError, ModelHandle, StageTime, SynthItem};

/// A batch whose audio is ready to be committed.
pub struct InferredBatch {
    pub meta: BatchMeta,
    /// Jobs with their audio: synthesized in this batch, then taken from the spool.
    pub done: Vec<(Received, JobAudio)>,
    /// Extra deliveries of a job in `done` (same job_id twice in one batch): acked with it.
    pub duplicates: Vec<Received>,
}

/// A job's finished audio, as the commit stage gets it.
pub enum JobAudio {
    /// Made by the model in this batch; the commit stage encodes it.
    Synthesized {
        waveform: Waveform,
        /// The job's share of the batch's device time.
        infer_ms: f64,
    },
    /// Made by an earlier claim's batch, encoded, kept in the spool when that batch was given back.
    Spooled {
        audio: EncodedAudio,
        /// The job's share of the device time of the batch that made it.
        infer_ms: f64,
    },
}

impl JobAudio {
    /// The job's share of the device time that made its audio (billed by the batch committing it).
    pub fn infer_ms(&self) -> f64 {
        match self {
            JobAudio::Synthesized { infer_ms, .. } | JobAudio::Spooled { infer_ms, .. } => *infer_ms,
        }
    }
}

/// What the batch row records about inference.
pub struct BatchMeta {
    pub batch_id: Uuid,
    pub flush_reason: &'static str,
    pub started_at: DateTime<Utc>,
    pub queue_ms: f64,
    /// Device time billed by this batch: its own inference, plus the shares its spooled jobs
    /// carried from the batches that synthesized them.
    pub infer_ms: f64,
    pub claim_ms: f64,
    pub tokens: usize,
    pub padded_tokens: usize,
    pub padding_waste: f64,
    pub predicted_peak: Option<f64>,
    pub measured_peak: Option<u64>,
    pub gpu: Option<GpuStats>,
    /// Where the model's time went, per stage (models with stages).
    pub stages: Vec<StageTime>,
}

/// What the inference stage needs.
pub struct Infer {
    pub db: Db,
    pub model: ModelHandle,
    pub worker_id: String,
    pub lease: ClaimLease,
    /// How long a job claimed by another delivery is parked before it is claimed again.
    pub recheck: Duration,
    pub sampler: Option<Arc<GpuSampler>>,
    pub clock: Arc<WorkerClock>,
    pub counters: Arc<Counters>,
    pub settler: Arc<Settler>,
    pub stop: CancellationToken,
    /// Text models: told when a batch is done with (`gate`'s module doc).
    pub gate: Option<Arc<InferenceGate>>,
    /// Finished audio of jobs given back, looked up before synthesis.
    pub spool: Arc<Spool>,
}

/// What the model made of a batch's jobs not found in the spool.
struct Synthesized {
    done: Vec<(Received, JobAudio)>,
    infer_ms: f64,
    tokens: usize,
    padded_tokens: usize,
    padding_waste: f64,
    peak: Option<u64>,
    gpu: Option<GpuStats>,
    stages: Vec<StageTime>,
}

impl Infer {
    /// Runs until the intake closes its sender.
    pub async fn run(
        self,
        mut rx: mpsc::Receiver<Assembled>,
        post: mpsc::Sender<InferredBatch>,
        outcomes: mpsc::UnboundedSender<BatchOutcome>,
        returns: mpsc::UnboundedSender<Received>,
    ) {
        // The worker starts while the model loads (`ModelHandle::start`): no batch is claimed
        // before it is ready; a failed load stops the worker, and every batch goes back unstarted,
        // as it does when the worker is stopped during the load (no waiting for it).
        let loaded = tokio::select! {
            ready = self.model.ready() => match ready {
                Ok(()) => true,
                Err(e) => {
                    self.settler.retry.fatal.raise("the model", &e);
                    false
                }
            },
            _ = self.stop.cancelled() => false,
        };
        self.gate_finished();
        while let Some(Assembled { flush, predicted_peak }) = rx.recv().await {
            let batch_id = Uuid::new_v4();
            let reason = flush.reason.as_str();
            let oldest = flush.items.iter().map(|p| p.arrived).min().unwrap_or_else(Instant::now);
            let items: Vec<Received> = flush.items.into_iter().map(|p| p.item).collect();
            if self.stop.is_cancelled() || !loaded {
                // Not started: back to the queue.
                self.settler.outbox.give_back(items.into_iter().map(|r| r.delivery).collect()).await;
                self.gate_finished();
                continue;
            }
            let span = info_span!("batch", %batch_id, size = items.len(), reason);
            let batch = self.run_batch(batch_id, reason, oldest, items, predicted_peak, &outcomes, &returns).instrument(span.clone()).await;
            // The GPU is free: the intake may form the next text batch while this one commits.
            self.gate_finished();
            if let Some(batch) = batch {
                if post.send(batch).await.is_err() {
                    error!(parent: &span, "commit stage stopped; the batch's messages go back to the queue");
                }
            }
        }
    }

    fn gate_finished(&self) {
        if let Some(g) = &self.gate {
            g.finished();
        }
    }

    /// Claim + inference for one batch. `None` when nothing is left to commit.
    #[allow(clippy::too_many_arguments)]
    async fn run_batch(
        &self,
        batch_id: Uuid,
        reason: &'static str,
        oldest: Instant,
        items: Vec<Received>,
        predicted_peak: Option<f64>,
        outcomes: &mpsc::UnboundedSender<BatchOutcome>,
        returns: &mpsc::UnboundedSender<Received>,
    ) -> Option<InferredBatch> {
        let queue_ms = oldest.elapsed().as_secs_f64() * 1000.0;
        let (unique, duplicates) = split_duplicates(items);

        let claim_started = Instant::now();
        let to_run = self.claim(unique, returns).await?;
        let claim_ms = claim_started.elapsed().as_secs_f64() * 1000.0;
        // Duplicates whose first copy was settled or parked: acked (the first copy decides).
        let running: Vec<Uuid> = to_run.iter().map(|r| r.job.job_id).collect();
        let (duplicates, settled): (Vec<_>, Vec<_>) = duplicates.into_iter().partition(|d| running.contains(&d.job.job_id));
        for d in settled {
            d.delivery.ack().await;
        }
        if to_run.is_empty() {
            return None;
        }

        // Jobs whose audio an earlier claim made and the spool kept skip the model.
        let started_at = Utc::now();
        let (spooled, to_synthesize) = self.from_spool(to_run).await;
        let made = self.synthesize(batch_id, to_synthesize, outcomes).await;
        let carried_ms: f64 = spooled.iter().map(|(_, a)| a.infer_ms()).sum();
        let mut done = made.done;
        done.extend(spooled);
        if done.is_empty() {
            return None;
        }
        let done_ids: Vec<Uuid> = done.iter().map(|(r, _)| r.job.job_id).collect();
        let (duplicates, orphans): (Vec<_>, Vec<_>) = duplicates.into_iter().partition(|d| done_ids.contains(&d.job.job_id));
        for o in orphans {
            o.delivery.ack().await; // its first copy failed and was dead-lettered with the reason
        }
        let meta = BatchMeta {
            batch_id,
            flush_reason: reason,
            started_at,
            queue_ms,
            infer_ms: made.infer_ms + carried_ms,
            claim_ms,
            tokens: made.tokens,
            padded_tokens: made.padded_tokens,
            padding_waste: made.padding_waste,
            predicted_peak,
            measured_peak: made.peak,
            gpu: made.gpu,
            stages: made.stages,
        };
        Some(InferredBatch { meta, done, duplicates })
    }

    /// Splits claimed jobs into those the spool has finished audio for (with it) and those to
    /// synthesize.
    async fn from_spool(&self, jobs: Vec<Received>) -> (Vec<(Received, JobAudio)>, Vec<Received>) {
        if !self.spool.enabled() {
            return (Vec::new(), jobs);
        }
        let wanted = jobs.iter().map(|r| (r.job.job_id, self.spool.digest(&r.job))).collect();
        let found = self.spool.take(wanted).await;
        let (mut spooled, mut rest) = (Vec::new(), Vec::new());
        for (r, entry) in jobs.into_iter().zip(found) {
            match entry {
                Some(e) => spooled.push((r, JobAudio::Spooled { audio: e.audio, infer_ms: e.infer_ms })),
                None => rest.push(r),
            }
        }
        if !spooled.is_empty() {
            info!(jobs = spooled.len(), "finished audio taken from the spool; not synthesized again");
            self.counters.add_from_spool(spooled.len() as u64);
        }
        (spooled, rest)
    }

    /// Runs `jobs` on the model (split on failure); settles those it fails or cannot start.
    async fn synthesize(&self, batch_id: Uuid, jobs: Vec<Received>, outcomes: &mpsc::UnboundedSender<BatchOutcome>) -> Synthesized {
        let (tokens, padded_tokens, padding_waste) = padding(jobs.iter().map(|r| r.length));
        let mut made = Synthesized { done: Vec::new(), infer_ms: 0.0, tokens, padded_tokens, padding_waste, peak: None, gpu: None, stages: Vec::new() };
        if jobs.is_empty() {
            return made;
        }
        if let Some(s) = &self.sampler {
            s.begin();
        }
        let infer_started = Instant::now();
        let run = synthesize_splitting(&self.model, jobs, |r: &Received| SynthItem { tokens: r.tokens.clone(), voice: r.voice, text: r.text.clone(), speed: r.job.speed }).await;
        let infer_elapsed = infer_started.elapsed();
        made.gpu = match &self.sampler {
            Some(s) => Some(s.end().await),
            None => None,
        };
        self.clock.add_busy(infer_elapsed);
        made.infer_ms = infer_elapsed.as_secs_f64() * 1000.0;
        let ooms = run.events.iter().filter(|e| matches!(e, SplitEvent::OutOfMemory { .. })).count() as u64;
        crate::metrics::oom_splits(ooms);
        let oom = ooms > 0;
        let _ = outcomes.send(if oom { BatchOutcome::OutOfMemory } else { BatchOutcome::Clean });
        self.record_events(batch_id, &run.events).await;
        let given_back_ids: Vec<Uuid> = run.given_back.iter().map(|r| r.job.job_id).collect();
        self.settler.give_back_claimed(&given_back_ids, run.given_back.into_iter().map(|r| r.delivery).collect()).await;
        if let Some(e) = &run.device_fault {
            // Not the jobs' fault: they went back to the queue; a fresh process gets a fresh CUDA
            // context (its supervisor restarts it; the delivery limit still bounds a job that
            // brings the GPU down each time).
            error!(given_back = given_back_ids.len(), error = %error_chain(e), "the GPU failed; giving the batch back and stopping the worker");
            self.settler.retry.fatal.raise("the GPU", e);
        }
        for (r, reason) in run.failed {
            self.settler.fail(r.job.job_id, &reason, r.delivery).await;
        }
        self.counters.add_synthesized(run.done.len() as u64);
        if !run.done.is_empty() {
            info!(jobs = run.done.len(), infer_ms = made.infer_ms as u64, kernels = crate::model::kernels(&run.stages).unwrap_or("-"), "inferred");
        }
        // Each job's share of the device time, by its length: carried with it if its batch is
        // given back and its audio spooled, so whichever batch commits it bills it.
        let length: f64 = run.done.iter().map(|(r, _)| r.length as f64).sum();
        let n = run.done.len() as f64;
        let infer_ms = made.infer_ms;
        made.done = run
            .done
            .into_iter()
            .map(|(r, waveform)| {
                let share = if length > 0.0 { r.length as f64 / length } else { 1.0 / n };
                (r, JobAudio::Synthesized { waveform, infer_ms: infer_ms * share })
            })
            .collect();
        made.peak = run.peak;
        made.stages = run.stages;
        made
    }

    /// Claims the jobs; returns those to synthesize. The others are settled or parked here.
    /// `None` when the claim could not be made (the messages were given back).
    async fn claim(&self, unique: Vec<Received>, returns: &mpsc::UnboundedSender<Received>) -> Option<Vec<Received>> {
        let jobs: Vec<crate::job::Job> = unique.iter().map(|r| r.job.clone()).collect();
        let claimed = self.settler.retry.run("claim jobs", || self.db.claim(&jobs, &self.worker_id, &self.lease)).await;
        let decisions = match claimed {
            Ok(d) => d,
            Err(_) => {
                self.settler.outbox.give_back(unique.into_iter().map(|r| r.delivery).collect()).await;
                return None;
            }
        };
        let mut to_run = Vec::new();
        for (r, decision) in unique.into_iter().zip(decisions) {
            match decision {
                Claim::Proceed { claim } => to_run.push(Received { claim, ..r }),
                Claim::AlreadyDone => {
                    info!(job_id = %r.job.job_id, "already done; acking without synthesis");
                    self.counters.add_already_done(1);
                    r.delivery.ack().await;
                }
                Claim::Cancelled => {
                    info!(job_id = %r.job.job_id, campaign = %r.job.campaign, "campaign cancelled; acking without synthesis");
                    self.counters.add_cancelled(1);
                    r.delivery.ack().await;
                }
                Claim::Conflict(kind) => {
                    let rejection = crate::job::Rejection::of(&r.job, kind);
                    self.settler.reject(rejection, r.delivery).await;
                }
                Claim::Busy { worker_id } => {
                    info!(job_id = %r.job.job_id, claimed_by = %worker_id, recheck_ms = self.recheck.as_millis() as u64, "being synthesized by another delivery; parked");
                    self.park(r, returns.clone());
                }
            }
        }
        Some(to_run)
    }

    /// Holds a job claimed elsewhere and returns it to the intake after `recheck` (or gives it
    /// back at once when the worker stops).
    fn park(&self, r: Received, returns: mpsc::UnboundedSender<Received>) {
        let (stop, recheck, outbox) = (self.stop.clone(), self.recheck, self.settler.outbox.clone());
        tokio::spawn(async move {
            let r = tokio::select! {
                _ = tokio::time::sleep(recheck) => match returns.send(r) {
                    Ok(()) => return,
                    Err(mpsc::error::SendError(r)) => r,
                },
                _ = stop.cancelled() => r,
            };
            outbox.give_back(vec![r.delivery]).await;
        });
    }

    /// Records a batch's OOM/split/failure events (best effort: they are also in the logs).
    async fn record_events(&self, batch_id: Uuid, events: &[SplitEvent]) {
        let rows: Vec<BatchEvent> = events.iter().map(BatchEvent::from).collect();
        if let Err(e) = self.db.record_batch_events(batch_id, &self.worker_id, &rows).await {
            warn!(error = %e, "batch events not recorded");
        }
    }
}

/// First copies, and further deliveries of the same job id (they ride along with the first).
fn split_duplicates(items: Vec<Received>) -> (Vec<Received>, Vec<Received>) {
    let mut first: HashSet<Uuid> = HashSet::new();
    let mut unique = Vec::with_capacity(items.len());
    let mut duplicates = Vec::new();
    for r in items {
        if !first.insert(r.job.job_id) {
            duplicates.push(r);
        } else {
            unique.push(r);
        }
    }
    (unique, duplicates)
}

/// The outcome of running items on the model with splitting.
#[derive(Debug)]
pub struct ModelRun<T> {
    pub done: Vec<(T, Waveform)>,
    pub failed: Vec<(T, String)>,
    /// Not attempted: the inference thread is gone, or the GPU failed (`device_fault`).
    pub given_back: Vec<T>,
    pub events: Vec<SplitEvent>,
    /// Highest peak memory over the forward passes.
    pub peak: Option<u64>,
    /// Σ tokens and Σ (size × longest) over every forward pass, failed ones included.
    pub forward_tokens: u64,
    pub forward_padded_tokens: u64,
    /// Where the model's time went, per stage, over every pass (models with stages).
    pub stages: Vec<StageTime>,
    /// The GPU failed (`ModelError::is_device_fault`): the rest was given back, and the worker
    /// should stop.
    pub device_fault: Option<ModelError>,
}

/// Runs `items` on `model`; on an out-of-memory error (the model thread releases cached memory)
/// or any inference error, splits the batch in two and retries each half, down to single items
/// (see `batch::split`). An item the model fails alone (a text job whose segment yields no speech)
/// fails with its reason without touching the others. A GPU failure (`ModelError::is_device_fault`)
/// is no item's: what was not done goes back (`given_back`, `device_fault`), nothing is split or
/// failed for it. `synth_item` says what each item gives the model.
pub async fn synthesize_splitting<T>(model: &ModelHandle, items: Vec<T>, synth_item: impl Fn(&T) -> SynthItem) -> ModelRun<T> {
    let peak = Arc::new(AtomicU64::new(0));
    let stages = Arc::new(tokio::sync::Mutex::new(Vec::<StageTime>::new()));
    let (mut forward_tokens, mut forward_padded_tokens) = (0u64, 0u64);
    let device_fault = Arc::new(std::sync::OnceLock::<ModelError>::new());
    let run = run_splitting(items, |t: &T| synth_item(t).len(), |part: &[T]| {
        let batch: Vec<SynthItem> = part.iter().map(&synth_item).collect();
        let longest = batch.iter().map(SynthItem::len).max().unwrap_or(0) as u64;
        forward_tokens += batch.iter().map(|i| i.len() as u64).sum::<u64>();
        forward_padded_tokens += longest * batch.len() as u64;
        let (model, peak, stages, device_fault) = (model.clone(), peak.clone(), stages.clone(), device_fault.clone());
        async move {
            match model.synthesize(batch).await {
                Ok(out) => {
                    if let Some(p) = out.peak_bytes {
                        peak.fetch_max(p, Ordering::SeqCst);
                    }
                    add_stages(&mut *stages.lock().await, &out.stages);
                    Ok(out.audio)
                }
                Err(e @ (ModelError::ThreadGone | ModelError::NotLoaded(_))) => Err(AttemptError::Fatal(error_chain(&e))),
                Err(e) if e.is_oom() => Err(AttemptError::OutOfMemory(error_chain(&e))),
                Err(e) if e.is_device_fault() => {
                    let reason = error_chain(&e);
                    let _ = device_fault.set(e);
                    Err(AttemptError::Fatal(reason))
                }
                Err(e) => Err(AttemptError::Failed(error_chain(&e))),
            }
        }
    })
    .await;
    let mut events = run.events;
    let mut failed = run.failed;
    let mut done = Vec::with_capacity(run.done.len());
    for (item, audio) in run.done {
        match audio {
            Ok(audio) => done.push((item, audio)),
            Err(reason) => {
                events.push(SplitEvent::FailedAlone { reason: reason.clone() });
                failed.push((item, reason));
            }
        }
    }
    for e in &events {
        match e {
            SplitEvent::OutOfMemory { size, max_tokens } => warn!(size, max_tokens, "out of memory; splitting the batch"),
            SplitEvent::Split { size, into } => debug!(size, ?into, "split"),
            SplitEvent::FailedAlone { reason } => warn!(%reason, "a job failed alone"),
        }
    }
    let peak = peak.load(Ordering::SeqCst);
    let stages = std::mem::take(&mut *stages.lock().await);
    let device_fault = Arc::into_inner(device_fault).and_then(std::sync::OnceLock::into_inner);
    ModelRun { done, failed, given_back: run.given_back, events, peak: (peak > 0).then_some(peak), forward_tokens, forward_padded_tokens, stages, device_fault }
}

/// An error and its sources, one line.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(cause) = src {
        s.push_str(": ");
        s.push_str(&cause.to_string());
        src = cause.source();
    }
    s
}

impl From<&SplitEvent> for BatchEvent {
    fn from(e: &SplitEvent) -> BatchEvent {
        match e {
            SplitEvent::OutOfMemory { size, max_tokens } => {
                BatchEvent { kind: "oom", batch_size: *size as i32, max_tokens: Some(*max_tokens as i32), detail: None }
            }
            SplitEvent::Split { size, into } => {
                BatchEvent { kind: "split", batch_size: *size as i32, max_tokens: None, detail: Some(format!("{} + {}", into.0, into.1)) }
            }
            SplitEvent::FailedAlone { reason } => {
                BatchEvent { kind: "failed_alone", batch_size: 1, max_tokens: None, detail: Some(reason.clone()) }
            }
        }
    }
}
