//! Postgres: the source of truth for what is done. Schema in `migrations/` (embedded by
//! `migrations.rs`).
//!
//! Inputs: jobs claimed at the start of a batch, finished batches, rejections, worker heartbeats.
//! Outputs: claim decisions (proceed / already done / conflict) and the rows reports read.
//! All SQL uses bound parameters.
//!
//! Neighbours: `worker::infer` claims (`claim.rs`) before inference and `worker::commit` calls
//! `Db::complete_batch` (`batches.rs`) after the
//! upload, and acks only after that commit; `report` reads the same tables; `voices.rs` holds the
//! fleet's CosyVoice2 voices (`voice` commands write them, workers' voice books read them).

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, PgPool, Row};
use uuid::Uuid;

use crate::config::DatabaseConfig;
use crate::job::{Job, Rejection, RejectionKind};

mod batches;
mod claim;
pub mod dead;
pub mod events;
mod migrations;
pub mod progress;
mod voices;
pub use batches::{BatchCommit, BatchEvent, BatchRecord, JobResult, StageRecord};
pub use claim::{Claim, ClaimLease};
pub use migrations::MIGRATOR;
pub use voices::{VoiceOrigin, VoiceSource, VoiceSummary};

/// Errors of the database stage. Worker code treats them as transient (retry with backoff).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DbError {
    #[error("invalid database url {url}: {reason}")]
    Url { url: String, reason: String },
    #[error("cannot connect to postgres at {url}")]
    Connect { url: String, source: sqlx::Error },
    #[error("migration failed")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("query failed: {context}")]
    Query { context: &'static str, source: sqlx::Error },
    #[error("cannot encode the {what}: {reason}")]
    Encode { what: &'static str, reason: String },
}

impl DbError {
    /// The SQLSTATE of the server's error, if the server answered with one.
    pub fn sqlstate(&self) -> Option<String> {
        let source = match self {
            DbError::Connect { source, .. } | DbError::Query { source, .. } => source,
            DbError::Migrate(sqlx::migrate::MigrateError::Execute(source)) => source,
            _ => return None,
        };
        source.as_database_error().and_then(|d| d.code()).map(|c| c.to_string())
    }
}

impl crate::transience::Transience for DbError {
    /// Refused credentials (28P01, 28000) or a missing role/database (3D000) do not heal by
    /// waiting; a bad URL neither.
    fn is_permanent(&self) -> bool {
        matches!(self, DbError::Url { .. } | DbError::Encode { .. })
            || matches!(self.sqlstate().as_deref(), Some("28P01" | "28000" | "3D000"))
    }
}

fn q(context: &'static str) -> impl FnOnce(sqlx::Error) -> DbError {
    move |source| DbError::Query { context, source }
}

/// A pool of connections to voxbatch's database.
#[derive(Clone, Debug)]
pub struct Db {
    pool: PgPool,
}


/// A worker's registration row.
#[derive(Debug, Clone)]
pub struct WorkerRow<'a> {
    pub worker_id: &'a str,
    pub device: &'a str,
    pub model: &'a str,
    pub precision: &'a str,
    pub gpu_name: Option<&'a str>,
    pub hourly_usd: f64,
}

/// Database name of a URL, and the URL of the maintenance database on the same server.
fn split_url(url: &str) -> Result<(String, String), DbError> {
    let bad = |reason: &str| DbError::Url { url: crate::config::SecretUrl::new(url).redacted(), reason: reason.into() };
    let mut u = url::Url::parse(url).map_err(|e| bad(&e.to_string()))?;
    let name = u.path().trim_start_matches('/').to_string();
    if name.is_empty() {
        return Err(bad("no database name in the path"));
    }
    if !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
        return Err(bad("database name must be letters, digits, _ or -"));
    }
    u.set_path("/postgres");
    Ok((name, u.to_string()))
}

