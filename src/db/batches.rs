//! Finished batches: the batch row and its jobs `done` in one transaction, and the batch's
//! out-of-memory, split and failure events.
//!
//! Neighbours: `worker::commit` calls [`Db::complete_batch`] after the upload and acks only after
//! it; `worker::infer` records events; `report` reads the rows.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{q, Db, DbError};

/// One finished job of a batch.
#[derive(Debug, Clone)]
pub struct JobResult {
    pub job_id: Uuid,
    /// The claim this synthesis ran under (`Claim::Proceed`): the commit requires it to be the
    /// job's current claim.
    pub claim: i32,
    pub s3_key: String,
    pub audio_seconds: f64,
    pub sha256: String,
    /// The stored object's size.
    pub bytes: i64,
    /// Segments of a CosyVoice2 text job.
    pub segments: Option<i32>,
}

/// One stage of a batch (models with stages): device time, segments, speech tokens, and its
/// share of the batch's inference time, energy and cost.
#[derive(Debug, Clone)]
pub struct StageRecord {
    pub stage: &'static str,
    pub seconds: f64,
    pub items: i32,
    pub tokens: i64,
    pub share: f64,
    pub gpu_energy_j: Option<f64>,
    pub cost_usd: Option<f64>,
}

/// The row of one finished batch.
#[derive(Debug, Clone)]
pub struct BatchRecord {
    pub batch_id: Uuid,
    pub worker_id: String,
    pub model: String,
    pub device: String,
    pub precision: String,
    /// `compiled`, `eager` or `mixed` (CosyVoice2's flow steps), `None` otherwise.
    pub kernels: Option<String>,
    pub batch_size: i32,
    pub tokens: i64,
    pub padded_tokens: i64,
    pub flush_reason: String,
    pub queue_ms: f64,
    pub infer_ms: f64,
    pub encode_ms: f64,
    pub upload_ms: f64,
    pub db_ms: f64,
    pub audio_seconds: f64,
    pub started_at: DateTime<Utc>,
    pub finished_at: DateTime<Utc>,
    pub padding_waste: Option<f32>,
    pub predicted_peak_bytes: Option<i64>,
    pub measured_peak_bytes: Option<i64>,
    /// NVML figures of the batch (None on CPU or without NVML).
    pub gpu: Option<crate::gpu::sampler::GpuStats>,
    pub process_mem_max_bytes: Option<i64>,
    pub hourly_usd: Option<f64>,
    pub cost_usd: Option<f64>,
    pub energy_usd: Option<f64>,
    /// Per stage, for models with stages (empty otherwise).
    pub stages: Vec<StageRecord>,
}

/// One out-of-memory error, split or lone failure of a batch.
#[derive(Debug, Clone)]
pub struct BatchEvent {
    pub kind: &'static str,
    pub batch_size: i32,
    pub max_tokens: Option<i32>,
    pub detail: Option<String>,
}

/// What [`Db::complete_batch`] did with a batch's jobs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BatchCommit {
    /// Jobs whose claim another delivery took over (this worker was paused past its lease): not
    /// marked done by this batch; their objects are this claim's alone and no row points to them.
    pub superseded: Vec<Uuid>,
}

