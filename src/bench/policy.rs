//! `voxbatch bench policy`: the memory-aware batch policy against fixed batch sizes 1, 2, 4, …
//! (until one runs out of memory) on a mixed-length corpus with a fixed seed.
//!
//! Each configuration synthesizes the whole corpus on the model thread (no queue, no storage).
//! Fixed sizes run twice: `fixed-B` takes jobs in arrival order (a hand-set batch size), `sorted-B`
//! takes them sorted by length (a hand-set batch size with length bucketing, the stronger
//! baseline). The policy holds the whole corpus and sizes each batch by predicted peak memory. Out-of-memory batches are split and
//! retried (as the worker does) and counted. Reports throughput (audio-seconds per second), OOM
//! count, padding waste, peak memory and, for the policy, predicted vs measured peak.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::batch::memory::MemoryBudget;
use crate::batch::split::SplitEvent;
use crate::batch::{Admission, BatchOutcome, BatchPolicy, Decision, LengthBucketing, Pending};
use crate::model::{ModelHandle, SynthItem};
use crate::worker::synthesize_splitting;

/// One configuration's result.
#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    /// "fixed-16" (arrival order), "sorted-16" (length-sorted) or "policy".
    pub config: String,
    /// Fixed batch size, or the policy's mean batch size.
    pub batch_size: f64,
    pub batches: usize,
    pub jobs: usize,
    pub audio_seconds: f64,
    pub wall_seconds: f64,
    pub audio_seconds_per_second: f64,
    pub ooms: usize,
    pub failed_jobs: usize,
    /// 1 − Σ tokens / Σ (batch size × longest), over all forward passes.
    pub padding_waste: f64,
    pub peak_memory_bytes: u64,
    /// Policy only: worst |predicted − measured| / measured over its batches.
    pub worst_prediction_error: Option<f64>,
    pub mean_prediction_error: Option<f64>,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct PolicyReport {
    pub model: String,
    pub device: String,
    pub gpu: String,
    pub precision: String,
    pub jobs: usize,
    pub seed: u64,
    pub corpus_audio_seconds: f64,
    pub budget_bytes: f64,
    pub profile_source: String,
    pub runs: Vec<RunResult>,
    pub best_fixed: Option<String>,
    /// Policy throughput / best fixed throughput.
    pub policy_vs_best_fixed: Option<f64>,
    pub date: String,
}

struct Job {
    tokens: Vec<i64>,
    voice: i64,
}

#[derive(Default)]
struct Acc {
    batches: usize,
    jobs: usize,
    audio_samples: u64,
    ooms: usize,
    failed: usize,
    tokens: u64,
    padded: u64,
    peak: u64,
    pred_errors: Vec<f64>,
}

/// Runs one batch through the worker's split-on-failure path; returns (outcome, measured peak).
async fn run_batch(model: &ModelHandle, jobs: &[&Job], acc: &mut Acc) -> (BatchOutcome, Option<u64>) {
    let run = synthesize_splitting(model, jobs.to_vec(), |j: &&Job| SynthItem::tokens(j.tokens.clone(), j.voice)).await;
    let ooms = run.events.iter().filter(|e| matches!(e, SplitEvent::OutOfMemory { .. })).count();
    acc.batches += 1;
    acc.jobs += run.done.len();
    acc.audio_samples += run.done.iter().map(|(_, a)| a.len() as u64).sum::<u64>();
    acc.ooms += ooms;
    acc.failed += run.failed.len() + run.given_back.len();
    acc.tokens += run.forward_tokens;
    acc.padded += run.forward_padded_tokens;
    acc.peak = acc.peak.max(run.peak.unwrap_or(0));
    (if ooms > 0 { BatchOutcome::OutOfMemory } else { BatchOutcome::Clean }, run.peak)
}

fn result(config: String, batch_size: f64, acc: Acc, wall: Duration, sample_rate: u32) -> RunResult {
    let audio_seconds = acc.audio_samples as f64 / f64::from(sample_rate);
    let wall_seconds = wall.as_secs_f64();
    let errs = &acc.pred_errors;
    RunResult {
        config,
        batch_size,
        batches: acc.batches,
        jobs: acc.jobs,
        audio_seconds,
        wall_seconds,
        audio_seconds_per_second: if wall_seconds > 0.0 { audio_seconds / wall_seconds } else { 0.0 },
        ooms: acc.ooms,
        failed_jobs: acc.failed,
        padding_waste: if acc.padded > 0 { 1.0 - acc.tokens as f64 / acc.padded as f64 } else { 0.0 },
        peak_memory_bytes: acc.peak,
        worst_prediction_error: (!errs.is_empty()).then(|| errs.iter().copied().fold(0.0, f64::max)),
        mean_prediction_error: (!errs.is_empty()).then(|| errs.iter().sum::<f64>() / errs.len() as f64),
    }
}

