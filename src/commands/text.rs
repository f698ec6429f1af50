//! `voxbatch text FILE|-`: the dry run of the text frontend, before any GPU time is bought. Reads
//! jobs as `enqueue` reads them (`.txt`: a job a line; `.jsonl`: a job object a line; `-`: standard
//! input, JSON lines when its first line is an object) and prints, per job, the normalised text,
//! its segments with their token counts, the estimated audio length and cost, and the totals.
//! The frontend is the worker's own (`frontend::Frontend`), so what it prints is what the LLM gets.
//!
//! Estimates, stated in the output: audio length from the normalised text's characters at
//! `[frontend]` speaking rates, divided by the job's `speed`; GPU time at `[frontend]
//! estimate_audio_seconds_per_gpu_second` of the audio at speed 1 (speed changes the audio's
//! length, hardly the work); price from `[cost]` for the named GPU.
//!
//! Neighbours: `frontend` (the work), `enqueue` (the file format), `cost::Prices`.

use std::io::Read;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::CommandError;
use crate::config::Config;
use crate::enqueue::{read_jobs, LineDefaults};
use crate::frontend::segment::{Lang, SegmentLimits};
use crate::frontend::{Frontend, SpeakingRates};
use crate::model::Device;

#[derive(Debug, Clone, Serialize)]
pub struct SegmentPreview {
    pub text: String,
    pub tokens: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct JobPreview {
    pub job_id: String,
    pub campaign: String,
    pub chars: usize,
    pub normalized: String,
    pub lang: Option<Lang>,
    pub segments: Vec<SegmentPreview>,
    /// The job's `speed` (none: 1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub speed: Option<f64>,
    pub audio_seconds: f64,
    pub cost_usd: f64,
    /// Why the worker would refuse the job (its text says nothing once normalised, …).
    pub error: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct TextTotals {
    pub jobs: usize,
    pub refused: usize,
    pub chars: usize,
    pub segments: usize,
    pub tokens: usize,
    pub audio_seconds: f64,
    pub gpu_seconds: f64,
    pub cost_usd: f64,
    pub usd_per_million_chars: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct TextReport {
    pub model: String,
    pub gpu: String,
    pub hourly_usd: f64,
    /// How the estimates were made.
    pub assumptions: String,
    pub jobs: Vec<JobPreview>,
    pub totals: TextTotals,
}

/// Runs the frontend of `model_dir` over the jobs of `input` (`-`: standard input), pricing GPU
/// time as `gpu` (a `[cost] gpu_hourly_usd` key, e.g. "H200"). Blocking.
pub fn text_dry_run(cfg: &Config, model_dir: &Path, input: &Path, defaults: &LineDefaults, gpu: &str) -> Result<TextReport, CommandError> {
    let f = &cfg.frontend;
    let rates = SpeakingRates::from_config(f);
    let threads = f.threads();
    let frontend =
        Frontend::load_for_threads(model_dir, SegmentLimits::from_config(cfg), threads).map_err(|e| CommandError::Usage(e.to_string()))?;
    let stdin_copy;
    let path = if input == Path::new("-") {
        stdin_copy = StdinCopy::read()?;
        stdin_copy.0.as_path()
    } else {
        input
    };
    let jobs = read_jobs(path, defaults, &cfg.limits)?;
    let hourly_usd = cfg.cost.prices.hourly(Device::Cuda(0), Some(gpu));
    let usd_per_audio_second = hourly_usd / 3600.0 / f.estimate_audio_seconds_per_gpu_second;
    let mut totals = TextTotals::default();
    // Audio-seconds at speed 1: what the GPU does (a job's `speed` changes its audio's length,
    // hardly the work — the LLM and the flow run on the same tokens).
    let mut work_seconds = 0.0;
    let mut previews = Vec::with_capacity(jobs.len());
    let prepared = frontend.prepare_all(&jobs.iter().map(|j| j.text.as_str()).collect::<Vec<_>>(), threads);
    for (job, prepared) in jobs.into_iter().zip(prepared) {
        let chars = job.text.chars().count();
        totals.jobs += 1;
        totals.chars += chars;
        let mut p = JobPreview {
            job_id: job.job_id.to_string(),
            campaign: job.campaign.clone(),
            chars,
            normalized: String::new(),
            lang: None,
            segments: Vec::new(),
            speed: job.speed,
            audio_seconds: 0.0,
            cost_usd: 0.0,
            error: None,
        };
        match prepared {
            Ok(prep) => {
                let work = rates.audio_seconds(&prep.normalized, prep.lang);
                p.audio_seconds = work / job.speed.unwrap_or(1.0);
                p.cost_usd = work * usd_per_audio_second;
                work_seconds += work;
                p.segments = prep.segments.iter().map(|s| SegmentPreview { text: s.text.clone(), tokens: s.tokens.len() }).collect();
                totals.segments += p.segments.len();
                totals.tokens += p.segments.iter().map(|s| s.tokens).sum::<usize>();
                totals.audio_seconds += p.audio_seconds;
                totals.cost_usd += p.cost_usd;
                p.normalized = prep.normalized;
                p.lang = Some(prep.lang);
            }
            Err(e) if e.is_input() => {
                totals.refused += 1;
                p.error = Some(e.to_string());
            }
            Err(e) => return Err(CommandError::Usage(e.to_string())),
        }
        previews.push(p);
    }
    totals.gpu_seconds = work_seconds / f.estimate_audio_seconds_per_gpu_second;
    totals.usd_per_million_chars = if totals.chars > 0 { totals.cost_usd / totals.chars as f64 * 1e6 } else { 0.0 };
    Ok(TextReport {
        model: model_dir.display().to_string(),
        gpu: gpu.to_string(),
        hourly_usd,
        assumptions: format!(
            "audio length: normalised characters at {} (zh) / {} (other) per second, over the job's speed; GPU time at {} audio-seconds (at speed 1) per GPU-second; {gpu} at ${hourly_usd:.2}/hour",
            f.zh_chars_per_second, f.en_chars_per_second, f.estimate_audio_seconds_per_gpu_second
        ),
        jobs: previews,
        totals,
    })
}

/// Standard input saved to a temporary job file (`.jsonl` when its first line is an object),
/// removed when dropped.
struct StdinCopy(PathBuf);

impl StdinCopy {
    fn read() -> Result<StdinCopy, CommandError> {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text).map_err(|source| CommandError::Io { what: "read standard input", source })?;
        let jsonl = text.lines().find(|l| !l.trim().is_empty()).is_some_and(|l| l.trim_start().starts_with('{'));
        let path = std::env::temp_dir().join(format!("voxbatch-text-{}.{}", uuid::Uuid::new_v4(), if jsonl { "jsonl" } else { "txt" }));
        std::fs::write(&path, text).map_err(|source| CommandError::Io { what: "write a temporary job file", source })?;
        Ok(StdinCopy(path))
    }
}

impl Drop for StdinCopy {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The human-readable report: per job its normalised text and segments, then the totals.
pub fn text_table(r: &TextReport) -> String {
    let mut s = String::new();
    for j in &r.jobs {
        s += &format!("job {} ({}, {} chars)\n", j.job_id, j.campaign, j.chars);
        if let Some(e) = &j.error {
            s += &format!("  refused: {e}\n\n");
            continue;
        }
        s += &format!("  normalised: {}\n", j.normalized);
        for (i, seg) in j.segments.iter().enumerate() {
            s += &format!("  segment {:>3} ({:>3} tokens): {}\n", i + 1, seg.tokens, seg.text);
        }
        let speed = j.speed.map(|v| format!(" at speed {v}")).unwrap_or_default();
        s += &format!("  ≈ {:.1} s of audio{speed}, ≈ ${:.6}\n\n", j.audio_seconds, j.cost_usd);
    }
    let t = &r.totals;
    s += &format!(
        "{} jobs ({} refused), {} characters, {} segments, {} text tokens\n≈ {:.1} audio-hours, ≈ {:.2} GPU-hours, ≈ ${:.2} (${:.2} per million characters)\nestimates — {}\n",
        t.jobs,
        t.refused,
        t.chars,
        t.segments,
        t.tokens,
        t.audio_seconds / 3600.0,
        t.gpu_seconds / 3600.0,
        t.cost_usd,
        t.usd_per_million_chars,
        r.assumptions
    );
    s
}
