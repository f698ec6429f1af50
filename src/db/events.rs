//! Completion events waiting in Postgres: a settled job's event is pending until the broker has
//! confirmed it. Sweeps claim pending events for a while (so two workers rarely publish the same
//! one), publish them, and mark them; a claim left by a crash expires and the event is published
//! again — at least once, never missing.
//!
//! Neighbours: `worker::events` (the sweep), `db::progress` (what "drained" means).

use std::time::Duration;

use uuid::Uuid;

use super::{q, Db, DbError};

/// One job's completion as its event carries it.
#[derive(Debug, Clone)]
pub struct JobEvent {
    pub job_id: Uuid,
    pub campaign: String,
    /// `done`, `failed`, `cancelled` or `rejected`.
    pub status: String,
    pub s3_key: Option<String>,
    pub audio_seconds: Option<f64>,
    pub chars: i32,
    pub cost_usd: Option<f64>,
    pub batch_id: Option<Uuid>,
    pub error: Option<String>,
    pub finished_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// Read by column name, as sqlx's derive would (written out: sqlx's proc macros are not built).
impl<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow> for JobEvent {
    fn from_row(row: &'r sqlx::postgres::PgRow) -> Result<Self, sqlx::Error> {
        use sqlx::Row;
        Ok(JobEvent {
            job_id: row.try_get("job_id")?,
            campaign: row.try_get("campaign")?,
            status: row.try_get("status")?,
            s3_key: row.try_get("s3_key")?,
            audio_seconds: row.try_get("audio_seconds")?,
            chars: row.try_get("chars")?,
            cost_usd: row.try_get("cost_usd")?,
            batch_id: row.try_get("batch_id")?,
            error: row.try_get("error")?,
            finished_at: row.try_get("finished_at")?,
        })
    }
}

impl Db {
    /// Claims up to `limit` pending job events (unclaimed, or claimed longer than `claim_for` ago).
    pub async fn claim_job_events(&self, limit: i64, claim_for: Duration) -> Result<Vec<JobEvent>, DbError> {
        sqlx::query_as(
            "WITH picked AS (
               SELECT job_id FROM jobs
               WHERE event_published_at IS NULL AND status IN ('done', 'failed', 'cancelled', 'rejected')
                 AND (event_claimed_at IS NULL OR event_claimed_at < now() - make_interval(secs => $2))
               ORDER BY finished_at LIMIT $1 FOR UPDATE SKIP LOCKED)
             UPDATE jobs j SET event_claimed_at = now() FROM picked WHERE j.job_id = picked.job_id
             RETURNING j.job_id, j.campaign, j.status, j.s3_key, j.audio_seconds, j.chars,
               (SELECT c.cost_usd FROM job_costs c WHERE c.job_id = j.job_id) AS cost_usd,
               j.batch_id, j.error, j.finished_at",
        )
        .bind(limit)
        .bind(claim_for.as_secs_f64())
        .fetch_all(&self.pool)
        .await
        .map_err(q("claim job events"))
    }

    /// Marks these jobs' events confirmed by the broker.
    pub async fn job_events_published(&self, job_ids: &[Uuid]) -> Result<(), DbError> {
        sqlx::query("UPDATE jobs SET event_published_at = now() WHERE job_id = ANY($1)")
            .bind(job_ids)
            .execute(&self.pool)
            .await
            .map_err(q("mark job events published"))?;
        Ok(())
    }

    /// Campaigns whose drained event is due. Newly drained ones are recorded first: a campaign
    /// with a job settled in the last ten minutes, none queued or running, and every job `enqueue`
    /// published settled — and, unless `queue_empty` (the job queue has no ready message), only
    /// campaigns `enqueue` published, whose size is known. Once per drain: a campaign drains again
    /// when jobs of it settle after its last drain (a requeued dead letter, a resumed campaign).
    /// Returns every recorded drain not yet published.
    pub async fn due_drains(&self, queue_empty: bool) -> Result<Vec<String>, DbError> {
        sqlx::query(
            "INSERT INTO campaign_drains (campaign)
             SELECT c.campaign FROM (SELECT DISTINCT campaign FROM jobs WHERE finished_at > now() - interval '10 minutes') c
             WHERE NOT EXISTS (SELECT 1 FROM campaign_drains d WHERE d.campaign = c.campaign
                                 AND d.drained_at >= (SELECT max(j.finished_at) FROM jobs j WHERE j.campaign = c.campaign))
               AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.campaign = c.campaign AND j.status IN ('queued', 'running'))
               AND ($1 OR EXISTS (SELECT 1 FROM campaign_enqueues e WHERE e.campaign = c.campaign))
               AND (SELECT count(*) FROM jobs j WHERE j.campaign = c.campaign AND j.status IN ('done', 'failed', 'rejected', 'cancelled'))
                   >= coalesce((SELECT sum(e.jobs) FROM campaign_enqueues e WHERE e.campaign = c.campaign), 0)
             ON CONFLICT (campaign) DO UPDATE SET drained_at = now(), published_at = NULL",
        )
        .bind(queue_empty)
        .execute(&self.pool)
        .await
        .map_err(q("record drained campaigns"))?;
        sqlx::query_scalar("SELECT campaign FROM campaign_drains WHERE published_at IS NULL ORDER BY drained_at")
            .fetch_all(&self.pool)
            .await
            .map_err(q("read due drains"))
    }

    /// Marks a campaign's drained event confirmed.
    pub async fn drain_published(&self, campaign: &str) -> Result<(), DbError> {
        sqlx::query("UPDATE campaign_drains SET published_at = now() WHERE campaign = $1")
            .bind(campaign)
            .execute(&self.pool)
            .await
            .map_err(q("mark drain published"))?;
        Ok(())
    }
}