/// Options of the policy benchmark.
#[derive(Debug, Clone)]
pub struct PolicyBenchOptions {
    pub jobs: usize,
    pub seed: u64,
    /// Largest fixed batch size tried, and the policy's hard cap.
    pub max_batch: usize,
    pub gpu_name: String,
    pub profile_source: String,
    pub max_length_ratio: f64,
    /// Skip the fixed batch sizes.
    pub policy_only: bool,
}

/// Runs the benchmark. `progress(line)` reports each finished configuration.
pub async fn run(
    model: &ModelHandle,
    admission: MemoryBudget,
    opts: &PolicyBenchOptions,
    mut progress: impl FnMut(&RunResult),
) -> PolicyReport {
    let manifest = model.manifest().clone();
    let texts = super::corpus::mixed_lengths(opts.jobs, opts.seed);
    let jobs: Vec<Job> = texts
        .iter()
        .enumerate()
        .map(|(i, t)| Job { tokens: manifest.tokenize(t), voice: (i % manifest.voices.len()) as i64 })
        .collect();
    let corpus_audio_seconds: f64 = jobs.iter().map(|j| manifest.predicted_seconds(j.tokens.len())).sum();
    // Warm-up so that the first configuration does not pay for kernel loading.
    let warm: Vec<&Job> = jobs.iter().take(2).collect();
    let _ = run_batch(model, &warm, &mut Acc::default()).await;

    let mut sorted: Vec<&Job> = jobs.iter().collect();
    sorted.sort_by_key(|j| j.tokens.len());
    let arrival: Vec<&Job> = jobs.iter().collect();
    let mut runs = Vec::new();
    let mut b = 1;
    let (mut arrival_oom, mut sorted_oom) = (false, false);
    while !opts.policy_only && b <= opts.max_batch && !(arrival_oom && sorted_oom) {
        for (name, order, stopped) in [("fixed", &arrival, &mut arrival_oom), ("sorted", &sorted, &mut sorted_oom)] {
            if *stopped {
                continue;
            }
            let mut acc = Acc::default();
            let t0 = Instant::now();
            for chunk in order.chunks(b) {
                run_batch(model, chunk, &mut acc).await;
            }
            let r = result(format!("{name}-{b}"), b as f64, acc, t0.elapsed(), manifest.sample_rate);
            progress(&r);
            *stopped = r.ooms > 0;
            runs.push(r);
        }
        b *= 2;
    }

    // The policy: all jobs held at once, batches sized by predicted peak memory.
    let budget_bytes = admission.budget_bytes;
    let mut policy = LengthBucketing::with_admission(opts.max_batch, Duration::ZERO, admission).with_max_length_ratio(opts.max_length_ratio);
    for (seq, j) in jobs.iter().enumerate() {
        policy.push(Pending { item: j, tokens: j.tokens.len(), priority: 0, arrived: Instant::now(), seq: seq as u64 });
    }
    let mut acc = Acc::default();
    let t0 = Instant::now();
    let mut sizes = Vec::new();
    while let Decision::Flush(flush) = policy.decide(Instant::now(), true) {
        let max_tokens = flush.items.iter().map(|p| p.tokens).max().unwrap_or(0);
        let predicted = policy.admission.predicted_peak(flush.items.len(), max_tokens);
        let refs: Vec<&Job> = flush.items.iter().map(|p| p.item).collect();
        sizes.push(refs.len());
        let (outcome, measured) = run_batch(model, &refs, &mut acc).await;
        if let (Some(p), Some(m), BatchOutcome::Clean) = (predicted, measured, outcome) {
            acc.pred_errors.push((p - m as f64).abs() / m as f64);
        }
        policy.observe(&outcome);
    }
    let mean = sizes.iter().sum::<usize>() as f64 / sizes.len().max(1) as f64;
    let r = result("policy".into(), mean, acc, t0.elapsed(), manifest.sample_rate);
    progress(&r);
    runs.push(r);

    let best = runs
        .iter()
        .filter(|r| r.config != "policy" && r.ooms == 0)
        .max_by(|a, b| a.audio_seconds_per_second.total_cmp(&b.audio_seconds_per_second))
        .cloned();
    let policy_tput = runs.last().map(|r| r.audio_seconds_per_second).unwrap_or(0.0);
    PolicyReport {
        model: manifest.name.clone(),
        device: model.device().to_string(),
        gpu: opts.gpu_name.clone(),
        precision: model.precision().to_string(),
        jobs: jobs.len(),
        seed: opts.seed,
        corpus_audio_seconds,
        budget_bytes,
        profile_source: opts.profile_source.clone(),
        best_fixed: best.as_ref().map(|b| b.config.clone()),
        policy_vs_best_fixed: best.map(|b| policy_tput / b.audio_seconds_per_second),
        runs,
        date: chrono::Utc::now().to_rfc3339(),
    }
}

