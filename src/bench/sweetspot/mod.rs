//! `voxbatch bench`: the sweet-spot bench, the expert's checklist automated.
//!
//! 1. baseline: batch 1, fp32 — latency, throughput, peak memory;
//! 2. precision experiment at batch 1 — speed-up, memory saved, quality vs fp32 (SNR, LSD);
//! 3. batch sweep per precision — powers of two until OOM or the VRAM ceiling;
//! 4. sweet spot — per precision the knee: the largest batch whose throughput gain over the
//!    previous size is still ≥ 5 %, under the ceiling; the recommendation is the fastest knee
//!    among precisions whose quality holds (SNR ≥ `min_snr_db` against fp32);
//! 5. soak at the sweet spot — throughput stability, memory growth, temperature;
//! 6. cost table — $ per audio hour at the sweet spot for each price in the table, and a
//!    recommended config snippet.
//!
//! Inputs are fixed-length synthetic utterances (`utterance_seconds` of audio each) with a fixed
//! seed, the same for every precision.

mod report;

use std::time::{Duration, Instant};

pub use report::{markdown, write};

use rand::SeedableRng;
use serde::Serialize;

use crate::calibrate::synthetic_batch;
use crate::cost::Prices;
use crate::gpu::sampler::GpuSampler;
use crate::model::memory::MemoryProbe;
use crate::model::{Device, ModelError, ModelHandle, Precision, SynthItem};

/// What to run.
#[derive(Debug, Clone)]
pub struct SweetSpotOptions {
    pub model_dir: std::path::PathBuf,
    pub device: Device,
    pub precisions: Vec<Precision>,
    pub utterance_seconds: f64,
    pub max_batch: usize,
    pub vram_fraction: f64,
    pub soak: Duration,
    /// Timed repetitions per point (the median is reported).
    pub repeats: usize,
    pub knee_gain: f64,
    pub min_snr_db: f64,
    pub prices: Prices,
    pub cpu_threads: usize,
}

/// One measured (precision, batch size).
#[derive(Debug, Clone, Serialize)]
pub struct Point {
    pub precision: String,
    pub batch: usize,
    pub latency_ms: f64,
    pub audio_s_per_s: f64,
    pub peak_bytes: Option<u64>,
    pub oom: bool,
    pub over_ceiling: bool,
}

