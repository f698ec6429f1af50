//! Commit: encode each inferred batch, upload its audio, record it in Postgres, then ack.
//!
//! The order is the invariant: a job's message is acked only after its object is uploaded and
//! its `done` row and the batch row are committed in one transaction. Any step that keeps
//! failing past the hold limit gives the batch's messages back (and releases their claims);
//! nothing is dropped. WAV encoding runs on blocking threads, spread over cores.
//!
//! Each job's audio goes under its claim's own key and is committed only under that claim (the
//! fence, `Db::complete_batch`): a worker paused past its lease (SIGSTOP, a slow upload) whose
//! jobs another delivery claimed meanwhile uploads nothing over the new claim's audio and commits
//! nothing; it deletes what it uploaded for those jobs and acks them (their own claim settles
//! them). So the object a `done` row names is the one that row describes. A job committed under a
//! later claim has earlier claims' leftovers deleted (best effort; `voxbatch audit` lists any that
//! remain).
//!
//! One path commits every job, whether the model made its audio in this batch (encoded here) or
//! an earlier claim did and the spool kept it encoded ([`JobAudio`]). A batch given back after
//! encoding keeps each job's encoded audio in the spool first, so the job's next claim need not
//! synthesize it again; a committed job's entry is deleted.
//!
//! Neighbours: `infer` sends [`InferredBatch`]es; `audio` encodes; `storage` uploads; `db`
//! records; `spool` keeps audio across give-backs; `delivery` acks or gives back.

use std::sync::Arc;
use std::time::Instant;

use chrono::Utc;
use futures::{StreamExt, TryStreamExt};
use tokio::sync::mpsc;
use tracing::{error, info, info_span, warn, Instrument};
use uuid::Uuid;

use super::delivery::Settler;
use super::infer::{BatchMeta, InferredBatch, JobAudio};
use super::intake::Received;
use super::spool::{Spool, SpoolEntry};
use super::Counters;
use crate::audio::{encode_batch, EncodedAudio, OutputFormat, Waveform};
use crate::config::OutputConfig;
use crate::cost::Prices;
use crate::db::{BatchRecord, Db, JobResult, StageRecord};
use crate::model::{Device, Manifest, Precision, StageTime};
use crate::storage::{AudioMeta, Storage};

/// What the commit stage needs.
pub struct Commit {
    pub db: Db,
    pub storage: Storage,
    pub manifest: Arc<Manifest>,
    pub device: Device,
    pub precision: Precision,
    pub worker_id: String,
    pub prices: Prices,
    pub hourly_usd: f64,
    pub upload_concurrency: usize,
    pub counters: Arc<Counters>,
    pub settler: Arc<Settler>,
    /// Wakes the completion-event sweep (`events`) after each commit.
    pub events: Arc<tokio::sync::Notify>,
    /// `[output]`: a job's audio format when it does not name one, and the lossy bitrates.
    pub output: OutputConfig,
    /// Where a batch given back keeps its encoded audio.
    pub spool: Arc<Spool>,
}

impl Commit {
    /// Runs until the inference stage closes its sender.
    pub async fn run(self, mut rx: mpsc::Receiver<InferredBatch>) {
        let this = Arc::new(self);
        while let Some(batch) = rx.recv().await {
            let span = info_span!("batch", batch_id = %batch.meta.batch_id, size = batch.done.len());
            this.commit(batch).instrument(span).await;
        }
    }