impl Db {
    /// Connects, creating the database first if it does not exist.
    pub async fn connect(cfg: &DatabaseConfig) -> Result<Db, DbError> {
        let url = cfg.url.expose();
        ensure_database(url).await?;
        let opts: PgConnectOptions = url
            .parse::<PgConnectOptions>()
            .map_err(|e| DbError::Url { url: cfg.url.redacted(), reason: e.to_string() })?
            .disable_statement_logging();
        let pool = PgPoolOptions::new()
            .max_connections(cfg.max_connections)
            .acquire_timeout(Duration::from_secs(5))
            .connect_with(opts)
            .await
            .map_err(|source| DbError::Connect { url: cfg.url.redacted(), source })?;
        Ok(Db { pool })
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Applies pending migrations (idempotent).
    pub async fn migrate(&self) -> Result<(), DbError> {
        MIGRATOR.run(&self.pool).await?;
        Ok(())
    }

    /// Registers (or re-registers) a worker.
    pub async fn register_worker(&self, w: &WorkerRow<'_>) -> Result<(), DbError> {
        let host = hostname();
        sqlx::query(
            "INSERT INTO workers (worker_id, host, pid, device, model, precision, gpu_name, hourly_usd)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
             ON CONFLICT (worker_id) DO UPDATE SET host = EXCLUDED.host, pid = EXCLUDED.pid, device = EXCLUDED.device,
               model = EXCLUDED.model, precision = EXCLUDED.precision, gpu_name = EXCLUDED.gpu_name,
               hourly_usd = EXCLUDED.hourly_usd, busy_ms = 0, alive_ms = 0,
               started_at = now(), last_heartbeat = now(), stopped_at = NULL",
        )
        .bind(w.worker_id)
        .bind(host)
        .bind(std::process::id() as i32)
        .bind(w.device)
        .bind(w.model)
        .bind(w.precision)
        .bind(w.gpu_name)
        .bind(w.hourly_usd)
        .execute(&self.pool)
        .await
        .map_err(q("register worker"))?;
        // Claims left by an earlier run under the same id (it is not running them any more).
        sqlx::query("UPDATE jobs SET status = 'queued' WHERE worker_id = $1 AND status = 'running'")
            .bind(w.worker_id)
            .execute(&self.pool)
            .await
            .map_err(q("release earlier claims"))?;
        Ok(())
    }

    /// Heartbeat with the worker's busy (inference) and alive time so far.
    pub async fn heartbeat(&self, worker_id: &str, busy_ms: f64, alive_ms: f64) -> Result<(), DbError> {
        sqlx::query("UPDATE workers SET last_heartbeat = now(), busy_ms = $2, alive_ms = $3 WHERE worker_id = $1")
            .bind(worker_id)
            .bind(busy_ms)
            .bind(alive_ms)
            .execute(&self.pool)
            .await
            .map_err(q("heartbeat"))?;
        Ok(())
    }

    pub async fn worker_stopped(&self, worker_id: &str, busy_ms: f64, alive_ms: f64) -> Result<(), DbError> {
        sqlx::query(
            "UPDATE workers SET last_heartbeat = now(), stopped_at = now(), busy_ms = $2, alive_ms = $3 WHERE worker_id = $1",
        )
            .bind(worker_id)
            .bind(busy_ms)
            .bind(alive_ms)
            .execute(&self.pool)
            .await
            .map_err(q("worker stopped"))?;
        Ok(())
    }

    /// A job's status, `None` when it has no row.
    /// A job's status and how many times a worker claimed it (`None`: no row, never claimed).
    pub async fn job_state(&self, job_id: Uuid) -> Result<Option<(String, i32)>, DbError> {
        sqlx::query_as("SELECT status, attempts FROM jobs WHERE job_id = $1").bind(job_id).fetch_optional(&self.pool).await.map_err(q("job state"))
    }

    /// Marks jobs `failed` with a reason (they are dead-lettered by the caller).
    pub async fn mark_failed(&self, job_ids: &[Uuid], error: &str) -> Result<(), DbError> {
        sqlx::query(
            "UPDATE jobs SET status = 'failed', error = $2, finished_at = now(), event_published_at = NULL, event_claimed_at = NULL
             WHERE job_id = ANY($1) AND status <> 'done'",
        )
        .bind(job_ids)
        .bind(error)
        .execute(&self.pool)
        .await
        .map_err(q("mark failed"))?;
        Ok(())
    }

    /// Records a rejected message: a `rejections` row always, and a `rejected` job row when the
    /// job_id could be read and no row exists for it yet (an existing row is never overwritten).
    pub async fn record_rejection(&self, rejection: &Rejection, payload: &[u8], worker_id: &str) -> Result<(), DbError> {
        let excerpt: String =
            String::from_utf8_lossy(&payload[..payload.len().min(1024)]).chars().filter(|c| *c != '\0').take(256).collect();
        let reason = rejection.to_string().replace('\0', "");
        let mut tx = self.pool.begin().await.map_err(q("begin"))?;
        sqlx::query(
            "INSERT INTO rejections (job_id, code, reason, payload_bytes, payload_excerpt, worker_id, campaign) VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(rejection.job_id)
        .bind(rejection.kind.code())
        .bind(&reason)
        .bind(payload.len() as i32)
        .bind(&excerpt)
        .bind(worker_id)
        .bind(rejection.campaign.as_deref())
        .execute(&mut *tx)
        .await
        .map_err(q("insert rejection"))?;
        if let Some(job_id) = rejection.job_id {
            if !matches!(rejection.kind, RejectionKind::Conflict { .. }) {
                sqlx::query(
                    "INSERT INTO jobs (job_id, campaign, voice, text, chars, status, error, worker_id, finished_at)
                     VALUES ($1, $4, 'default', '', 0, 'rejected', $2, $3, now())
                     ON CONFLICT (job_id) DO NOTHING",
                )
                .bind(job_id)
                .bind(&reason)
                .bind(worker_id)
                .bind(rejection.campaign.as_deref().unwrap_or(crate::job::DEFAULT_CAMPAIGN))
                .execute(&mut *tx)
                .await
                .map_err(q("insert rejected job"))?;
            }
        }
        tx.commit().await.map_err(q("commit rejection"))?;
        Ok(())
    }

    /// Stores a calibration profile.
    pub async fn record_calibration(&self, p: &crate::batch::memory::Profile) -> Result<(), DbError> {
        sqlx::query(
            "INSERT INTO calibrations (model, gpu_name, precision, m0_bytes, a_bytes_per_frame, b_bytes_per_frame2, r2,
               worst_rel_error, worst_error_of_max_peak, points, total_memory_bytes, vram_fraction, profile)
             VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10,$11,$12,$13)",
        )
        .bind(&p.model)
        .bind(&p.gpu)
        .bind(&p.precision)
        .bind(p.fit.model.m0)
        .bind(p.fit.model.a)
        .bind(p.fit.model.b)
        .bind(p.fit.r2)
        .bind(p.fit.worst_rel_error)
        .bind(p.fit.worst_error_of_max_peak)
        .bind(p.points.len() as i32)
        .bind(p.total_memory_bytes as i64)
        .bind(p.vram_fraction)
        .bind(serde_json::to_value(p).map_err(|e| DbError::Encode { what: "calibration profile", reason: e.to_string() })?)
        .execute(&self.pool)
        .await
        .map_err(q("record calibration"))?;
        Ok(())
    }