/// Quality of a precision against fp32 at batch 1.
#[derive(Debug, Clone, Serialize)]
pub struct Quality {
    pub precision: String,
    pub snr_db: f64,
    pub lsd_db: f64,
    pub speedup_vs_fp32: f64,
    pub memory_saved_bytes: i64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Knee {
    pub precision: String,
    pub batch: usize,
    pub audio_s_per_s: f64,
    pub peak_bytes: Option<u64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Soak {
    pub precision: String,
    pub batch: usize,
    pub seconds: f64,
    pub batches: usize,
    /// Throughput of each ~10 s window.
    pub window_audio_s_per_s: Vec<f64>,
    pub mean_audio_s_per_s: f64,
    /// Coefficient of variation of the windows.
    pub cv: f64,
    pub allocated_first_bytes: Option<u64>,
    pub allocated_last_bytes: Option<u64>,
    pub temp_max_c: Option<f32>,
    pub power_mean_w: Option<f32>,
    pub energy_j: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct CostRow {
    pub gpu: String,
    pub hourly_usd: f64,
    /// At the throughput measured here (other GPUs' speed differs: this is what this GPU's speed
    /// would cost at their price).
    pub usd_per_audio_hour: f64,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct SweetSpotReport {
    pub model: String,
    pub device: String,
    pub gpu: String,
    pub date: String,
    pub utterance_seconds: f64,
    pub utterance_tokens: usize,
    pub total_memory_bytes: u64,
    pub ceiling_bytes: f64,
    pub baseline: Option<Point>,
    pub precision_at_batch_1: Vec<Quality>,
    pub sweep: Vec<Point>,
    pub knees: Vec<Knee>,
    pub recommended: Option<Knee>,
    pub soak: Option<Soak>,
    pub cost_table: Vec<CostRow>,
    pub config_snippet: String,
    pub notes: Vec<String>,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        0.0
    } else {
        v[v.len() / 2]
    }
}

/// Runs `items` `repeats` times after one warm-up; (median latency, max peak) or the error.
async fn measure(model: &ModelHandle, items: &[SynthItem], repeats: usize) -> Result<(f64, Option<u64>, Vec<Vec<f32>>), ModelError> {
    let warm = model.synthesize(items.to_vec()).await?;
    let mut peak = warm.peak_bytes;
    let mut lat = Vec::new();
    let mut audio = warm.audio;
    for _ in 0..repeats.max(1) {
        let t0 = Instant::now();
        let out = model.synthesize(items.to_vec()).await?;
        lat.push(t0.elapsed().as_secs_f64() * 1000.0);
        peak = peak.max(out.peak_bytes);
        audio = out.audio;
    }
    let audio = audio.into_iter().map(|a| a.map(crate::audio::Waveform::into_samples)).collect::<Result<Vec<_>, String>>().map_err(ModelError::BadOutput)?;
    Ok((median(lat), peak, audio))
}

/// The knee of one precision's sweep (points sorted by batch, under the ceiling, no OOM).
pub fn knee(points: &[&Point], gain: f64) -> Option<usize> {
    let ok: Vec<&&Point> = points.iter().filter(|p| !p.oom && !p.over_ceiling).collect();
    let mut best = ok.first().map(|p| p.batch);
    for w in ok.windows(2) {
        if w[1].audio_s_per_s >= w[0].audio_s_per_s * (1.0 + gain) {
            best = Some(w[1].batch);
        }
    }
    best
}

/// Batch-1 outputs of one precision: (precision, audio per input, median latency ms, peak).
type BatchOne = (Precision, Vec<Vec<f32>>, f64, Option<u64>);

/// What one precision's run gave.
enum PrecisionRun {
    /// Not run, with the note saying why.
    Skipped(String),
    Ran { model: String, tokens: usize, batch_one: BatchOne, points: Vec<Point> },
}

/// Runs the bench. `progress(line)` narrates.
pub async fn run(opts: &SweetSpotOptions, mut progress: impl FnMut(&str)) -> Result<SweetSpotReport, ModelError> {
    let device = opts.device;
    let info = tokio::task::spawn_blocking(move || crate::gpu::memory_info(device).ok()).await.map_err(|_| ModelError::ThreadGone)?;
    let total = info.as_ref().map(|i| i.total_bytes).unwrap_or(0);
    let ceiling = opts.vram_fraction * total as f64;
    let mut notes = Vec::new();
    let mut sweep: Vec<Point> = Vec::new();
    let mut outputs_b1: Vec<BatchOne> = Vec::new();
    let (mut model_name, mut tokens) = (String::new(), 0);
    let mut precisions = opts.precisions.clone();
    if !precisions.contains(&Precision::Fp32) {
        precisions.insert(0, Precision::Fp32);
    }
    precisions.sort_by_key(|p| if *p == Precision::Fp32 { 0 } else { 1 });
    for &precision in &precisions {
        match run_precision(opts, precision, total, ceiling, &mut progress).await? {
            PrecisionRun::Skipped(note) => notes.push(note),
            PrecisionRun::Ran { model, tokens: t, batch_one, points } => {
                (model_name, tokens) = (model, t);
                outputs_b1.push(batch_one);
                sweep.extend(points);
            }
        }
    }
    let (precision_at_batch_1, baseline) = quality_at_batch_1(&outputs_b1, &sweep);
    let (knees, recommended) = recommend(opts, &precision_at_batch_1, &sweep, &mut notes);
    let soak = match (&recommended, opts.soak.is_zero()) {
        (Some(rec), false) => Some(soak(opts, rec, tokens, &mut progress).await?),
        _ => None,
    };
    let gpu = info.as_ref().map(|i| i.name.clone()).unwrap_or_else(|| opts.device.to_string());
    let (cost_table, config_snippet) = costs(opts, &gpu, recommended.as_ref());
    Ok(SweetSpotReport {
        model: model_name,
        device: opts.device.to_string(),
        gpu,
        date: chrono::Utc::now().to_rfc3339(),
        utterance_seconds: opts.utterance_seconds,
        utterance_tokens: tokens,
        total_memory_bytes: total,
        ceiling_bytes: ceiling,
        baseline,
        precision_at_batch_1,
        sweep,
        knees,
        recommended,
        soak,
        cost_table,
        config_snippet,
        notes,
    })
}

/// Batch 1 on fixed inputs (quality is compared on these), then the batch sweep, for one precision.
async fn run_precision(opts: &SweetSpotOptions, precision: Precision, total: u64, ceiling: f64, progress: &mut impl FnMut(&str)) -> Result<PrecisionRun, ModelError> {
    let model = match ModelHandle::load(&opts.model_dir, opts.device, precision, crate::model::LoadOptions { cpu_threads: opts.cpu_threads, token2wav_only: true, ..Default::default() }).await {
        Ok(m) => m,
        Err(e) if precision != Precision::Fp32 => {
            progress(&format!("{precision}: not supported here: {e}"));
            return Ok(PrecisionRun::Skipped(format!("{precision}: not run ({e})")));
        }
        Err(e) => return Err(e),
    };
    let manifest = model.manifest().clone();
    let samples_per_token = f64::from(manifest.frames_per_token) * f64::from(manifest.samples_per_frame);
    let tokens = ((opts.utterance_seconds * f64::from(manifest.sample_rate)) / samples_per_token).round().max(1.0) as usize;
    let vocab = manifest.vocab_size();
    let utterance_s = manifest.predicted_seconds(tokens);
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let quality_inputs = synthetic_batch(&mut rng, 4, tokens, vocab, manifest.voices.len());
    let (mut b1_audio, mut b1_lat, mut b1_peak) = (Vec::new(), Vec::new(), None);
    for item in &quality_inputs {
        match measure(&model, std::slice::from_ref(item), opts.repeats).await {
            Ok((lat, peak, mut audio)) => {
                b1_lat.push(lat);
                b1_peak = b1_peak.max(peak);
                b1_audio.push(audio.pop().unwrap_or_default());
            }
            Err(e) => {
                progress(&format!("{precision}: failed at batch 1: {e}"));
                return Ok(PrecisionRun::Skipped(format!("{precision}: failed at batch 1 ({e})")));
            }
        }
    }
    let lat1 = median(b1_lat);
    progress(&format!("{precision} batch 1: {lat1:.1} ms, {:.1} audio-s/s", utterance_s / (lat1 / 1000.0)));

    let mut points = Vec::new();
    let mut batch = 1;
    while batch <= opts.max_batch {
        let items = synthetic_batch(&mut rng, batch, tokens, vocab, manifest.voices.len());
        let point = match measure(&model, &items, opts.repeats).await {
            Ok((lat, peak, _)) => Point {
                precision: precision.to_string(),
                batch,
                latency_ms: lat,
                audio_s_per_s: batch as f64 * utterance_s / (lat / 1000.0),
                peak_bytes: peak,
                oom: false,
                over_ceiling: total > 0 && peak.is_some_and(|p| p as f64 > ceiling),
            },
            Err(e) if e.is_oom() => Point { precision: precision.to_string(), batch, latency_ms: 0.0, audio_s_per_s: 0.0, peak_bytes: None, oom: true, over_ceiling: true },
            Err(e) => return Err(e),
        };
        progress(&format!(
            "{precision} batch {batch}: {:.1} audio-s/s, peak {}{}",
            point.audio_s_per_s,
            point.peak_bytes.map(|p| format!("{:.2} GiB", p as f64 / (1u64 << 30) as f64)).unwrap_or_else(|| "-".into()),
            if point.oom { " (OOM)" } else if point.over_ceiling { " (over the ceiling)" } else { "" }
        ));
        let stop = point.oom || point.over_ceiling;
        points.push(point);
        if stop {
            break;
        }
        batch *= 2;
    }
    Ok(PrecisionRun::Ran { model: manifest.name.clone(), tokens, batch_one: (precision, b1_audio, lat1, b1_peak), points })
}

/// Quality and speed of each precision at batch 1 against fp32, and fp32's batch-1 point.
fn quality_at_batch_1(outputs_b1: &[BatchOne], sweep: &[Point]) -> (Vec<Quality>, Option<Point>) {
    let Some((_, ref_audio, ref_lat, ref_peak)) = outputs_b1.iter().find(|o| o.0 == Precision::Fp32) else { return (Vec::new(), None) };
    let baseline = sweep.iter().find(|p| p.precision == "fp32" && p.batch == 1).cloned();
    let qualities = outputs_b1
        .iter()
        .map(|(precision, audio, lat, peak)| Quality {
            precision: precision.to_string(),
            snr_db: ref_audio.iter().zip(audio).map(|(r, x)| super::quality::snr_db(r, x)).fold(f64::INFINITY, f64::min),
            lsd_db: ref_audio.iter().zip(audio).map(|(r, x)| super::quality::log_spectral_distance(r, x, 512)).fold(0.0, f64::max),
            speedup_vs_fp32: ref_lat / lat,
            memory_saved_bytes: ref_peak.unwrap_or(0) as i64 - peak.unwrap_or(0) as i64,
        })
        .collect();
    (qualities, baseline)
}

/// Each precision's knee, and the fastest knee among precisions whose quality holds.
fn recommend(opts: &SweetSpotOptions, quality: &[Quality], sweep: &[Point], notes: &mut Vec<String>) -> (Vec<Knee>, Option<Knee>) {
    let mut knees = Vec::new();
    for q in quality {
        let pts: Vec<&Point> = sweep.iter().filter(|p| p.precision == q.precision).collect();
        if let Some(p) = knee(&pts, opts.knee_gain).and_then(|b| pts.iter().find(|p| p.batch == b)) {
            knees.push(Knee { precision: q.precision.clone(), batch: p.batch, audio_s_per_s: p.audio_s_per_s, peak_bytes: p.peak_bytes });
        }
    }
    let acceptable = |k: &&Knee| quality.iter().any(|q| q.precision == k.precision && (q.snr_db >= opts.min_snr_db || q.precision == "fp32"));
    let recommended = knees.iter().filter(acceptable).max_by(|a, b| a.audio_s_per_s.total_cmp(&b.audio_s_per_s)).cloned();
    for q in quality {
        if q.precision != "fp32" && q.snr_db < opts.min_snr_db {
            notes.push(format!("{}: SNR {:.1} dB vs fp32 is under {:.0} dB, not recommended", q.precision, q.snr_db, opts.min_snr_db));
        }
    }
    (knees, recommended)
}

/// Runs the recommended point for `opts.soak`: throughput per window, memory growth, GPU figures.
async fn soak(opts: &SweetSpotOptions, rec: &Knee, tokens: usize, progress: &mut impl FnMut(&str)) -> Result<Soak, ModelError> {
    let precision: Precision = rec.precision.parse().map_err(|e: crate::model::ParseError| ModelError::BadOutput(e.to_string()))?;
    let model = ModelHandle::load(&opts.model_dir, opts.device, precision, crate::model::LoadOptions { cpu_threads: opts.cpu_threads, token2wav_only: true, ..Default::default() }).await?;
    let manifest = model.manifest().clone();
    let utterance_s = manifest.predicted_seconds(tokens);
    let mut rng = rand::rngs::StdRng::seed_from_u64(13);
    let items = synthetic_batch(&mut rng, rec.batch, tokens, manifest.vocab_size(), manifest.voices.len());
    let probe = MemoryProbe::new(opts.device);
    let device = opts.device;
    let sampler = tokio::task::spawn_blocking(move || GpuSampler::start(device, Duration::from_millis(100))).await.map_err(|_| ModelError::ThreadGone)?;
    if let Some(s) = &sampler {
        s.begin();
    }
    model.synthesize(items.clone()).await?;
    let first = probe.current();
    let started = Instant::now();
    let mut window_start = Instant::now();
    let (mut window_audio, mut batches) = (0.0, 0usize);
    let mut windows = Vec::new();
    let window_len = Duration::from_secs(10).min(opts.soak);
    while started.elapsed() < opts.soak {
        model.synthesize(items.clone()).await?;
        batches += 1;
        window_audio += rec.batch as f64 * utterance_s;
        if window_start.elapsed() >= window_len {
            windows.push(window_audio / window_start.elapsed().as_secs_f64());
            progress(&format!("soak {:.0}/{:.0} s: {:.1} audio-s/s", started.elapsed().as_secs_f64(), opts.soak.as_secs_f64(), windows[windows.len() - 1]));
            window_audio = 0.0;
            window_start = Instant::now();
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let stats = match &sampler {
        Some(s) => Some(s.end().await),
        None => None,
    };
    let mean = if windows.is_empty() { batches as f64 * rec.batch as f64 * utterance_s / seconds } else { windows.iter().sum::<f64>() / windows.len() as f64 };
    let sd = if windows.len() > 1 { (windows.iter().map(|w| (w - mean).powi(2)).sum::<f64>() / (windows.len() - 1) as f64).sqrt() } else { 0.0 };
    Ok(Soak {
        precision: rec.precision.clone(),
        batch: rec.batch,
        seconds,
        batches,
        window_audio_s_per_s: windows,
        mean_audio_s_per_s: mean,
        cv: if mean > 0.0 { sd / mean } else { 0.0 },
        allocated_first_bytes: first,
        allocated_last_bytes: probe.current(),
        temp_max_c: stats.as_ref().and_then(|s| s.temp_max_c),
        power_mean_w: stats.as_ref().and_then(|s| s.power_mean_w),
        energy_j: stats.as_ref().and_then(|s| s.energy_j),
    })
}

/// $ per audio hour at the recommended throughput for each price, and the config snippet.
fn costs(opts: &SweetSpotOptions, gpu: &str, recommended: Option<&Knee>) -> (Vec<CostRow>, String) {
    let Some(rec) = recommended else { return (Vec::new(), String::new()) };
    let this = opts.prices.hourly(opts.device, Some(gpu));
    let mut prices: Vec<(String, f64)> = vec![(format!("{gpu} (this machine's price)"), this)];
    prices.extend(opts.prices.gpu_hourly_usd.iter().map(|(k, v)| (k.clone(), *v)));
    // audio-hours per hour = audio-seconds per second
    let table = prices.into_iter().map(|(name, hourly)| CostRow { gpu: name, hourly_usd: hourly, usd_per_audio_hour: hourly / rec.audio_s_per_s }).collect();
    let snippet = format!(
        "[model]\nprecision = \"{}\"\n\n[batching]\n# the sweet spot for {:.0}-second utterances; the memory policy sizes mixed lengths\nmax_batch = {}\n\n[memory]\nvram_fraction = {}\n",
        rec.precision, opts.utterance_seconds, rec.batch, opts.vram_fraction
    );
    (table, snippet)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(batch: usize, tput: f64) -> Point {
        Point { precision: "bf16".into(), batch, latency_ms: 1.0, audio_s_per_s: tput, peak_bytes: None, oom: false, over_ceiling: false }
    }

    #[test]
    fn the_knee_is_the_last_size_that_still_gains_five_percent() {
        let pts = [p(1, 100.0), p(2, 190.0), p(4, 300.0), p(8, 310.0), p(16, 312.0)];
        let refs: Vec<&Point> = pts.iter().collect();
        assert_eq!(knee(&refs, 0.05), Some(4));
        let mut over = pts[..3].to_vec();
        over[2].over_ceiling = true;
        let refs: Vec<&Point> = over.iter().collect();
        assert_eq!(knee(&refs, 0.05), Some(2), "points over the ceiling are not candidates");
        assert_eq!(knee(&[], 0.05), None);
    }
}
