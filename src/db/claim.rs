//! Claiming a batch's jobs: one transaction that decides, per job, whether this delivery
//! synthesizes it.
//!
//! Rows are inserted if missing and locked (`FOR UPDATE`, in job-id order so concurrent claims
//! never deadlock), then compared with the delivery: already `done` → ack; other content under
//! the same id → conflict; `running` under a claim that is still live (its worker heartbeats and
//! the claim is younger than the lease) → busy, the delivery waits; otherwise the job is marked
//! `running` for this worker under a new claim number (`attempts` + 1), which fences the claim:
//! its audio key and its commit carry it (`storage::object_key`, `Db::complete_batch`). So two
//! deliveries of one job are never synthesized at once, a claim left by a crashed worker expires,
//! and a worker frozen past its lease cannot commit over the claim that replaced it. A job of a cancelled campaign (`campaign_cancels`) that
//! is not done is marked `cancelled` in the same transaction and acked without synthesis.
//!
//! Neighbours: `worker::infer` calls [`Db::claim`] before inference and `Db::release` when it
//! gives messages back; `Db::complete_batch` ends a claim with `done`.

use std::collections::HashMap;
use std::time::Duration;

use sqlx::Row;
use uuid::Uuid;

use super::{q, speech_tokens_json, Db, DbError};
use crate::config::WorkerConfig;
use crate::job::{Job, Mode, RejectionKind};

/// What the worker should do with a job it has received.
#[derive(Debug, Clone, PartialEq)]
pub enum Claim {
    /// Synthesize it under claim number `claim` (`jobs.attempts` after this claim): the fencing
    /// token its upload key and its commit carry, so a delivery whose claim was taken over while it
    /// was paused can neither overwrite the new claim's audio nor commit over it.
    Proceed { claim: i32 },
    /// Its audio is already committed: ack without recomputation.
    AlreadyDone,
    /// The same job_id was submitted with different content: dead-letter the new message.
    Conflict(RejectionKind),
    /// Another delivery of this job is being synthesized now (by `worker_id`): wait and claim again.
    Busy { worker_id: String },
    /// Its campaign is cancelled: marked `cancelled`; ack without synthesis.
    Cancelled,
}

/// When a `running` claim stops counting as live.
#[derive(Debug, Clone, Copy)]
pub struct ClaimLease {
    /// The claiming worker's heartbeat is older than this: it is gone.
    pub heartbeat_stale: Duration,
    /// The claim is older than this: whatever holds it has given up.
    pub max_age: Duration,
}

impl ClaimLease {
    /// Three missed heartbeats; the longest a worker holds a batch (claim, inference, upload
    /// and record each retried for at most `max_hold`) plus slack.
    pub fn for_worker(w: &WorkerConfig) -> ClaimLease {
        ClaimLease { heartbeat_stale: w.heartbeat * 3, max_age: w.max_hold * 4 + Duration::from_secs(60) }
    }
}

/// A job's stored row, as a claim compares it with a delivery.
struct Existing {
    status: String,
    campaign: String,
    voice: String,
    text: String,
    speech_tokens: Option<serde_json::Value>,
    speed: Option<f64>,
    mode: Option<String>,
    instruction: Option<String>,
    claimed_by: Option<String>,
    /// `running` under a claim that is still live.
    live: bool,
}