    async fn commit(self: &Arc<Self>, batch: InferredBatch) {
        let InferredBatch { meta, done, duplicates } = batch;
        let (received, audio): (Vec<Received>, Vec<JobAudio>) = done.into_iter().unzip();
        let shares: Vec<f64> = audio.iter().map(JobAudio::infer_ms).collect();
        let spooled: Vec<bool> = audio.iter().map(|a| matches!(a, JobAudio::Spooled { .. })).collect();
        let deliveries = Deliveries { received, duplicates };

        let encode_started = Instant::now();
        let Some(encoded) = self.encode(audio, &deliveries.received).await else {
            return self.give_back(deliveries).await;
        };
        let encode_ms = encode_started.elapsed().as_secs_f64() * 1000.0;
        // From here on a give-back keeps the batch's encoded audio in the spool first.
        let kept = Kept { encoded: &encoded, shares: &shares };

        let upload_started = Instant::now();
        let keys: Vec<String> = deliveries
            .received
            .iter()
            .zip(&encoded)
            .map(|(r, enc)| self.storage.key(&r.job.campaign, r.job.job_id, enc.format, r.claim))
            .collect();
        // Claims another delivery took over while this batch ran are not uploaded (their commit
        // would be refused); the commit below is the fence, this only saves the upload.
        let claims: Vec<(Uuid, i32)> = deliveries.received.iter().map(|r| (r.job.job_id, r.claim)).collect();
        let current = match self.settler.retry.run("check claims", || self.db.current_claims(&claims)).await {
            Ok(c) => c,
            Err(_) => return self.spool_and_give_back(deliveries, kept).await,
        };
        if self.upload(&deliveries.received, &encoded, &keys, &meta, &current).await.is_err() {
            return self.spool_and_give_back(deliveries, kept).await;
        }
        let upload_ms = upload_started.elapsed().as_secs_f64() * 1000.0;

        let results: Vec<JobResult> = deliveries
            .received
            .iter()
            .zip(&encoded)
            .zip(&keys)
            .map(|((r, enc), key)| JobResult {
                job_id: r.job.job_id,
                claim: r.claim,
                s3_key: key.clone(),
                audio_seconds: enc.seconds,
                sha256: enc.sha256.clone(),
                bytes: enc.bytes.len() as i64,
                segments: r.text.as_ref().map(|t| t.segments.len() as i32),
            })
            .collect();
        let audio_seconds: f64 = results.iter().map(|r| r.audio_seconds).sum();
        let mut record = self.record(&meta, results.len(), audio_seconds, encode_ms, upload_ms);
        let db_started = Instant::now();
        let committed = self
            .settler
            .retry
            .run("record batch", || {
                record.finished_at = Utc::now();
                record.db_ms = meta.claim_ms + db_started.elapsed().as_secs_f64() * 1000.0;
                let record = record.clone();
                let results = &results;
                async move { self.db.complete_batch(&record, results).await }
            })
            .await;
        let superseded = match committed {
            Ok(c) => c.superseded,
            Err(_) => return self.spool_and_give_back(deliveries, kept).await,
        };
        // Committed: now, and only now, ack; the batch's events go out after the commit.
        self.events.notify_one();
        let from_spool: Vec<(Uuid, String)> =
            deliveries.received.iter().zip(&spooled).filter(|(_, s)| **s).map(|(r, _)| (r.job.job_id, self.spool.digest(&r.job))).collect();
        self.spool.forget(from_spool).await;
        let (received, duplicates) = (deliveries.received, deliveries.duplicates);
        let n = (received.len() - superseded.len()) as u64;
        for ((r, key), result) in received.iter().zip(&keys).zip(&results) {
            if superseded.contains(&r.job.job_id) {
                warn!(job_id = %r.job.job_id, claim = r.claim, "another delivery took this job's claim over while this worker was paused; its audio is not committed");
                self.delete_quietly(key).await;
            } else if r.claim > 1 {
                self.delete_earlier_claims(&r.job.campaign, r.job.job_id, &result.s3_key).await;
            }
        }
        for r in received.into_iter().chain(duplicates) {
            r.delivery.ack().await;
        }
        let results: Vec<JobResult> = results.into_iter().filter(|r| !superseded.contains(&r.job_id)).collect();
        record.batch_size = results.len() as i32;
        record.audio_seconds = results.iter().map(|r| r.audio_seconds).sum();
        let audio_seconds = record.audio_seconds;
        let segments: u64 = results.iter().filter_map(|r| r.segments).map(|n| n.max(0) as u64).sum();
        self.counters.add_batch(&record, segments);
        info!(
            jobs = n,
            audio_seconds = format!("{audio_seconds:.1}"),
            infer_ms = meta.infer_ms as u64,
            encode_ms = encode_ms as u64,
            upload_ms = upload_ms as u64,
            "batch committed"
        );
    }

