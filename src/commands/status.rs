//! `voxbatch status`: each service's state, queue depths, jobs by status, workers with their
//! heartbeats, and jobs stuck in `running` with no live worker. A service that is down is shown
//! as such (the others are still reported): an outage in progress is visible here.

use std::time::Duration;

use serde_json::json;

use super::CommandError;
use crate::config::Config;
use crate::job::escape_controls as esc;
use crate::report::{Render, Table};
use crate::db::{Db, DbError};
use crate::queue::{self, QueueError};
use crate::storage::Storage;

/// One worker as its heartbeats show it.
#[derive(Debug, Clone, serde::Serialize)]
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
    /// Messages rejected or dead-lettered, by code: the `rejections` rows, and jobs that failed
    /// synthesis (`synthesis_failed`, recorded as `failed` jobs only).
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
    // A job that failed synthesis is dead-lettered as `synthesis_failed` with a `failed` row and
    // no `rejections` row (one that reached the delivery limit has both).
    let rejections: Vec<(String, i64)> = sqlx::query_as(
        "SELECT code, count(*) FROM (
           SELECT code FROM rejections
           UNION ALL
           SELECT 'synthesis_failed' FROM jobs j WHERE j.status = 'failed'
             AND NOT EXISTS (SELECT 1 FROM rejections r WHERE r.job_id = j.job_id AND r.code = 'delivery_limit')
         ) c GROUP BY code ORDER BY 2 DESC, 1",
    )
    .fetch_all(db.pool())
    .await
    .map_err(q("count rejections"))?;
    Ok((jobs, orphaned, workers, rejections))
}

impl serde::Serialize for Status {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let pairs = |v: &[(String, i64)]| v.iter().map(|(k, n)| (k.clone(), json!(n))).collect::<serde_json::Map<_, _>>();
        let (ready, dead, broker_error) = match &self.depths {
            Ok((r, d)) => (json!(r), json!(d), json!(null)),
            Err(e) => (json!(null), json!(null), json!(e)),
        };
        let (jobs, postgres_error) = match &self.jobs_by_status {
            Ok(jobs) => (json!(pairs(jobs)), json!(null)),
            Err(e) => (json!(null), json!(e)),
        };
        json!({
            "queue": self.queue,
            "dead_letter_queue": self.dead_letter_queue,
            "ready": ready,
            "dead_lettered": dead,
            "broker_error": broker_error,
            "jobs_by_status": jobs,
            "postgres_error": postgres_error,
            "storage_error": self.storage.as_ref().err(),
            "orphaned_running": self.orphaned_running,
            "workers": self.workers,
            "rejections_by_code": pairs(&self.rejections_by_code),
        })
        .serialize(s)
    }
}

impl Render for Status {
    fn text(&self) -> String {
        let mut out = Vec::new();
        match &self.depths {
            Ok((ready, dead)) => {
                out.push(format!("queue {}: {ready} ready", self.queue));
                out.push(format!("dead-letter queue {}: {dead} message(s)", self.dead_letter_queue));
            }
            Err(e) => out.push(format!("RabbitMQ: UNREACHABLE ({})", esc(e))),
        }
        match &self.storage {
            Ok(()) => out.push("storage: ok".into()),
            Err(e) => out.push(format!("storage: UNREACHABLE ({}): workers hold and retry, nothing is lost", esc(e))),
        }
        match &self.jobs_by_status {
            Ok(jobs) if jobs.is_empty() => out.push("jobs by status: none".into()),
            Ok(jobs) => {
                let mut t = Table::new(["status", "jobs"]);
                for (status, n) in jobs {
                    t.row([status.clone(), n.to_string()]);
                }
                out.push(format!("jobs by status:\n{}", t.to_string().trim_end()));
            }
            Err(e) => out.push(format!("Postgres: UNREACHABLE ({})", esc(e))),
        }
        if self.orphaned_running > 0 {
            out.push(format!("{} running job(s) have no live worker: they run again when the broker redelivers them", self.orphaned_running));
        }
        if !self.workers.is_empty() {
            let mut t = Table::new(["worker_id", "device", "state", "seconds_since_heartbeat"]);
            for w in &self.workers {
                t.row([w.worker_id.clone(), w.device.clone(), w.state.to_string(), format!("{:.0}", w.seconds_since_heartbeat)]);
            }
            out.push(format!("workers:\n{}", t.to_string().trim_end()));
        }
        if !self.rejections_by_code.is_empty() {
            let mut t = Table::new(["code", "messages"]);
            for (code, n) in &self.rejections_by_code {
                t.row([code.clone(), n.to_string()]);
            }
            out.push(format!("rejected or dead-lettered, by code:\n{}", t.to_string().trim_end()));
        }
        out.join("\n") + "\n"
    }
}