impl Db {
    /// Claims a batch's jobs. Decisions come back in input order.
    pub async fn claim(&self, jobs: &[Job], worker_id: &str, lease: &ClaimLease) -> Result<Vec<Claim>, DbError> {
        if jobs.is_empty() {
            return Ok(Vec::new());
        }
        let mut sorted: Vec<&Job> = jobs.iter().collect();
        sorted.sort_by_key(|j| j.job_id);
        let mut tx = self.pool.begin().await.map_err(q("begin claim"))?;
        insert_queued(&mut tx, &sorted).await?;
        let ids: Vec<Uuid> = sorted.iter().map(|j| j.job_id).collect();
        let rows = sqlx::query(
            "SELECT j.job_id, j.status, j.campaign, j.voice, j.text, j.speech_tokens, j.worker_id,
                    (j.status = 'running' AND w.worker_id IS NOT NULL AND w.stopped_at IS NULL
                     AND w.last_heartbeat > now() - make_interval(secs => $2)
                     AND j.started_at > now() - make_interval(secs => $3)) AS live, j.speed, j.mode, j.instruction
             FROM jobs j LEFT JOIN workers w ON w.worker_id = j.worker_id
             WHERE j.job_id = ANY($1) ORDER BY j.job_id FOR UPDATE OF j",
        )
        .bind(&ids)
        .bind(lease.heartbeat_stale.as_secs_f64())
        .bind(lease.max_age.as_secs_f64())
        .fetch_all(&mut *tx)
        .await
        .map_err(q("lock jobs"))?;
        let mut existing: HashMap<Uuid, Existing> = HashMap::new();
        for r in rows {
            let row = Existing {
                status: r.get(1),
                campaign: r.get(2),
                voice: r.get(3),
                text: r.get(4),
                speech_tokens: r.get(5),
                claimed_by: r.get(6),
                live: r.get::<Option<bool>, _>(7).unwrap_or(false),
                speed: r.get(8),
                mode: r.get(9),
                instruction: r.get(10),
            };
            existing.insert(r.get(0), row);
        }
        let campaigns: Vec<&str> = sorted.iter().map(|j| j.campaign.as_str()).collect();
        let cancelled: std::collections::HashSet<String> =
            sqlx::query_scalar("SELECT campaign FROM campaign_cancels WHERE campaign = ANY($1)")
                .bind(&campaigns)
                .fetch_all(&mut *tx)
                .await
                .map_err(q("read cancelled campaigns"))?
                .into_iter()
                .collect();
        let mut decisions: Vec<Claim> = jobs
            .iter()
            .map(|j| match decide(j, existing.get(&j.job_id)) {
                Claim::AlreadyDone => Claim::AlreadyDone,
                _ if cancelled.contains(&j.campaign) => Claim::Cancelled,
                d => d,
            })
            .collect();
        let proceed: Vec<&Job> =
            jobs.iter().zip(&decisions).filter(|(_, d)| matches!(d, Claim::Proceed { .. })).map(|(j, _)| j).collect();
        let claims = mark_running(&mut tx, &proceed, worker_id).await?;
        for (j, d) in jobs.iter().zip(decisions.iter_mut()) {
            if let Claim::Proceed { claim } = d {
                *claim = *claims.get(&j.job_id).ok_or(DbError::Encode { what: "claim", reason: format!("job {} was not marked running", j.job_id) })?;
            }
        }
        let cancel: Vec<Uuid> = jobs.iter().zip(&decisions).filter(|(_, d)| **d == Claim::Cancelled).map(|(j, _)| j.job_id).collect();
        if !cancel.is_empty() {
            sqlx::query(
                "UPDATE jobs SET status = 'cancelled', finished_at = now(), worker_id = $2,
                   error = 'its campaign was cancelled (voxbatch cancel --campaign)', event_published_at = NULL, event_claimed_at = NULL
                 WHERE job_id = ANY($1) AND status <> 'done'",
            )
            .bind(&cancel)
            .bind(worker_id)
            .execute(&mut *tx)
            .await
            .map_err(q("mark cancelled"))?;
        }
        tx.commit().await.map_err(q("commit claim"))?;
        Ok(decisions)
    }

    /// Cancels `campaign` (`true` if it was not already): its jobs not yet done are acked without
    /// synthesis at their next claim.
    pub async fn cancel_campaign(&self, campaign: &str) -> Result<bool, DbError> {
        let r = sqlx::query("INSERT INTO campaign_cancels (campaign) VALUES ($1) ON CONFLICT (campaign) DO NOTHING")
            .bind(campaign)
            .execute(&self.pool)
            .await
            .map_err(q("cancel campaign"))?;
        Ok(r.rows_affected() == 1)
    }

