//! `voxbatch enqueue FILE`: validate a job file, then publish its jobs with confirms.
//!
//! The file is read twice, streaming (validate + hash, then publish), on a blocking thread that
//! hands jobs over in chunks. A broker restart is ridden out (unconfirmed jobs published again);
//! an interrupt stops after the confirms in flight and says how many were published and how to
//! resume. Ids of lines without one are derived from the file, so running the same command again
//! publishes the same ids: jobs already done are acked without synthesis.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::Path;
use std::time::Instant;

use tokio::sync::mpsc;

use super::CommandError;
use crate::config::Config;
use crate::enqueue::{JobFile, LineDefaults};
use crate::job::Job;
use crate::queue::{self, Publisher, QueueError};
use crate::worker::retry::{backoff, Transience};

/// Jobs handed from the reading thread to the publisher at a time.
const CHUNK: usize = 1024;

/// What `enqueue` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnqueueSummary {
    /// Jobs in the file.
    pub total: usize,
    /// Jobs skipped at the start (`--skip`).
    pub skipped: usize,
    /// Jobs published and confirmed by this run.
    pub enqueued: usize,
    /// Jobs per campaign (of those published).
    pub campaigns: BTreeMap<String, usize>,
    /// True when an interrupt stopped the run early.
    pub interrupted: bool,
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
    let mut summary = EnqueueSummary { total, skipped: skip.min(total), enqueued: 0, campaigns: BTreeMap::new(), interrupted: false };
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
        let base = summary.skipped + summary.enqueued;
        let published = publish_with_retry(cfg, &chunk, &mut stop, &mut shutdown, |n| progress(total, base + n)).await?;
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
    Ok(summary)
}

/// Publishes `jobs` with confirms, reconnecting with back-off when the broker goes away (e.g. a
/// restart): the jobs after the last confirmed window are published again (a job published twice
/// is harmless: its id makes it idempotent). Returns how many are confirmed: all of them, or
/// fewer when `shutdown` resolved (then `stop` is set). Gives up after `amqp.reconnect_max` × 10
/// without progress, or at once on a permanent error.
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
        if last_progress.elapsed() > cfg.amqp.reconnect_max * 10 {
            return Err(e.into());
        }
        let wait = backoff(failures, cfg.amqp.reconnect_min, cfg.amqp.reconnect_max);
        tracing::warn!(error = %e, confirmed, total = jobs.len(), retry_in_ms = wait.as_millis() as u64,
            "publishing interrupted; reconnecting and publishing the unconfirmed jobs again");
        failures += 1;
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.as_mut() => *stop = true,
        }
    }
    Ok(confirmed)
}