    /// Job counts by status, optionally for one campaign.
    pub async fn jobs_by_status(&self, campaign: Option<&str>) -> Result<Vec<(String, i64)>, DbError> {
        let rows = sqlx::query(
            "SELECT status, count(*) FROM jobs WHERE ($1::text IS NULL OR campaign = $1) GROUP BY status ORDER BY status",
        )
        .bind(campaign)
        .fetch_all(&self.pool)
        .await
        .map_err(q("count jobs"))?;
        Ok(rows.into_iter().map(|r| (r.get(0), r.get(1))).collect())
    }
}

/// Creates the database named in `url` if it does not exist.
pub async fn ensure_database(url: &str) -> Result<(), DbError> {
    let (name, admin_url) = split_url(url)?;
    let redacted = crate::config::SecretUrl::new(url).redacted();
    let opts: PgConnectOptions = admin_url
        .parse::<PgConnectOptions>()
        .map_err(|e| DbError::Url { url: redacted.clone(), reason: e.to_string() })?
        .disable_statement_logging();
    let mut conn = match opts.connect().await {
        Ok(c) => c,
        // No access to the maintenance database: assume the target exists; connecting will tell.
        Err(sqlx::Error::Database(_)) => return Ok(()),
        Err(source) => return Err(DbError::Connect { url: redacted, source }),
    };
    let exists: bool = sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
        .bind(&name)
        .fetch_one(&mut conn)
        .await
        .map_err(q("look up database"))?;
    if !exists {
        // Identifiers cannot be bound; `name` was checked to be [A-Za-z0-9_-]+ by split_url.
        let create = format!("CREATE DATABASE \"{name}\"");
        if let Err(e) = sqlx::raw_sql(&create).execute(&mut conn).await {
            // Another process may have created it at the same moment.
            let duplicate = e.as_database_error().and_then(|d| d.code()).is_some_and(|c| c == "42P04" || c == "23505");
            if !duplicate {
                return Err(DbError::Query { context: "create database", source: e });
            }
        }
    }
    Ok(())
}

/// This machine's host name.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".to_string())
}

/// A job's speech tokens as stored in `jobs.speech_tokens`.
fn speech_tokens_json(job: &Job) -> Option<serde_json::Value> {
    job.speech_tokens.as_ref().map(|t| serde_json::Value::from(t.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_urls_split_into_name_and_maintenance_url() {
        let (name, admin) = split_url("postgres://u:p@h:5433/voxbatch?sslmode=require").unwrap();
        assert_eq!(name, "voxbatch");
        assert_eq!(admin, "postgres://u:p@h:5433/postgres?sslmode=require");
        assert!(split_url("postgres://h/").is_err());
        assert!(split_url("postgres://h/x;drop").is_err());
    }
}
