//! `voxbatch demo`: migrate, enqueue the sample corpus, drain it with a worker, then what a user
//! wants to see in the morning: what was done, where the audio is, the report by campaign (and by
//! stage for text models), and the bill in one line.

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
    /// Text models: the report by stage (LLM, token2wav).
    pub stages: Option<Report>,
    /// URLs of the audio (all of them; print a few).
    pub audio_urls: Vec<String>,
    /// Where the campaign's audio lives.
    pub audio_prefix: String,
    /// The model the worker ran.
    pub model_dir: std::path::PathBuf,
}

impl std::fmt::Display for DemoSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use crate::report::Render;
        writeln!(f, "enqueued {} job(s) (jobs of an earlier demo run are acked as already done)", self.enqueued)?;
        writeln!(f, "worker drained the queue: {} batch(es), {} job(s), {:.1} s of audio", self.worker.batches, self.worker.jobs_done, self.worker.audio_seconds)?;
        writeln!(f, "\nby campaign:")?;
        write!(f, "{}", self.report.text())?;
        if let Some(stages) = &self.stages {
            writeln!(f, "\nby stage (each stage's device time and cost over the jobs it served):")?;
            write!(f, "{}", stages.text())?;
        }
        if let Some(t) = self.report.total.as_ref().or(self.report.rows.first()) {
            match (t.cost_usd, t.usd_per_million_chars) {
                (Some(cost), Some(per_million)) => writeln!(
                    f,
                    "\ncost: ${cost:.6} for {} job(s), {} characters, {:.1} s of audio — ${per_million:.2} per million characters at this device's price ([cost] prices)",
                    t.jobs,
                    t.chars,
                    t.audio_hours * 3600.0
                )?,
                _ => writeln!(f, "\ncost: not priced (set [cost] prices for this device)")?,
            }
        }
        writeln!(f, "\naudio: {} file(s) under {}", self.audio_urls.len(), self.audio_prefix)?;
        for url in self.audio_urls.iter().take(8) {
            writeln!(f, "  {url}")?;
        }
        if self.audio_urls.len() > 8 {
            writeln!(f, "  … (`voxbatch audit --campaign` checks each against its row; Postgres `jobs.s3_key` names each job's)")?;
        }
        // The bundled models have random weights (no weights can be downloaded): say so.
        if let Some(family) = ["cosyvoice2", "cosyvoice3"].into_iter().find(|m| self.model_dir.ends_with(format!("{m}-tiny"))) {
            let checkpoint = if family == "cosyvoice2" { "CosyVoice2" } else { "Fun-CosyVoice3-0.5B" };
            writeln!(f, "({family}-tiny has random weights: its audio is noise of the right length, not speech; convert your {checkpoint} checkpoint for speech)")?;
        } else if self.model_dir.file_name().is_some_and(|n| n.to_string_lossy().starts_with("reference-")) {
            writeln!(f, "(the reference model's audio is not speech: it has the compute shape of a TTS network, random weights)")?;
        }
        Ok(())
    }
}

/// Runs the demo for `campaign` on `corpus`.
pub async fn demo(cfg: &Config, corpus: &Path, campaign: &str, shutdown: impl Future<Output = ()> + Send) -> Result<DemoSummary, CommandError> {
    migrate(cfg).await?;
    let defaults = LineDefaults { campaign: Some(campaign.to_string()), ..LineDefaults::default() };
    let enqueued = enqueue(cfg, corpus, &defaults, 0, std::future::pending(), |_, _| {}).await?.enqueued;
    let opts = WorkerOptions { drain: true, worker_id: None };
    let mut workers = work(cfg, &[cfg.model.device], 1, opts, shutdown).await?;
    let worker = workers.pop().unwrap_or_default();
    let stages = match report(cfg, Dimension::Stage, None, Some(campaign)).await? {
        r if r.rows.is_empty() => None,
        r => Some(r),
    };
    let report = report(cfg, Dimension::Campaign, None, Some(campaign)).await?;
    let storage = Storage::open(&cfg.storage).await?;
    let prefix = storage.campaign_prefix(campaign);
    let audio_urls = storage.list(&prefix).await?.iter().map(|k| storage.url(k)).collect();
    Ok(DemoSummary { enqueued, worker, report, stages, audio_urls, audio_prefix: storage.url(&prefix), model_dir: cfg.model.dir.clone() })
}
