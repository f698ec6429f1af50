//! `voxbatch enqueue FILE`: validate a job file, then publish its jobs with confirms.
//!
//! The file is read twice, streaming (validate + hash, then publish), on a blocking thread that
//! hands jobs over in chunks. A broker restart is ridden out (unconfirmed jobs published again);
//! an interrupt stops after the confirms in flight and says how many were published and the exact
//! command that resumes. A broker that stays unreachable for `amqp.publish_give_up` ends the run
//! with an error that says how many were published. Ids of lines without one are derived from the file, so running the same command again
//! publishes the same ids: jobs already done are acked without synthesis.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::Path;
use std::time::Instant;

use tokio::sync::mpsc;

use super::CommandError;
use crate::config::Config;
use crate::enqueue::{JobFile, LineDefaults};
use crate::job::{escape_controls, Job};
use crate::report::Render;
use crate::queue::{self, Publisher, QueueError};
use crate::worker::retry::{backoff, Transience};

/// Jobs handed from the reading thread to the publisher at a time.
const CHUNK: usize = 1024;

/// What `enqueue` did.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct EnqueueSummary {
    /// The job file.
    pub file: String,
    /// The queue the jobs went to.
    pub queue: String,
    /// Jobs in the file.
    pub total: usize,
    /// Jobs skipped at the start (`--skip`).
    pub skipped: usize,
    /// Jobs published and confirmed by this run.
    pub enqueued: usize,
    /// Jobs per campaign (of those published).
    pub campaigns: BTreeMap<String, usize>,
    /// Seconds the run took.
    pub seconds: f64,
    /// True when an interrupt stopped the run early.
    pub interrupted: bool,
    /// The command that publishes the rest, when interrupted (the binary fills it in from its own
    /// arguments: [`crate::enqueue::resume_command`]).
    pub resume_command: Option<String>,
}

impl EnqueueSummary {
    /// Jobs of the file published so far, this run's and the skipped ones: what `--skip` resumes at.
    pub fn published(&self) -> usize {
        self.skipped + self.enqueued
    }

    /// What an interrupted run says on standard error: how many are published, the exact command
    /// that publishes the rest.
    pub fn interrupted_text(&self) -> String {
        let done = self.published();
        let resume = self.resume_command.clone().unwrap_or_else(|| format!("voxbatch enqueue {} --skip {done} (with the same flags)", escape_controls(&self.file)));
        format!(
            "interrupted: {done} of {} job(s) of {} are published. Resume with `{resume}` \
             (or run the same command again without --skip: job ids are derived from the file, so nothing is synthesized twice)\n",
            self.total,
            escape_controls(&self.file),
        )
    }
}

impl Render for EnqueueSummary {
    fn text(&self) -> String {
        let campaigns: Vec<String> = self.campaigns.iter().map(|(c, n)| format!("{} ({n})", escape_controls(c))).collect();
        format!(
            "enqueued {} job(s) to {} in {:.1}s{}, campaign: {}\n",
            self.enqueued,
            self.queue,
            self.seconds,
            if self.skipped > 0 { format!(" (skipped the first {})", self.skipped) } else { String::new() },
            campaigns.join(", ")
        )
    }
}

