//! `voxbatch demo`: migrate, enqueue the sample corpus, drain it with a worker, report.

use std::future::Future;
use std::path::Path;

use super::{enqueue, migrate, report, work, CommandError};
use crate::config::Config;
use crate::enqueue::LineDefaults;
use crate::report::{Dimension, Report};
use crate::storage::Storage;
use crate::worker::{WorkerOptions, WorkerSummary};

/// What the demo did.
#[derive(Debug)]
pub struct DemoSummary {
    pub enqueued: usize,
    pub worker: WorkerSummary,
    pub report: Report,
    /// URLs of the audio (all of them; print a few).
    pub audio_urls: Vec<String>,
    /// Where the campaign's audio lives.
    pub audio_prefix: String,
}

/// Runs the demo for `campaign` on `corpus`.
pub async fn demo(cfg: &Config, corpus: &Path, campaign: &str, shutdown: impl Future<Output = ()> + Send) -> Result<DemoSummary, CommandError> {
    migrate(cfg).await?;
    let defaults = LineDefaults { campaign: Some(campaign.to_string()), ..LineDefaults::default() };
    let enqueued = enqueue(cfg, corpus, &defaults, 0, std::future::pending(), |_, _| {}).await?.enqueued;
    let opts = WorkerOptions { drain: true, worker_id: None };
    let mut workers = work(cfg, &[cfg.model.device], 1, opts, shutdown).await?;
    let worker = workers.pop().unwrap_or_default();
    let report = report(cfg, Dimension::Campaign, None, Some(campaign)).await?;
    let storage = Storage::open(&cfg.storage).await?;
    let prefix = storage.campaign_prefix(campaign);
    let audio_urls = storage.list(&prefix).await?.iter().map(|k| storage.url(k)).collect();
    Ok(DemoSummary { enqueued, worker, report, audio_urls, audio_prefix: storage.url(&prefix) })
}
