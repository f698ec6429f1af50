//! What each CLI command does, as library functions (so tests and the demo call the same code the
//! binary does). `main.rs` only parses flags, sets up logging and prints.
//!
//! Neighbours: everything; this is the top of the library.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::Path;

use crate::config::Config;
use crate::db::{Db, DbError};
use crate::enqueue::{read_jobs, EnqueueError, LineDefaults};
use crate::model::{ModelError, ModelHandle};
use crate::queue::{self, Publisher, QueueError};
use crate::storage::{Storage, StorageError};
use crate::worker::{self, WorkerError, WorkerOptions, WorkerSummary};

/// Errors of the commands, each with the stage it came from.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CommandError {
    #[error(transparent)]
    Db(#[from] DbError),
    #[error(transparent)]
    Queue(#[from] QueueError),
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Enqueue(#[from] EnqueueError),
    #[error(transparent)]
    Worker(#[from] WorkerError),
    #[error(transparent)]
    Calibrate(#[from] crate::calibrate::CalibrateError),
    #[error("cannot {what}")]
    Io { what: &'static str, source: std::io::Error },
}

/// Creates the database (if missing), applies migrations, declares the queue topology and creates
/// the bucket. Idempotent.
pub async fn migrate(cfg: &Config) -> Result<(), CommandError> {
    let db = Db::connect(&cfg.database).await?;
    db.migrate().await?;
    let conn = queue::connect(&cfg.amqp, "voxbatch migrate").await?;
    let channel = conn.create_channel().await.map_err(|source| QueueError::Amqp { op: "channel.open", source })?;
    queue::declare_topology(&channel, &cfg.amqp).await?;
    let _ = conn.close(200, "done".into()).await;
    let storage = Storage::open(&cfg.storage).await?;
    storage.ensure_ready(cfg.storage.create_bucket).await?;
    Ok(())
}

/// What `enqueue` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnqueueSummary {
    pub enqueued: usize,
    /// Jobs per campaign.
    pub campaigns: BTreeMap<String, usize>,
}

/// Validates every line of `path`, then publishes all jobs with publisher confirms.
/// `progress(total, confirmed)` is called as confirms arrive.
pub async fn enqueue(
    cfg: &Config,
    path: &Path,
    defaults: &LineDefaults,
    mut progress: impl FnMut(usize, usize),
) -> Result<EnqueueSummary, CommandError> {
    let jobs = read_jobs(path, defaults, &cfg.limits)?;
    let total = jobs.len();
    progress(total, 0);
    publish_with_retry(cfg, &jobs, |done| progress(total, done)).await?;
    let mut campaigns = BTreeMap::new();
    for j in &jobs {
        *campaigns.entry(j.campaign.clone()).or_insert(0) += 1;
    }
    Ok(EnqueueSummary { enqueued: total, campaigns })
}

/// Publishes `jobs` with confirms, reconnecting with backoff when the broker goes away (e.g. a
/// restart): the jobs after the last confirmed window are published again. A job published twice
/// is harmless (its job_id makes it idempotent); none is dropped. Gives up after
/// `amqp.reconnect_max` × 10 without progress.
pub async fn publish_with_retry(cfg: &Config, jobs: &[crate::job::Job], mut progress: impl FnMut(usize)) -> Result<(), CommandError> {
    let mut confirmed = 0;
    let mut failures = 0u32;
    let mut last_progress = std::time::Instant::now();
    loop {
        let start = confirmed;
        let attempt: Result<(), QueueError> = async {
            let conn = queue::connect(&cfg.amqp, "voxbatch enqueue").await?;
            let publisher = Publisher::new(&conn, &cfg.amqp).await?;
            let result = publisher
                .publish(&jobs[start..], |n| {
                    confirmed = start + n;
                    progress(confirmed);
                })
                .await;
            let _ = conn.close(200, "done".into()).await;
            result
        }
        .await;
        match attempt {
            Ok(()) => return Ok(()),
            Err(e) => {
                if confirmed > start {
                    last_progress = std::time::Instant::now();
                    failures = 0;
                }
                if last_progress.elapsed() > cfg.amqp.reconnect_max * 10 {
                    return Err(e.into());
                }
                let wait = (cfg.amqp.reconnect_min * 2u32.pow(failures.min(6))).min(cfg.amqp.reconnect_max);
                tracing::warn!(error = %e, confirmed, total = jobs.len(), retry_in_ms = wait.as_millis() as u64,
                    "publishing interrupted; reconnecting and publishing the unconfirmed jobs again");
                failures += 1;
                tokio::time::sleep(wait).await;
            }
        }
    }
}

/// Queue depths and job counts.
#[derive(Debug, Clone)]
pub struct Status {
    pub queue: String,
    pub ready: u32,
    pub dead_letter_queue: String,
    pub dead: u32,
    pub jobs_by_status: Vec<(String, i64)>,
}

pub async fn status(cfg: &Config) -> Result<Status, CommandError> {
    let conn = queue::connect(&cfg.amqp, "voxbatch status").await?;
    let channel = conn.create_channel().await.map_err(|source| QueueError::Amqp { op: "channel.open", source })?;
    let (ready, dead) = queue::queue_depths(&channel, &cfg.amqp).await?;
    let _ = conn.close(200, "done".into()).await;
    let db = Db::connect(&cfg.database).await?;
    let jobs_by_status = db.jobs_by_status(None).await?;
    Ok(Status {
        queue: cfg.amqp.queue.clone(),
        ready,
        dead_letter_queue: cfg.amqp.dead_letter_queue.clone(),
        dead,
        jobs_by_status,
    })
}

/// Loads the model and runs a worker until `shutdown` (or, with `drain`, until the queue is empty).
pub async fn work(
    cfg: &Config,
    opts: WorkerOptions,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<WorkerSummary, CommandError> {
    let db = Db::connect(&cfg.database).await?;
    db.migrate().await?;
    let storage = Storage::open(&cfg.storage).await?;
    storage.ensure_ready(cfg.storage.create_bucket).await?;
    let m = &cfg.model;
    let model = ModelHandle::load(&m.dir, m.device, m.precision, m.cpu_threads).await?;
    Ok(worker::run(cfg.clone(), model, db, storage, opts, shutdown).await?)
}

/// Runs one worker per device (× `per_device`) in this process, each with its own model, CUDA
/// device, calibration profile, NVML sampler and `workers` row, all against the same queue.
/// `shutdown` stops them all (each finishes its batch in progress); with `drain` each exits when
/// the queue is empty.
pub async fn work_many(
    cfg: &Config,
    devices: &[crate::model::Device],
    per_device: usize,
    opts: WorkerOptions,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<Vec<WorkerSummary>, CommandError> {
    let db = Db::connect(&cfg.database).await?;
    db.migrate().await?;
    let storage = Storage::open(&cfg.storage).await?;
    storage.ensure_ready(cfg.storage.create_bucket).await?;
    let stop = tokio_util::sync::CancellationToken::new();
    let base_id = opts.worker_id.clone().or_else(|| cfg.worker.id.clone()).unwrap_or_else(|| {
        format!("{}-{}-{}", crate::db::hostname(), std::process::id(), &uuid::Uuid::new_v4().simple().to_string()[..8])
    });
    let mut runs = Vec::new();
    for &device in devices {
        for k in 0..per_device.max(1) {
            let mut c = cfg.clone();
            c.model.device = device;
            let model = ModelHandle::load(&c.model.dir, device, c.model.precision, c.model.cpu_threads).await?;
            let o = WorkerOptions { drain: opts.drain, worker_id: Some(format!("{base_id}-{}-{k}", device.to_string().replace(':', ""))) };
            let (db, storage, stop) = (db.clone(), storage.clone(), stop.clone());
            runs.push(tokio::spawn(async move { worker::run(c, model, db, storage, o, async move { stop.cancelled().await }).await }));
        }
    }
    let watcher = {
        let stop = stop.clone();
        async move {
            shutdown.await;
            stop.cancel();
        }
    };
    let all = futures::future::join_all(runs);
    tokio::pin!(all);
    tokio::pin!(watcher);
    let results = tokio::select! {
        r = &mut all => r,
        _ = &mut watcher => all.await,
    };
    results
        .into_iter()
        .map(|r| r.map_err(|e| WorkerError::Stage(format!("worker task: {e}")))?.map_err(CommandError::from))
        .collect()
}

/// `all` (every CUDA device libtorch sees) or a comma-separated list of indices (`0,1`), or `cpu`.
pub fn parse_devices(spec: &str) -> Result<Vec<crate::model::Device>, String> {
    use crate::model::Device;
    match spec.trim() {
        "all" => {
            let n = tch::Cuda::device_count();
            if n <= 0 {
                return Err("--devices all: libtorch sees no CUDA device".into());
            }
            Ok((0..n as usize).map(Device::Cuda).collect())
        }
        "cpu" => Ok(vec![Device::Cpu]),
        list => list
            .split(',')
            .map(|p| {
                let p = p.trim();
                p.parse::<usize>().map(Device::Cuda).or_else(|_| p.parse::<Device>())
            })
            .collect(),
    }
}

/// Calibrates the configured model on the configured device and precision, saves the profile
/// under `memory.calibration_dir`, and records it in Postgres unless `record` is false.
pub async fn calibrate(
    cfg: &Config,
    opts: &crate::calibrate::CalibrateOptions,
    record: bool,
    progress: impl FnMut(&crate::batch::memory::CalibrationPoint),
) -> Result<(crate::batch::memory::Profile, std::path::PathBuf), CommandError> {
    let m = &cfg.model;
    let model = ModelHandle::load(&m.dir, m.device, m.precision, m.cpu_threads).await?;
    let profile = crate::calibrate::calibrate(&model, opts, progress).await?;
    let path = profile
        .save(&cfg.memory.calibration_dir)
        .map_err(|source| CommandError::Io { what: "write calibration profile", source })?;
    if record {
        let db = Db::connect(&cfg.database).await?;
        db.migrate().await?;
        db.record_calibration(&profile).await?;
    }
    Ok((profile, path))
}

/// Runs the policy benchmark with the configured model, device and memory settings; writes the
/// results under `out_root/policy-<timestamp>/`.
pub async fn bench_policy(
    cfg: &Config,
    jobs: usize,
    seed: u64,
    policy_only: bool,
    out_root: &Path,
    progress: impl FnMut(&crate::bench::policy::RunResult),
) -> Result<(crate::bench::policy::PolicyReport, Vec<std::path::PathBuf>), CommandError> {
    let m = &cfg.model;
    let model = ModelHandle::load(&m.dir, m.device, m.precision, m.cpu_threads).await?;
    let manifest = model.manifest().clone();
    let admission = worker::memory_admission(cfg, &manifest, m.device, m.precision)?;
    let gpu = crate::gpu::memory_info(m.device).map(|i| i.name).unwrap_or_else(|_| m.device.to_string());
    let source = match crate::batch::memory::Profile::load_matching(&cfg.memory.calibration_dir, &manifest.name, &gpu, &m.precision.to_string()) {
        Ok(Some(p)) => format!("calibrated {} (R² {:.4}, worst error {:.1}%)", p.created_at, p.fit.r2, p.fit.worst_rel_error * 100.0),
        _ => "built-in (no calibration)".to_string(),
    };
    let opts = crate::bench::policy::PolicyBenchOptions {
        jobs,
        seed,
        max_batch: cfg.batching.max_batch,
        gpu_name: gpu,
        profile_source: source,
        max_length_ratio: cfg.batching.max_length_ratio,
        policy_only,
    };
    let report = crate::bench::policy::run(&model, admission, &opts, progress).await;
    let dir = crate::bench::results_dir(out_root, "policy").map_err(|source| CommandError::Io { what: "create results dir", source })?;
    let paths = crate::bench::policy::write(&report, &dir).map_err(|source| CommandError::Io { what: "write results", source })?;
    Ok((report, paths))
}

/// What `audit` found for a campaign: done rows against stored objects.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Audit {
    pub campaign: String,
    pub done_rows: usize,
    pub objects: usize,
    /// Done rows whose object is missing.
    pub missing_objects: Vec<String>,
    /// Objects with no done row (e.g. uploaded before a crash, then never committed).
    pub orphan_objects: Vec<String>,
}

/// Checks that every `done` job of `campaign` has its audio object and lists objects no done row
/// points to.
pub async fn audit(cfg: &Config, campaign: &str) -> Result<Audit, CommandError> {
    let db = Db::connect(&cfg.database).await?;
    let storage = Storage::open(&cfg.storage).await?;
    let keys: Vec<String> = sqlx::query_scalar("SELECT s3_key FROM jobs WHERE status = 'done' AND campaign = $1 AND s3_key IS NOT NULL")
        .bind(campaign)
        .fetch_all(db.pool())
        .await
        .map_err(|source| DbError::Query { context: "audit", source })?;
    let prefix = format!("{}{campaign}/", cfg.storage.key_prefix);
    let objects: std::collections::BTreeSet<String> = storage.list(&prefix).await?.into_iter().collect();
    let rows: std::collections::BTreeSet<String> = keys.into_iter().collect();
    Ok(Audit {
        campaign: campaign.to_string(),
        done_rows: rows.len(),
        objects: objects.len(),
        missing_objects: rows.difference(&objects).cloned().collect(),
        orphan_objects: objects.difference(&rows).cloned().collect(),
    })
}