/// Validates every line of `path`, then publishes its jobs (after the first `skip`) with
/// publisher confirms until done or `shutdown` resolves. `progress(total, confirmed)` is called
/// as confirms arrive.
pub async fn enqueue(
    cfg: &Config,
    path: &Path,
    defaults: &LineDefaults,
    skip: usize,
    shutdown: impl Future<Output = ()>,
    mut progress: impl FnMut(usize, usize),
) -> Result<EnqueueSummary, CommandError> {
    let started = Instant::now();
    let (p, d, l) = (path.to_path_buf(), defaults.clone(), cfg.limits.clone());
    let file = tokio::task::spawn_blocking(move || JobFile::scan(&p, &d, &l)).await.map_err(|e| CommandError::Usage(format!("reader stopped: {e}")))??;
    for (line, why) in &file.left_out {
        tracing::warn!(file = %path.display(), line, "line {line} not enqueued: {why}; the other lines are");
    }
    let total = file.jobs;
    let source = file.sha256.clone();
    // What this run published per campaign, recorded for `status --campaign` (its ETA needs the
    // campaign's size before workers claim the jobs). Bookkeeping only: without Postgres the jobs
    // are still published, and a warning says the progress figures will lack them.
    let bookkeeping = match super::open_db(cfg).await {
        Ok(db) => Some(db),
        Err(e) => {
            tracing::warn!(error = %crate::worker::error_chain(&e), "Postgres unreachable: publishing anyway; `status --campaign` will not count these jobs until workers claim them");
            None
        }
    };
    // Characters this run published per campaign (its jobs are `summary.campaigns`).
    let mut chars_by_campaign: BTreeMap<String, i64> = BTreeMap::new();
    let mut summary = EnqueueSummary {
        file: path.display().to_string(),
        queue: cfg.amqp.queue.clone(),
        total,
        skipped: skip.min(total),
        enqueued: 0,
        campaigns: BTreeMap::new(),
        seconds: 0.0,
        interrupted: false,
        resume_command: None,
    };
    progress(total, summary.skipped);

    let (tx, mut rx) = mpsc::channel::<Vec<Job>>(2);
    let reader = tokio::task::spawn_blocking(move || {
        let mut chunk = Vec::with_capacity(CHUNK);
        let mut seen = 0;
        file.read(|job| {
            seen += 1;
            if seen <= skip {
                return true;
            }
            chunk.push(job);
            if chunk.len() == CHUNK {
                return tx.blocking_send(std::mem::replace(&mut chunk, Vec::with_capacity(CHUNK))).is_ok();
            }
            true
        })?;
        if !chunk.is_empty() {
            let _ = tx.blocking_send(chunk);
        }
        Ok::<(), crate::enqueue::EnqueueError>(())
    });

    tokio::pin!(shutdown);
    let mut stop = false;
    while let Some(chunk) = rx.recv().await {
        let base = summary.published();
        let mut confirmed = 0;
        let published = match publish_with_retry(cfg, &chunk, &mut stop, &mut shutdown, |n| {
            confirmed = n;
            progress(total, base + n)
        })
        .await
        {
            Ok(n) => n,
            Err(e) => return Err(CommandError::EnqueueStopped { published: base + confirmed, total, source: Box::new(e) }),
        };
        let mut touched = std::collections::BTreeSet::new();
        for j in &chunk[..published] {
            *summary.campaigns.entry(j.campaign.clone()).or_insert(0) += 1;
            *chars_by_campaign.entry(j.campaign.clone()).or_insert(0) += j.chars() as i64;
            touched.insert(j.campaign.as_str());
        }
        if let Some(db) = &bookkeeping {
            for campaign in touched {
                let (jobs, chars) = (summary.campaigns[campaign] as i64, chars_by_campaign[campaign]);
                if let Err(e) = db.record_enqueued(campaign, &source, skip.min(i32::MAX as usize) as i32, jobs, chars).await {
                    tracing::warn!(error = %crate::worker::error_chain(&e), campaign, "could not record the published jobs for `status --campaign`");
                }
            }
        }
        summary.enqueued += published;
        if stop {
            summary.interrupted = true;
            break;
        }
    }
    drop(rx);
    reader.await.map_err(|e| CommandError::Usage(format!("reader stopped: {e}")))??;
    summary.seconds = started.elapsed().as_secs_f64();
    Ok(summary)
}

/// Publishes `jobs` with confirms, reconnecting with back-off when the broker goes away (e.g. a
/// restart): the jobs after the last confirmed window are published again (a job published twice
/// is harmless: its id makes it idempotent). Returns how many are confirmed: all of them, or
/// fewer when `shutdown` resolved (then `stop` is set). Gives up after `amqp.publish_give_up`
/// without a confirm ([`CommandError::GaveUp`]), or at once on a permanent error.
pub async fn publish_with_retry(
    cfg: &Config,
    jobs: &[Job],
    stop: &mut bool,
    shutdown: &mut std::pin::Pin<&mut impl Future<Output = ()>>,
    mut progress: impl FnMut(usize),
) -> Result<usize, CommandError> {
    let mut confirmed = 0;
    let mut failures = 0u32;
    let mut last_progress = Instant::now();
    while confirmed < jobs.len() && !*stop {
        let start = confirmed;
        let attempt: Result<(), QueueError> = async {
            let conn = queue::connect(&cfg.amqp, "voxbatch enqueue").await?;
            let publisher = Publisher::new(&conn, &cfg.amqp).await?;
            let result = publisher
                .publish_until(&jobs[start..], stop, shutdown, |n| {
                    confirmed = start + n;
                    progress(confirmed);
                })
                .await;
            let _ = conn.close(200, "done".into()).await;
            result
        }
        .await;
        let Err(e) = attempt else { continue };
        if e.is_permanent() {
            return Err(e.into());
        }
        if confirmed > start {
            last_progress = Instant::now();
            failures = 0;
        }
        let give_up = cfg.amqp.publish_give_up;
        let left = give_up.saturating_sub(last_progress.elapsed());
        if left.is_zero() {
            return Err(CommandError::GaveUp { service: "RabbitMQ", key: "amqp.publish_give_up", after: humantime::format_duration(give_up).to_string(), source: Box::new(e.into()) });
        }
        let wait = backoff(failures, cfg.amqp.reconnect_min, cfg.amqp.reconnect_max).min(left);
        tracing::warn!(error = %e, confirmed, total = jobs.len(), retry_in_ms = wait.as_millis() as u64, gives_up_in_s = left.as_secs(),
            "publishing interrupted; reconnecting and publishing the unconfirmed jobs again (giving up after amqp.publish_give_up without a confirm)");
        failures += 1;
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.as_mut() => *stop = true,
        }
    }
    Ok(confirmed)
}
