//! What Postgres knows about dead-lettered jobs: their attempts and rejections (for `dead list`)
//! and the record of each requeue (so that an interrupted `dead requeue` never publishes one
//! dead-lettering twice).
//!
//! Neighbours: `queue::dead` (the dead-letter queue itself), `commands::dead` (the commands).

use std::collections::{HashMap, HashSet};

use uuid::Uuid;

use super::{q, Db, DbError};

/// A job's history as `dead list` shows it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobHistory {
    /// Times a worker claimed it (`jobs.attempts`).
    pub attempts: i32,
    /// Times it was requeued from the dead-letter queue.
    pub requeues: i32,
    /// Rejections recorded for it (`rejections` rows).
    pub rejections: i64,
}

impl Db {
    /// The history of each of `job_ids` that Postgres has a row or a rejection for.
    pub async fn job_histories(&self, job_ids: &[Uuid]) -> Result<HashMap<Uuid, JobHistory>, DbError> {
        let rows: Vec<(Uuid, Option<i32>, Option<i32>, i64)> = sqlx::query_as(
            "SELECT ids.id, j.attempts, j.requeues, (SELECT count(*) FROM rejections r WHERE r.job_id = ids.id)
             FROM UNNEST($1::uuid[]) AS ids(id) LEFT JOIN jobs j ON j.job_id = ids.id",
        )
        .bind(job_ids)
        .fetch_all(&self.pool)
        .await
        .map_err(q("read job histories"))?;
        Ok(rows
            .into_iter()
            .filter(|(_, attempts, _, rejections)| attempts.is_some() || *rejections > 0)
            .map(|(id, attempts, requeues, rejections)| {
                (id, JobHistory { attempts: attempts.unwrap_or(0), requeues: requeues.unwrap_or(0), rejections })
            })
            .collect())
    }

    /// Which of `identities` were already requeued.
    pub async fn requeued(&self, identities: &[String]) -> Result<HashSet<String>, DbError> {
        let rows: Vec<(String,)> = sqlx::query_as("SELECT identity FROM dead_requeues WHERE identity = ANY($1)")
            .bind(identities)
            .fetch_all(&self.pool)
            .await
            .map_err(q("read requeues"))?;
        Ok(rows.into_iter().map(|(i,)| i).collect())
    }

    /// Records that the dead-lettering `identity` was republished: its row, and the job (if it
    /// has one) one more requeue, a `failed` job back to `queued`. (A `rejected` row stays so: it
    /// holds no content, and the claim takes the next delivery of a rejected id as a new
    /// submission.) One transaction.
    pub async fn record_requeue(&self, identity: &str, job_id: Option<Uuid>, campaign: Option<&str>, code: &str) -> Result<(), DbError> {
        let mut tx = self.pool.begin().await.map_err(q("begin requeue"))?;
        let inserted = sqlx::query(
            "INSERT INTO dead_requeues (identity, job_id, campaign, code) VALUES ($1, $2, $3, $4) ON CONFLICT (identity) DO NOTHING",
        )
        .bind(identity)
        .bind(job_id)
        .bind(campaign)
        .bind(code)
        .execute(&mut *tx)
        .await
        .map_err(q("record requeue"))?
        .rows_affected();
        if inserted == 1 {
            if let Some(id) = job_id {
                sqlx::query(
                    "UPDATE jobs SET requeues = requeues + 1,
                       status = CASE WHEN status = 'failed' THEN 'queued' ELSE status END
                     WHERE job_id = $1",
                )
                .bind(id)
                .execute(&mut *tx)
                .await
                .map_err(q("mark job requeued"))?;
            }
        }
        tx.commit().await.map_err(q("commit requeue"))?;
        Ok(())
    }
}
