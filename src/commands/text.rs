//! `voxbatch text FILE|-`: the dry run of the text frontend, before any GPU time is bought. Reads
//! jobs as `enqueue` reads them (`.txt`: a job a line; `.jsonl`: a job object a line; `-`: standard
//! input, read as it comes, JSON lines when its first line is an object) and prints, per job, the
//! normalised text, its segments with their token counts, the estimated audio length and cost,
//! and the totals. A job the worker would refuse (nothing to say once normalised) and a line that
//! is not a job (only whitespace, e.g. U+3000: `enqueue` leaves it out) are reported in their
//! place, with why; only invalid lines, which `enqueue` refuses the input for, stop the dry run.
//! The frontend is the worker's own (`frontend::Frontend`), so what it prints is what the LLM gets.
//!
//! Estimates, stated in the output: audio length from the normalised text's characters at
//! `[frontend]` speaking rates, divided by the job's `speed`; GPU time at `[frontend]
//! estimate_audio_seconds_per_gpu_second` of the audio at speed 1 (speed changes the audio's
//! length, hardly the work); price from `[cost]` for the named GPU.
//!
//! Neighbours: `frontend` (the work), `enqueue` (the file format), `cost::Prices`.

use std::path::Path;

use serde::Serialize;

use super::CommandError;
use crate::config::Config;
use crate::enqueue::{read_lines, EnqueueError, LineDefaults, LineFormat, ReadLine};
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
    /// The line of the input it comes from (1-based).
    pub line: usize,
    /// The id `enqueue` gives the job; none for a line that is not a job.
    pub job_id: Option<String>,
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
    /// Why the worker would refuse the job (its text says nothing once normalised, …), or why
    /// the line is not a job (only whitespace: `enqueue` leaves it out).
    pub error: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct TextTotals {
    pub jobs: usize,
    /// Jobs the worker would refuse.
    pub refused: usize,
    /// Lines that are not jobs (only whitespace), which `enqueue` leaves out.
    pub left_out: usize,
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
    let lines = if input == Path::new("-") {
        read_lines(std::io::stdin().lock(), "standard input", LineFormat::Detect, defaults, &cfg.limits)
    } else {
        let shown = input.display().to_string();
        let format = LineFormat::of_path(input)?;
        let file = std::fs::File::open(input).map_err(|source| EnqueueError::Read { path: shown.clone(), source })?;
        read_lines(file, &shown, format, defaults, &cfg.limits)
    }
    .map_err(|e| match e {
        // enqueue's wording says nothing was enqueued; a dry run enqueues nothing anyway.
        EnqueueError::InvalidLines { path, count, details } => {
            CommandError::Usage(format!("{path}: {count} invalid line(s); `voxbatch enqueue` refuses the input until they are fixed:\n{details}"))
        }
        e => e.into(),
    })?;
    let jobs: Vec<&crate::job::Job> = lines.iter().filter_map(|l| if let ReadLine::Job { job, .. } = l { Some(job) } else { None }).collect();
    let hourly_usd = cfg.cost.prices.hourly(Device::Cuda(0), Some(gpu));
    let usd_per_audio_second = hourly_usd / 3600.0 / f.estimate_audio_seconds_per_gpu_second;
    let mut totals = TextTotals::default();
    // Audio-seconds at speed 1: what the GPU does (a job's `speed` changes its audio's length,
    // hardly the work — the LLM and the flow run on the same tokens).
    let mut work_seconds = 0.0;
    let mut previews = Vec::with_capacity(lines.len());
    let mut prepared = frontend.prepare_all(&jobs.iter().map(|j| j.text.as_str()).collect::<Vec<_>>(), threads).into_iter();
    for line in &lines {
        let (line, job) = match line {
            ReadLine::LeftOut { line, why } => {
                totals.left_out += 1;
                let campaign = defaults.campaign.clone().unwrap_or_else(|| crate::job::DEFAULT_CAMPAIGN.to_string());
                previews.push(JobPreview::left_out(*line, campaign, why));
                continue;
            }
            ReadLine::Job { line, job } => (*line, job),
        };
        let Some(prepared) = prepared.next() else { break };
        let chars = job.text.chars().count();
        totals.jobs += 1;
        totals.chars += chars;
        let mut p = JobPreview {
            line,
            job_id: Some(job.job_id.to_string()),
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

impl JobPreview {
    /// A line that is not a job (`why`), in its place among the jobs.
    fn left_out(line: usize, campaign: String, why: &str) -> JobPreview {
        JobPreview {
            line,
            job_id: None,
            campaign,
            chars: 0,
            normalized: String::new(),
            lang: None,
            segments: Vec::new(),
            speed: None,
            audio_seconds: 0.0,
            cost_usd: 0.0,
            error: Some(format!("{why}; `voxbatch enqueue` leaves it out")),
        }
    }
}

/// The human-readable report: per job its normalised text and segments, then the totals.
pub fn text_table(r: &TextReport) -> String {
    let mut s = String::new();
    for j in &r.jobs {
        match &j.job_id {
            Some(id) => s += &format!("job {id} (line {}, {}, {} chars)\n", j.line, j.campaign, j.chars),
            None => s += &format!("line {}\n", j.line),
        }
        if let Some(e) = &j.error {
            s += &format!("  {}: {e}\n\n", if j.job_id.is_some() { "refused" } else { "left out" });
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
    let left_out = if t.left_out > 0 { format!(", {} line(s) left out", t.left_out) } else { String::new() };
    s += &format!(
        "{} jobs ({} refused){left_out}, {} characters, {} segments, {} text tokens\n≈ {:.1} audio-hours, ≈ {:.2} GPU-hours, ≈ ${:.2} (${:.2} per million characters)\nestimates — {}\n",
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