    /// Undoes [`Db::cancel_campaign`] for jobs not yet consumed (`true` if it was cancelled).
    pub async fn resume_campaign(&self, campaign: &str) -> Result<bool, DbError> {
        let r = sqlx::query("DELETE FROM campaign_cancels WHERE campaign = $1")
            .bind(campaign)
            .execute(&self.pool)
            .await
            .map_err(q("resume campaign"))?;
        Ok(r.rows_affected() == 1)
    }

    /// Gives claims back (`running` → `queued`) when this worker returns the messages.
    pub async fn release(&self, job_ids: &[Uuid], worker_id: &str) -> Result<(), DbError> {
        sqlx::query("UPDATE jobs SET status = 'queued' WHERE job_id = ANY($1) AND status = 'running' AND worker_id = $2")
            .bind(job_ids)
            .bind(worker_id)
            .execute(&self.pool)
            .await
            .map_err(q("release claims"))?;
        Ok(())
    }
}

fn decide(j: &Job, existing: Option<&Existing>) -> Claim {
    let Some(e) = existing else { return Claim::Proceed { claim: 0 } };
    if e.status == "rejected" {
        return Claim::Proceed { claim: 0 };
    }
    let field = if e.text != j.text {
        Some("text")
    } else if e.speech_tokens != speech_tokens_json(j) {
        Some("speech_tokens")
    } else if e.voice != j.voice {
        Some("voice")
    } else if e.campaign != j.campaign {
        Some("campaign")
    } else if e.speed.unwrap_or(1.0) != j.speed.unwrap_or(1.0) {
        Some("speed")
    } else if e.mode.as_deref() != j.mode.map(Mode::as_str) {
        Some("mode")
    } else if e.instruction != j.instruction {
        Some("instruction")
    } else {
        None
    };
    match (field, e.status.as_str()) {
        (Some(field), _) => Claim::Conflict(RejectionKind::Conflict { job_id: j.job_id, field }),
        (None, "done") => Claim::AlreadyDone,
        (None, "running") if e.live => Claim::Busy { worker_id: e.claimed_by.clone().unwrap_or_default() },
        (None, _) => Claim::Proceed { claim: 0 },
    }
}

async fn insert_queued(tx: &mut sqlx::PgConnection, jobs: &[&Job]) -> Result<(), DbError> {
    let ids: Vec<Uuid> = jobs.iter().map(|j| j.job_id).collect();
    let campaigns: Vec<&str> = jobs.iter().map(|j| j.campaign.as_str()).collect();
    let voices: Vec<&str> = jobs.iter().map(|j| j.voice.as_str()).collect();
    let texts: Vec<&str> = jobs.iter().map(|j| j.text.as_str()).collect();
    let priorities: Vec<i16> = jobs.iter().map(|j| i16::from(j.priority)).collect();
    let metadata: Vec<Option<serde_json::Value>> = jobs.iter().map(|j| j.metadata.clone().map(serde_json::Value::Object)).collect();
    let chars: Vec<i32> = jobs.iter().map(|j| j.chars() as i32).collect();
    let speech: Vec<Option<serde_json::Value>> = jobs.iter().map(|j| speech_tokens_json(j)).collect();
    let (speeds, modes, instructions) = synthesis_settings(jobs);
    sqlx::query(
        "INSERT INTO jobs (job_id, campaign, voice, text, priority, metadata, chars, status, speech_tokens, speed, mode, instruction)
         SELECT t.job_id, t.campaign, t.voice, t.text, t.priority, t.metadata, t.chars, 'queued', t.speech_tokens, t.speed, t.mode, t.instruction
         FROM UNNEST($1::uuid[], $2::text[], $3::text[], $4::text[], $5::smallint[], $6::jsonb[], $7::int[], $8::jsonb[], $9::float8[], $10::text[], $11::text[])
           AS t(job_id, campaign, voice, text, priority, metadata, chars, speech_tokens, speed, mode, instruction)
         ON CONFLICT (job_id) DO NOTHING",
    )
    .bind(&ids)
    .bind(&campaigns)
    .bind(&voices)
    .bind(&texts)
    .bind(&priorities)
    .bind(&metadata)
    .bind(&chars)
    .bind(&speech)
    .bind(&speeds)
    .bind(&modes)
    .bind(&instructions)
    .execute(&mut *tx)
    .await
    .map_err(q("insert jobs"))?;
    Ok(())
}