    /// Each job's encoded audio, in batch order: the model's waveforms encoded on blocking threads
    /// (spread over cores), spooled audio as it is. `None` when encoding panicked.
    async fn encode(&self, audio: Vec<JobAudio>, received: &[Received]) -> Option<Vec<EncodedAudio>> {
        let mut out: Vec<Option<EncodedAudio>> = Vec::with_capacity(audio.len());
        let (mut to_encode, mut at): (Vec<(Waveform, OutputFormat)>, Vec<usize>) = (Vec::new(), Vec::new());
        for (i, (a, r)) in audio.into_iter().zip(received).enumerate() {
            match a {
                JobAudio::Synthesized { waveform, .. } => {
                    to_encode.push((waveform, r.job.format.unwrap_or(self.output.format)));
                    at.push(i);
                    out.push(None);
                }
                JobAudio::Spooled { audio, .. } => out.push(Some(audio)),
            }
        }
        if !to_encode.is_empty() {
            let sample_rate = self.manifest.sample_rate;
            let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(16);
            let bitrates = self.output.bitrates;
            match tokio::task::spawn_blocking(move || encode_batch(&to_encode, sample_rate, bitrates, threads)).await {
                Ok(encoded) => {
                    for (i, e) in at.into_iter().zip(encoded) {
                        out[i] = Some(e);
                    }
                }
                Err(e) => {
                    error!(error = %e, "encoding panicked; giving the batch back");
                    return None;
                }
            }
        }
        out.into_iter().collect()
    }

    /// Keeps the batch's encoded audio in the spool, then gives its messages back: the jobs'
    /// next claims commit that audio instead of synthesizing it again.
    async fn spool_and_give_back(&self, d: Deliveries, kept: Kept<'_>) {
        let entries: Vec<SpoolEntry> = d
            .received
            .iter()
            .zip(kept.encoded)
            .zip(kept.shares)
            .map(|((r, audio), share)| SpoolEntry { job_id: r.job.job_id, digest: self.spool.digest(&r.job), audio: audio.clone(), infer_ms: *share })
            .collect();
        if self.spool.enabled() {
            info!(jobs = entries.len(), "keeping the batch's finished audio in the spool before giving it back");
        }
        self.spool.keep(entries).await;
        self.give_back(d).await;
    }

    /// Uploads the object of every job whose claim is still `current` (a few at a time), each retried.
    async fn upload(
        self: &Arc<Self>,
        received: &[Received],
        encoded: &[EncodedAudio],
        keys: &[String],
        batch: &BatchMeta,
        current: &std::collections::HashSet<Uuid>,
    ) -> Result<(), ()> {
        let uploads: Vec<(String, Vec<u8>, AudioMeta)> = received
            .iter()
            .zip(encoded)
            .zip(keys)
            .filter(|((r, _), _)| current.contains(&r.job.job_id))
            .map(|((r, enc), key)| {
                let meta = AudioMeta {
                    content_type: enc.format.content_type(),
                    job_id: r.job.job_id,
                    claim: r.claim,
                    batch_id: batch.batch_id,
                    model: self.manifest.name.clone(),
                    voice: r.job.voice.clone(),
                    sha256: enc.sha256.clone(),
                };
                (key.clone(), enc.bytes.clone(), meta)
            })
            .collect();
        futures::stream::iter(uploads.into_iter().map(|(key, bytes, meta)| {
            let this = self.clone();
            async move { this.settler.retry.run("upload audio", || this.storage.put(&key, bytes.clone(), &meta)).await }
        }))
        .buffer_unordered(self.upload_concurrency)
        .try_collect::<Vec<()>>()
        .await
        .map(|_| ())
        .map_err(|_| ())
    }

    /// Deletes one of this worker's own objects that no row will name (best effort: `voxbatch
    /// audit` lists what is left).
    async fn delete_quietly(&self, key: &str) {
        if let Err(e) = self.storage.delete(key).await {
            warn!(key, error = %e, "could not delete audio no row names; `voxbatch audit` lists it");
        }
    }

