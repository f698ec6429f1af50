//! A campaign's progress from Postgres: jobs by status, what is done (jobs, characters, audio,
//! cost), the recent rate, and what `enqueue` published — the figures `status --campaign` turns
//! into an ETA and a projected cost.
//!
//! Neighbours: `commands::campaign` (turns it into progress, prints and watches it; a campaign
//! `enqueue` recorded nothing of has an unknown size), `commands::enqueue` (records what it
//! published, [`Db::record_enqueued`]).

use std::time::Duration;

use super::{q, Db, DbError};

/// Raw progress figures of one campaign.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct CampaignFigures {
    pub by_status: Vec<(String, i64)>,
    /// Jobs and characters `enqueue` published for the campaign.
    pub enqueued_jobs: i64,
    pub enqueued_chars: i64,
    /// Rows Postgres has (claimed at least once) and their characters.
    pub known_jobs: i64,
    pub known_chars: i64,
    /// Jobs settled for good (done, failed, rejected, cancelled) and their characters.
    pub finished_jobs: i64,
    pub finished_chars: i64,
    pub done_jobs: i64,
    pub done_chars: i64,
    pub done_audio_seconds: f64,
    pub cost_usd: f64,
    /// Done within the window: jobs, characters, audio seconds, and the seconds the window spans
    /// (shorter than asked when the campaign started inside it).
    pub recent_jobs: i64,
    pub recent_chars: i64,
    pub recent_audio_seconds: f64,
    pub recent_seconds: f64,
    pub cancelled: bool,
}

impl Db {
    /// Records that a run of `enqueue` over `source` from line `first_line` has published `jobs`
    /// jobs of `campaign` with `chars` characters so far.
    pub async fn record_enqueued(&self, campaign: &str, source: &str, first_line: i32, jobs: i64, chars: i64) -> Result<(), DbError> {
        sqlx::query(
            "INSERT INTO campaign_enqueues (campaign, source, first_line, jobs, chars) VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (campaign, source, first_line) DO UPDATE
             SET jobs = GREATEST(campaign_enqueues.jobs, EXCLUDED.jobs), chars = GREATEST(campaign_enqueues.chars, EXCLUDED.chars),
                 updated_at = now()",
        )
        .bind(campaign)
        .bind(source)
        .bind(first_line)
        .bind(jobs)
        .bind(chars)
        .execute(&self.pool)
        .await
        .map_err(q("record enqueued"))?;
        Ok(())
    }

    /// `campaign`'s figures, its rate over the last `window`.
    pub async fn campaign_figures(&self, campaign: &str, window: Duration) -> Result<CampaignFigures, DbError> {
        let mut f = CampaignFigures { by_status: self.jobs_by_status(Some(campaign)).await?, ..Default::default() };
        // One pass over the campaign's jobs: totals and the recent rate.
        (
            f.known_jobs,
            f.known_chars,
            f.finished_jobs,
            f.finished_chars,
            f.done_jobs,
            f.done_chars,
            f.done_audio_seconds,
            f.recent_jobs,
            f.recent_chars,
            f.recent_audio_seconds,
            f.recent_seconds,
        ) = sqlx::query_as(
            "SELECT count(*), coalesce(sum(chars), 0)::int8,
                    count(*) FILTER (WHERE status IN ('done', 'failed', 'rejected', 'cancelled')),
                    coalesce(sum(chars) FILTER (WHERE status IN ('done', 'failed', 'rejected', 'cancelled')), 0)::int8,
                    count(*) FILTER (WHERE status = 'done'),
                    coalesce(sum(chars) FILTER (WHERE status = 'done'), 0)::int8,
                    coalesce(sum(audio_seconds) FILTER (WHERE status = 'done'), 0)::float8,
                    count(*) FILTER (WHERE status = 'done' AND finished_at > now() - make_interval(secs => $2)),
                    coalesce(sum(chars) FILTER (WHERE status = 'done' AND finished_at > now() - make_interval(secs => $2)), 0)::int8,
                    coalesce(sum(audio_seconds) FILTER (WHERE status = 'done' AND finished_at > now() - make_interval(secs => $2)), 0)::float8,
                    LEAST($2, extract(epoch FROM now() - coalesce(min(started_at), now())))::float8
             FROM jobs WHERE campaign = $1",
        )
        .bind(campaign)
        .bind(window.as_secs_f64())
        .fetch_one(&self.pool)
        .await
        .map_err(q("campaign totals"))?;
        // And what the other tables say of it.
        (f.enqueued_jobs, f.enqueued_chars, f.cost_usd, f.cancelled) = sqlx::query_as(
            "SELECT (SELECT coalesce(sum(jobs), 0)::int8 FROM campaign_enqueues WHERE campaign = $1),
                    (SELECT coalesce(sum(chars), 0)::int8 FROM campaign_enqueues WHERE campaign = $1),
                    (SELECT coalesce(sum(cost_usd), 0)::float8 FROM job_costs WHERE campaign = $1),
                    EXISTS (SELECT 1 FROM campaign_cancels WHERE campaign = $1)",
        )
        .bind(campaign)
        .fetch_one(&self.pool)
        .await
        .map_err(q("campaign enqueued, cost, cancel"))?;
        Ok(f)
    }
}