/// Marks jobs `running` for `worker_id` (attempts + 1) and returns each job's claim number (its
/// attempts after this claim). The delivery's own fields replace the row's (a valid resubmission
/// of a rejected id stores its priority and metadata).
async fn mark_running(tx: &mut sqlx::PgConnection, jobs: &[&Job], worker_id: &str) -> Result<HashMap<Uuid, i32>, DbError> {
    if jobs.is_empty() {
        return Ok(HashMap::new());
    }
    let ids: Vec<Uuid> = jobs.iter().map(|j| j.job_id).collect();
    let campaigns: Vec<&str> = jobs.iter().map(|j| j.campaign.as_str()).collect();
    let voices: Vec<&str> = jobs.iter().map(|j| j.voice.as_str()).collect();
    let texts: Vec<&str> = jobs.iter().map(|j| j.text.as_str()).collect();
    let chars: Vec<i32> = jobs.iter().map(|j| j.chars() as i32).collect();
    let speech: Vec<Option<serde_json::Value>> = jobs.iter().map(|j| speech_tokens_json(j)).collect();
    let priorities: Vec<i16> = jobs.iter().map(|j| i16::from(j.priority)).collect();
    let metadata: Vec<Option<serde_json::Value>> = jobs.iter().map(|j| j.metadata.clone().map(serde_json::Value::Object)).collect();
    let (speeds, modes, instructions) = synthesis_settings(jobs);
    let rows = sqlx::query(
        "UPDATE jobs SET status = 'running', attempts = jobs.attempts + 1, started_at = now(), worker_id = $6,
           error = NULL, campaign = t.campaign, voice = t.voice, text = t.text, chars = t.chars,
           speech_tokens = t.speech_tokens, priority = t.priority, metadata = t.metadata, speed = t.speed,
           mode = t.mode, instruction = t.instruction
         FROM UNNEST($1::uuid[], $2::text[], $3::text[], $4::text[], $5::int[], $7::jsonb[], $8::smallint[], $9::jsonb[], $10::float8[], $11::text[], $12::text[])
           AS t(job_id, campaign, voice, text, chars, speech_tokens, priority, metadata, speed, mode, instruction)
         WHERE jobs.job_id = t.job_id AND jobs.status <> 'done'
         RETURNING jobs.job_id, jobs.attempts",
    )
    .bind(&ids)
    .bind(&campaigns)
    .bind(&voices)
    .bind(&texts)
    .bind(&chars)
    .bind(worker_id)
    .bind(&speech)
    .bind(&priorities)
    .bind(&metadata)
    .bind(&speeds)
    .bind(&modes)
    .bind(&instructions)
    .fetch_all(&mut *tx)
    .await
    .map_err(q("mark running"))?;
    Ok(rows.into_iter().map(|r| (r.get(0), r.get(1))).collect())
}

/// The jobs' `speed`, `mode` and `instruction` columns.
#[allow(clippy::type_complexity)]
fn synthesis_settings(jobs: &[&Job]) -> (Vec<Option<f64>>, Vec<Option<&'static str>>, Vec<Option<String>>) {
    (
        jobs.iter().map(|j| j.speed).collect(),
        jobs.iter().map(|j| j.mode.map(Mode::as_str)).collect(),
        jobs.iter().map(|j| j.instruction.clone()).collect(),
    )
}