    /// Deletes a job's objects of claims before the one committed (`keep`): a worker lost or
    /// paused mid-upload left them (best effort).
    async fn delete_earlier_claims(&self, campaign: &str, job_id: Uuid, keep: &str) {
        match self.storage.list(&self.storage.job_prefix(campaign, job_id)).await {
            Ok(keys) => {
                for key in keys.iter().filter(|k| k.as_str() != keep) {
                    self.delete_quietly(key).await;
                }
            }
            Err(e) => warn!(%job_id, error = %e, "could not list earlier claims' audio; `voxbatch audit` lists any left"),
        }
    }

    fn record(&self, meta: &BatchMeta, size: usize, audio_seconds: f64, encode_ms: f64, upload_ms: f64) -> BatchRecord {
        let cost = self.prices.batch_cost(self.hourly_usd, meta.infer_ms, meta.gpu.as_ref().and_then(|g| g.energy_j));
        BatchRecord {
            batch_id: meta.batch_id,
            worker_id: self.worker_id.clone(),
            model: self.manifest.name.clone(),
            device: self.device.to_string(),
            precision: self.precision.to_string(),
            kernels: crate::model::kernels(&meta.stages).map(str::to_string),
            batch_size: size as i32,
            tokens: meta.tokens as i64,
            padded_tokens: meta.padded_tokens as i64,
            flush_reason: meta.flush_reason.to_string(),
            queue_ms: meta.queue_ms,
            infer_ms: meta.infer_ms,
            encode_ms,
            upload_ms,
            db_ms: meta.claim_ms,
            audio_seconds,
            started_at: meta.started_at,
            finished_at: Utc::now(),
            padding_waste: Some(meta.padding_waste as f32),
            predicted_peak_bytes: meta.predicted_peak.map(|p| p as i64),
            measured_peak_bytes: meta.measured_peak.map(|p| p as i64),
            process_mem_max_bytes: match self.device {
                // On CPU the measured peak is the process's resident set.
                Device::Cpu => meta.measured_peak.map(|p| p as i64),
                Device::Cuda(_) => meta.gpu.as_ref().and_then(|g| g.process_mem_max_bytes).map(|b| b as i64),
            },
            hourly_usd: Some(cost.hourly_usd),
            cost_usd: Some(cost.cost_usd),
            energy_usd: cost.energy_usd,
            stages: stage_records(&meta.stages, Some(cost.cost_usd), meta.gpu.as_ref().and_then(|g| g.energy_j)),
            gpu: meta.gpu.clone(),
        }
    }

    async fn give_back(&self, d: Deliveries) {
        let ids: Vec<Uuid> = d.received.iter().map(|r| r.job.job_id).collect();
        let deliveries = d.received.into_iter().chain(d.duplicates).map(|r| r.delivery).collect();
        self.settler.give_back_claimed(&ids, deliveries).await;
    }
}

/// A batch's stages with their shares of its device time, cost and energy (the stages alternate
/// within a batch: NVML cannot tell them apart, so the split is by device time).
fn stage_records(stages: &[StageTime], cost_usd: Option<f64>, energy_j: Option<f64>) -> Vec<StageRecord> {
    let total: f64 = stages.iter().map(|s| s.seconds).sum();
    stages
        .iter()
        .map(|s| {
            let share = if total > 0.0 { s.seconds / total } else { 1.0 / stages.len() as f64 };
            StageRecord {
                stage: s.stage.as_str(),
                seconds: s.seconds,
                items: s.items as i32,
                tokens: s.tokens as i64,
                share,
                gpu_energy_j: energy_j.map(|e| e * share),
                cost_usd: cost_usd.map(|c| c * share),
            }
        })
        .collect()
}

/// A batch's encoded audio and each job's share of the device time that made it, for the spool.
#[derive(Clone, Copy)]
struct Kept<'a> {
    encoded: &'a [EncodedAudio],
    shares: &'a [f64],
}

/// A batch's messages: first copies and duplicates.
struct Deliveries {
    received: Vec<Received>,
    duplicates: Vec<Received>,
}