/// The report as a table.
pub fn table(report: &PolicyReport) -> String {
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::UTF8_FULL_CONDENSED);
    t.set_header(["config", "batch", "batches", "audio s/s", "OOMs", "failed", "padding waste", "peak GiB", "pred. err (worst/mean)"]);
    for r in &report.runs {
        t.add_row([
            r.config.clone(),
            format!("{:.1}", r.batch_size),
            r.batches.to_string(),
            format!("{:.1}", r.audio_seconds_per_second),
            r.ooms.to_string(),
            r.failed_jobs.to_string(),
            format!("{:.1}%", r.padding_waste * 100.0),
            format!("{:.2}", r.peak_memory_bytes as f64 / (1u64 << 30) as f64),
            match (r.worst_prediction_error, r.mean_prediction_error) {
                (Some(w), Some(m)) => format!("{:.1}% / {:.1}%", w * 100.0, m * 100.0),
                _ => "-".into(),
            },
        ]);
    }
    let mut s = format!(
        "policy bench: {} on {} ({}) {}, {} jobs (seed {}), {:.0} s of audio, budget {:.2} GiB, profile {}\n{t}\n",
        report.model,
        report.device,
        report.gpu,
        report.precision,
        report.jobs,
        report.seed,
        report.corpus_audio_seconds,
        report.budget_bytes / (1u64 << 30) as f64,
        report.profile_source
    );
    if let (Some(best), Some(ratio)) = (&report.best_fixed, report.policy_vs_best_fixed) {
        s.push_str(&format!("policy / best fixed ({best}): {:.1}% of its throughput\n", ratio * 100.0));
    }
    s
}

/// Writes `policy.json`, `policy.txt` and `policy.svg` to `dir`.
pub fn write(report: &PolicyReport, dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    use crate::plot::{svg, Panel, Series};
    let policy = report.runs.iter().find(|r| r.config == "policy");
    let line = |name: &str, prefix: &str, f: &dyn Fn(&RunResult) -> f64| Series {
        name: name.to_string(),
        points: report.runs.iter().filter(|r| r.config.starts_with(prefix)).map(|r| (r.batch_size, f(r))).collect(),
        horizontal: false,
    };
    let flat = |name: &str, v: f64| Series { name: name.to_string(), points: vec![(1.0, v)], horizontal: true };
    let gib = |r: &RunResult| r.peak_memory_bytes as f64 / (1u64 << 30) as f64;
    let mut tput = vec![
        line("fixed, arrival order", "fixed-", &|r| r.audio_seconds_per_second),
        line("fixed, sorted by length", "sorted-", &|r| r.audio_seconds_per_second),
    ];
    let mut mem = vec![line("fixed, arrival order", "fixed-", &gib), line("fixed, sorted by length", "sorted-", &gib)];
    if let Some(p) = policy {
        tput.push(flat(&format!("policy (mean batch {:.1})", p.batch_size), p.audio_seconds_per_second));
        mem.push(flat("policy", p.peak_memory_bytes as f64 / (1u64 << 30) as f64));
    }
    let chart = svg(
        &[
            Panel { title: format!("Throughput, {} {}", report.model, report.precision), y_label: "audio-seconds per second".into(), series: tput },
            Panel { title: "Peak memory".into(), y_label: "GiB".into(), series: mem },
        ],
        "batch size",
    );
    let paths = vec![dir.join("policy.json"), dir.join("policy.txt"), dir.join("policy.svg")];
    std::fs::write(&paths[0], serde_json::to_vec_pretty(report).map_err(std::io::Error::other)?)?;
    std::fs::write(&paths[1], table(report))?;
    std::fs::write(&paths[2], chart)?;
    Ok(paths)
}
