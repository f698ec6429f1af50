//! `voxbatch status`: each service's state, queue depths, jobs by status, workers with their
//! heartbeats, and jobs stuck in `running` with no live worker. A service that is down is shown
//! as such (the others are still reported): an outage in progress is visible here.

use std::time::Duration;

use super::CommandError;
use crate::config::Config;
use crate::db::{Db, DbError};
use crate::queue::{self, QueueError};
use crate::storage::Storage;

/// One worker as its heartbeats show it.
#[derive(Debug, Clone)]
pub struct WorkerStatus {
    pub worker_id: String,
    pub device: String,
    pub seconds_since_heartbeat: f64,
    /// live, stale (no heartbeat for three intervals) or stopped.
    pub state: &'static str,
}

/// What `status` found.
#[derive(Debug, Clone)]
pub struct Status {
    pub queue: String,
    pub dead_letter_queue: String,
    /// (ready, dead-lettered), or why the broker could not be asked.
    pub depths: Result<(u32, u32), String>,
    /// Jobs by status, or why Postgres could not be asked.
    pub jobs_by_status: Result<Vec<(String, i64)>, String>,
    /// `running` jobs whose worker is stopped or stale: they run again when the broker
    /// redelivers their messages.
    pub orphaned_running: i64,
    pub workers: Vec<WorkerStatus>,
    /// Rejections by code (the dead-letter queue's reasons).
    pub rejections_by_code: Vec<(String, i64)>,
    /// Ok, or why the audio store is unreachable.
    pub storage: Result<(), String>,
}

/// Collects the status; fails only on a permanent error (refused credentials).
pub async fn status(cfg: &Config) -> Result<Status, CommandError> {
    use crate::worker::retry::Transience;
    let depths = match broker_depths(cfg).await {
        Err(e) if e.is_permanent() => return Err(e.into()),
        r => r.map_err(|e| crate::worker::error_chain(&e)),
    };
    let stale_after = cfg.worker.heartbeat * 3;
    let (jobs_by_status, orphaned_running, workers, rejections_by_code) = match database(cfg, stale_after).await {
        Ok((jobs, orphans, w, rejections)) => (Ok(jobs), orphans, w, rejections),
        Err(e) if e.is_permanent() => return Err(e.into()),
        Err(e) => (Err(crate::worker::error_chain(&e)), 0, Vec::new(), Vec::new()),
    };
    let storage = match Storage::open(&cfg.storage).await {
        Ok(s) => s.ensure_ready(false).await.map_err(|e| crate::worker::error_chain(&e)),
        Err(e) => Err(crate::worker::error_chain(&e)),
    };
    Ok(Status {
        queue: cfg.amqp.queue.clone(),
        dead_letter_queue: cfg.amqp.dead_letter_queue.clone(),
        depths,
        jobs_by_status,
        orphaned_running,
        workers,
        rejections_by_code,
        storage,
    })
}

async fn broker_depths(cfg: &Config) -> Result<(u32, u32), QueueError> {
    let conn = queue::connect(&cfg.amqp, "voxbatch status").await?;
    let channel = conn.create_channel().await.map_err(|source| QueueError::Amqp { op: "channel.open", source })?;
    let depths = queue::queue_depths(&channel, &cfg.amqp).await;
    let _ = conn.close(200, "done".into()).await;
    depths
}

type DatabaseStatus = (Vec<(String, i64)>, i64, Vec<WorkerStatus>, Vec<(String, i64)>);

async fn database(cfg: &Config, stale_after: Duration) -> Result<DatabaseStatus, DbError> {
    let q = |context| move |source| DbError::Query { context, source };
    let db = Db::connect(&cfg.database).await?;
    let jobs = db.jobs_by_status(None).await?;
    let rows: Vec<(String, String, f64, bool)> = sqlx::query_as(
        "SELECT worker_id, device, extract(epoch FROM now() - last_heartbeat)::float8, stopped_at IS NOT NULL
         FROM workers WHERE stopped_at IS NULL OR stopped_at > now() - interval '1 day' ORDER BY worker_id",
    )
    .fetch_all(db.pool())
    .await
    .map_err(q("read workers"))?;
    let workers = rows
        .into_iter()
        .map(|(worker_id, device, age, stopped)| WorkerStatus {
            state: if stopped { "stopped" } else if age > stale_after.as_secs_f64() { "stale" } else { "live" },
            worker_id,
            device,
            seconds_since_heartbeat: age,
        })
        .collect();
    let orphaned: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM jobs j LEFT JOIN workers w ON w.worker_id = j.worker_id
         WHERE j.status = 'running' AND (w.worker_id IS NULL OR w.stopped_at IS NOT NULL
           OR w.last_heartbeat < now() - make_interval(secs => $1))",
    )
    .bind(stale_after.as_secs_f64())
    .fetch_one(db.pool())
    .await
    .map_err(q("count orphaned jobs"))?;
    let rejections: Vec<(String, i64)> = sqlx::query_as("SELECT code, count(*) FROM rejections GROUP BY code ORDER BY 2 DESC, 1")
        .fetch_all(db.pool())
        .await
        .map_err(q("count rejections"))?;
    Ok((jobs, orphaned, workers, rejections))
}
