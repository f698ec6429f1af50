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
    pub s3_key: String,
    pub audio_seconds: f64,
    pub sha256: String,
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

impl Db {
    /// Commits a finished batch: its row and every job `done`, in one transaction.
    pub async fn complete_batch(&self, batch: &BatchRecord, results: &[JobResult]) -> Result<(), DbError> {
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
        sqlx::query(
            "UPDATE jobs SET status = 'done', s3_key = t.s3_key, audio_seconds = t.secs, audio_sha256 = t.sha,
               segments = t.segments, batch_id = $6, finished_at = now(), error = NULL,
               event_published_at = NULL, event_claimed_at = NULL
             FROM UNNEST($1::uuid[], $2::text[], $3::float8[], $4::text[], $5::int[]) AS t(job_id, s3_key, secs, sha, segments)
             WHERE jobs.job_id = t.job_id AND jobs.status <> 'done'",
        )
        .bind(&ids)
        .bind(&keys)
        .bind(&secs)
        .bind(&shas)
        .bind(&segments)
        .bind(batch.batch_id)
        .execute(&mut *tx)
        .await
        .map_err(q("mark done"))?;
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
        Ok(())
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