impl Db {
    /// Commits a finished batch: its row and every job `done`, in one transaction. A job is marked
    /// done only under the claim its audio was made for (`jobs.attempts = claim`, not yet done):
    /// the fence that keeps a worker frozen past its lease from committing over the claim that
    /// replaced it. Running the same commit again (its first answer lost) changes nothing and
    /// reports the same jobs committed. A batch some of whose jobs were superseded keeps its whole
    /// cost, spread over the jobs it did commit (its audio seconds count those; `superseded` the
    /// others; `batch_size` stays what it synthesized).
    pub async fn complete_batch(&self, batch: &BatchRecord, results: &[JobResult]) -> Result<BatchCommit, DbError> {
        let mut tx = self.pool.begin().await.map_err(q("begin"))?;
        sqlx::query(
            "INSERT INTO batches (batch_id, worker_id, model, device, precision, batch_size, tokens, padded_tokens,
               flush_reason, queue_ms, infer_ms, encode_ms, upload_ms, db_ms, audio_seconds, started_at, finished_at, padding_waste,
               predicted_peak_bytes, measured_peak_bytes, gpu_name, gpu_util_mean, gpu_util_max, gpu_mem_used_max_bytes,
               gpu_power_mean_w, gpu_energy_j, gpu_temp_max_c, gpu_sm_clock_mean_mhz, process_mem_max_bytes,
               hourly_usd, cost_usd, energy_usd, kernels)
             VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13,$14,$15,$16,$17,$18,$19,$20,
                     $21,$22,$23,$24,$25,$26,$27,$28,$29,$30,$31,$32,$33)
             ON CONFLICT (batch_id) DO NOTHING",
        )
        .bind(batch.batch_id)
        .bind(&batch.worker_id)
        .bind(&batch.model)
        .bind(&batch.device)
        .bind(&batch.precision)
        .bind(batch.batch_size)
        .bind(batch.tokens)
        .bind(batch.padded_tokens)
        .bind(&batch.flush_reason)
        .bind(batch.queue_ms)
        .bind(batch.infer_ms)
        .bind(batch.encode_ms)
        .bind(batch.upload_ms)
        .bind(batch.db_ms)
        .bind(batch.audio_seconds)
        .bind(batch.started_at)
        .bind(batch.finished_at)
        .bind(batch.padding_waste)
        .bind(batch.predicted_peak_bytes)
        .bind(batch.measured_peak_bytes)
        .bind(batch.gpu.as_ref().map(|g| g.name.clone()))
        .bind(batch.gpu.as_ref().and_then(|g| g.util_mean))
        .bind(batch.gpu.as_ref().and_then(|g| g.util_max))
        .bind(batch.gpu.as_ref().and_then(|g| g.mem_used_max_bytes).map(|b| b as i64))
        .bind(batch.gpu.as_ref().and_then(|g| g.power_mean_w))
        .bind(batch.gpu.as_ref().and_then(|g| g.energy_j))
        .bind(batch.gpu.as_ref().and_then(|g| g.temp_max_c))
        .bind(batch.gpu.as_ref().and_then(|g| g.sm_clock_mean_mhz))
        .bind(batch.process_mem_max_bytes)
        .bind(batch.hourly_usd)
        .bind(batch.cost_usd)
        .bind(batch.energy_usd)
        .bind(&batch.kernels)
        .execute(&mut *tx)
        .await
        .map_err(q("insert batch"))?;
        let ids: Vec<Uuid> = results.iter().map(|r| r.job_id).collect();
        let keys: Vec<&str> = results.iter().map(|r| r.s3_key.as_str()).collect();
        let secs: Vec<f64> = results.iter().map(|r| r.audio_seconds).collect();
        let shas: Vec<&str> = results.iter().map(|r| r.sha256.as_str()).collect();
        let segments: Vec<Option<i32>> = results.iter().map(|r| r.segments).collect();
        let claims: Vec<i32> = results.iter().map(|r| r.claim).collect();
        let bytes: Vec<i64> = results.iter().map(|r| r.bytes).collect();
        // Done under this claim, or already done by it (this commit's earlier run): committed.
        let committed: std::collections::HashSet<Uuid> = sqlx::query_scalar(
            "WITH t AS (SELECT * FROM UNNEST($1::uuid[], $2::text[], $3::float8[], $4::text[], $5::int[], $7::int[], $8::int8[])
                          AS t(job_id, s3_key, secs, sha, segments, claim, bytes)),
                  marked AS (
               UPDATE jobs SET status = 'done', s3_key = t.s3_key, audio_seconds = t.secs, audio_sha256 = t.sha,
                 audio_bytes = t.bytes, segments = t.segments, batch_id = $6, finished_at = now(), error = NULL,
                 event_published_at = NULL, event_claimed_at = NULL
               FROM t WHERE jobs.job_id = t.job_id AND jobs.status <> 'done' AND jobs.attempts = t.claim
               RETURNING jobs.job_id)
             SELECT job_id FROM marked
             UNION ALL
             SELECT j.job_id FROM jobs j JOIN t ON t.job_id = j.job_id
             WHERE j.status = 'done' AND j.batch_id = $6 AND j.attempts = t.claim",
        )
        .bind(&ids)
        .bind(&keys)
        .bind(&secs)
        .bind(&shas)
        .bind(&segments)
        .bind(batch.batch_id)
        .bind(&claims)
        .bind(&bytes)
        .fetch_all(&mut *tx)
        .await
        .map_err(q("mark done"))?
        .into_iter()
        .collect();
        let superseded: Vec<Uuid> = ids.iter().copied().filter(|id| !committed.contains(id)).collect();
        if !superseded.is_empty() {
            sqlx::query(
                "UPDATE batches SET superseded = $2, audio_seconds = (SELECT coalesce(sum(audio_seconds), 0) FROM jobs WHERE batch_id = $1)
                 WHERE batch_id = $1",
            )
            .bind(batch.batch_id)
            .bind(superseded.len() as i32)
            .execute(&mut *tx)
            .await
            .map_err(q("count the batch's committed jobs"))?;
        }
        if !batch.stages.is_empty() {
            let st = &batch.stages;
            sqlx::query(
                "INSERT INTO batch_stages (batch_id, stage, seconds, items, tokens, share, gpu_energy_j, cost_usd)
                 SELECT $1, t.stage, t.seconds, t.items, t.tokens, t.share, t.energy, t.cost
                 FROM UNNEST($2::text[], $3::float8[], $4::int[], $5::int8[], $6::float8[], $7::float8[], $8::float8[])
                   AS t(stage, seconds, items, tokens, share, energy, cost)
                 ON CONFLICT (batch_id, stage) DO NOTHING",
            )
            .bind(batch.batch_id)
            .bind(st.iter().map(|s| s.stage).collect::<Vec<_>>())
            .bind(st.iter().map(|s| s.seconds).collect::<Vec<_>>())
            .bind(st.iter().map(|s| s.items).collect::<Vec<_>>())
            .bind(st.iter().map(|s| s.tokens).collect::<Vec<_>>())
            .bind(st.iter().map(|s| s.share).collect::<Vec<_>>())
            .bind(st.iter().map(|s| s.gpu_energy_j).collect::<Vec<_>>())
            .bind(st.iter().map(|s| s.cost_usd).collect::<Vec<_>>())
            .execute(&mut *tx)
            .await
            .map_err(q("insert batch stages"))?;
        }
        tx.commit().await.map_err(q("commit batch"))?;
        Ok(BatchCommit { superseded })
    }

    /// Of `claims` (job, claim number), those that are still their job's current claim, not done:
    /// what a batch checks before uploading, so a worker that was paused past its lease does not
    /// upload audio its commit would refuse.
    pub async fn current_claims(&self, claims: &[(Uuid, i32)]) -> Result<std::collections::HashSet<Uuid>, DbError> {
        let ids: Vec<Uuid> = claims.iter().map(|c| c.0).collect();
        let numbers: Vec<i32> = claims.iter().map(|c| c.1).collect();
        let rows: Vec<Uuid> = sqlx::query_scalar(
            "SELECT j.job_id FROM jobs j JOIN UNNEST($1::uuid[], $2::int[]) AS t(job_id, claim) ON t.job_id = j.job_id
             WHERE j.status <> 'done' AND j.attempts = t.claim",
        )
        .bind(&ids)
        .bind(&numbers)
        .fetch_all(&self.pool)
        .await
        .map_err(q("check claims"))?;
        Ok(rows.into_iter().collect())
    }

    /// Records a batch's out-of-memory errors, splits and lone failures.
    pub async fn record_batch_events(&self, batch_id: Uuid, worker_id: &str, events: &[BatchEvent]) -> Result<(), DbError> {
        if events.is_empty() {
            return Ok(());
        }
        let kinds: Vec<&str> = events.iter().map(|e| e.kind).collect();
        let sizes: Vec<i32> = events.iter().map(|e| e.batch_size).collect();
        let lens: Vec<Option<i32>> = events.iter().map(|e| e.max_tokens).collect();
        let details: Vec<Option<String>> = events.iter().map(|e| e.detail.clone()).collect();
        sqlx::query(
            "INSERT INTO batch_events (batch_id, worker_id, kind, batch_size, max_tokens, detail)
             SELECT $1, $2, t.kind, t.size, t.len, t.detail
             FROM UNNEST($3::text[], $4::int[], $5::int[], $6::text[]) AS t(kind, size, len, detail)",
        )
        .bind(batch_id)
        .bind(worker_id)
        .bind(&kinds)
        .bind(&sizes)
        .bind(&lens)
        .bind(&details)
        .execute(&self.pool)
        .await
        .map_err(q("record batch events"))?;
        Ok(())
    }

}
