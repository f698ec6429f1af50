//! `voxbatch bench token2wav`: a token2wav model (CosyVoice2's or CosyVoice3's tch port, through
//! `model::load_token2wav`) measured the way issue 7 asks —
//! fixed-length utterances, audio-seconds per GPU-second at each batch size and precision, peak
//! memory, where the time goes (encoder, the flow's Euler steps, the HiFT vocoder), and what each
//! setting costs in quality (SNR and log-spectral distance of its waveforms against true fp32's:
//! flow and vocoder in fp32, TF32 off). A setting is the flow's precision and the vocoder's
//! (`--vocoders`, default the model's: CosyVoice2's `vocoder_precision`, CosyVoice3's the flow's
//! unless its `vocoder_precision` says), side by side. "encoder" is the stage before the flow's
//! steps (CosyVoice3: the token embedding and pre-lookahead layer).
//!
//! Runs on the calling thread (it owns the model); prints a Markdown table, writes
//! `token2wav.json` + `report.md`. The reference Python code's figure comes from
//! `tools/bench_reference_token2wav.py`, run beside it.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::bench::quality::{log_spectral_distance, snr_db};
use crate::model::flow_graphs::{FlowGraphSettings, FlowGraphStats};
use crate::model::memory::MemoryProbe;
use crate::model::tch_panic::caught;
use crate::model::token2wav::{StageTiming, Token2WavModel};
use crate::model::{Device, Manifest, ModelError, Precision, SynthItem};

pub struct Token2WavBenchOptions {
    pub model_dir: PathBuf,
    pub device: Device,
    pub precisions: Vec<Precision>,
    /// The vocoder's precisions to compare (empty: the model's `vocoder_precision`).
    pub vocoders: Vec<Precision>,
    pub batches: Vec<usize>,
    pub utterance_seconds: f64,
    pub repeats: usize,
    /// cuDNN's per-shape algorithm search (`cudnn.benchmark`), for the whole process.
    pub cudnn_benchmark: bool,
    /// Whether attention may run as cuDNN's (`[model] cudnn_attention`; the worker's default: off).
    pub cudnn_attention: bool,
    /// After the first measured setting's sweep: one run of its largest batch under the
    /// profiler, its kernels by time ([`KernelProfile`]).
    pub profile: bool,
    /// Small batches' compiled flow steps as CUDA graphs (`[model] flow_graphs`).
    pub flow_graphs: FlowGraphSettings,
    pub seed: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Point {
    /// The flow's precision.
    pub precision: String,
    /// The vocoder's.
    pub vocoder: String,
    pub batch: usize,
    /// Median wall time of one batch, device-synchronised (seconds).
    pub seconds: f64,
    pub audio_seconds_per_second: f64,
    pub encoder_seconds: f64,
    pub flow_seconds: f64,
    pub vocoder_seconds: f64,
    pub peak_memory_bytes: Option<u64>,
    pub error: Option<String>,
}

/// A precision's waveforms against fp32's, same inputs and same vocoder draws.
#[derive(Debug, Clone, Serialize)]
pub struct Quality {
    pub precision: String,
    pub vocoder: String,
    pub items: usize,
    /// Mean over items of the SNR against fp32, dB.
    pub snr_db_mean: f64,
    pub snr_db_min: f64,
    /// Mean log-spectral distance against fp32, dB.
    pub lsd_db_mean: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Token2WavReport {
    pub model: String,
    pub device: String,
    pub gpu: String,
    pub utterance_seconds: f64,
    pub tokens_per_utterance: usize,
    pub repeats: usize,
    pub cudnn_benchmark: bool,
    pub cudnn_attention: bool,
    /// Step graphs kept at most (0: none) and the largest step captured (rows × frames).
    pub flow_graphs: usize,
    pub flow_graph_max_frames: i64,
    /// What the graphs did over the whole run (captured, replays, capture seconds).
    pub flow_graph_stats: Option<FlowGraphStats>,
    pub created_at: String,
    pub points: Vec<Point>,
    pub quality: Vec<Quality>,
    pub profile: Option<KernelProfile>,
}

/// One run under libtorch's profiler (`--profile`): where its device time went.
#[derive(Debug, Clone, Serialize)]
pub struct KernelProfile {
    pub precision: String,
    pub vocoder: String,
    pub batch: usize,
    /// The run's wall time under the profiler (longer than unprofiled).
    pub wall_seconds: f64,
    /// The profiled events' time added up (on a GPU: kernels and copies).
    pub event_seconds: f64,
    /// (category, seconds), longest first.
    pub by_category: Vec<(String, f64)>,
    /// The longest events.
    pub top: Vec<crate::model::profiler::ProfileRow>,
    pub error: Option<String>,
}

/// Events kept in [`KernelProfile::top`] (the JSON; the console prints the first 25): enough to
/// hold the compiled flow's middle-sized kernels — in a batch of 128 the 30 longest account for
/// only ≈ three quarters of the Triton kernels' time.
const PROFILE_TOP: usize = 150;

/// Items of the quality check: the first few of the sweep's, with fixed vocoder draws.
const QUALITY_ITEMS: usize = 8;

/// Runs the sweep; `progress` gets one line per point.
pub fn run(opts: &Token2WavBenchOptions, mut progress: impl FnMut(&Point)) -> Result<Token2WavReport, ModelError> {
    let manifest = Manifest::load(&opts.model_dir)?;
    if matches!(opts.device, Device::Cuda(_)) {
        crate::torch_shim::set_cudnn(opts.cudnn_benchmark, opts.cudnn_attention)?;
    }
    let tokens = (opts.utterance_seconds * 25.0).round().max(1.0) as usize;
    let vocab = manifest.vocab_size();
    let mut rng = rand::rngs::StdRng::seed_from_u64(opts.seed);
    let max_batch = opts.batches.iter().copied().max().unwrap_or(1);
    let items: Vec<SynthItem> =
        (0..max_batch).map(|_| SynthItem::tokens((0..tokens).map(|_| rng.gen_range(0..vocab)).collect(), 0)).collect();
    let gpu = crate::gpu::memory_info(opts.device).map(|i| i.name).unwrap_or_else(|_| opts.device.to_string());
    let mut points = Vec::new();
    let mut quality = Vec::new();
    let quality_items = &items[..QUALITY_ITEMS.min(items.len())];
    // The quality reference first: true fp32 (flow fp32, vocoder fp32 with TF32 off).
    let vocoders = |flow: Precision| if opts.vocoders.is_empty() { vec![manifest.vocoder_precision(flow)] } else { opts.vocoders.clone() };
    let mut settings = vec![(Precision::Fp32, Precision::Fp32)];
    for &p in &opts.precisions {
        for v in vocoders(p) {
            if !settings.contains(&(p, v)) {
                settings.push((p, v));
            }
        }
    }
    let measured = |setting: &(Precision, Precision)| opts.precisions.contains(&setting.0) && vocoders(setting.0).contains(&setting.1);
    let mut reference: Option<Vec<Vec<f32>>> = None;
    let mut profile: Option<KernelProfile> = None;
    let mut graphs = FlowGraphStats::default();
    for setting @ &(precision, vocoder) in &settings {
        let mut model = crate::model::load_token2wav(&opts.model_dir, manifest.clone(), opts.device, precision, opts.flow_graphs)?;
        model.set_vocoder_precision(vocoder);
        let wavs: Vec<Vec<f32>> = model.run_seeded(quality_items, Some(opts.seed))?.into_iter().map(|(_, w)| w).collect();
        match &reference {
            None => reference = Some(wavs),
            Some(r) => {
                let snr: Vec<f64> = r.iter().zip(&wavs).map(|(a, b)| snr_db(a, b)).collect();
                let lsd: Vec<f64> = r.iter().zip(&wavs).map(|(a, b)| log_spectral_distance(a, b, 512)).collect();
                quality.push(Quality {
                    precision: precision.to_string(),
                    vocoder: vocoder.to_string(),
                    items: wavs.len(),
                    snr_db_mean: snr.iter().sum::<f64>() / snr.len().max(1) as f64,
                    snr_db_min: snr.iter().copied().fold(f64::INFINITY, f64::min),
                    lsd_db_mean: lsd.iter().sum::<f64>() / lsd.len().max(1) as f64,
                });
            }
        }
        if !measured(setting) {
            continue;
        }
        let probe = MemoryProbe::new(opts.device);
        let mut failed = false;
        for &batch in &opts.batches {
            if failed {
                break;
            }
            let batch_items = &items[..batch];
            let mut runs: Vec<(Duration, StageTiming)> = Vec::new();
            let mut error = None;
            probe.reset();
            // One warm-up (cuDNN autotuning, allocator growth), then the timed repeats.
            for rep in 0..=opts.repeats {
                let started = Instant::now();
                match caught(batch, || model.run_seeded(batch_items, None)) {
                    Ok(_) => {
                        if rep > 0 {
                            runs.push((started.elapsed(), model.last_timing().unwrap_or_default()));
                        }
                    }
                    Err(e) => {
                        error = Some(e.to_string());
                        model.release_cached();
                        failed = true;
                        break;
                    }
                }
            }
            let peak = probe.peak();
            runs.sort_by_key(|r| r.0);
            let point = match runs.get(runs.len() / 2) {
                Some((wall, t)) if error.is_none() => Point {
                    precision: precision.to_string(),
                    vocoder: vocoder.to_string(),
                    batch,
                    seconds: wall.as_secs_f64(),
                    audio_seconds_per_second: batch as f64 * tokens as f64 / 25.0 / wall.as_secs_f64(),
                    encoder_seconds: t.encoder.as_secs_f64(),
                    flow_seconds: t.flow_steps.as_secs_f64(),
                    vocoder_seconds: t.vocoder.as_secs_f64(),
                    peak_memory_bytes: peak,
                    error: None,
                },
                _ => Point {
                    precision: precision.to_string(),
                    vocoder: vocoder.to_string(),
                    batch,
                    seconds: 0.0,
                    audio_seconds_per_second: 0.0,
                    encoder_seconds: 0.0,
                    flow_seconds: 0.0,
                    vocoder_seconds: 0.0,
                    peak_memory_bytes: peak,
                    error: error.or_else(|| Some("no timed run".into())),
                },
            };
            progress(&point);
            points.push(point);
        }
        if opts.profile && profile.is_none() {
            let ran = |b: usize| points.iter().any(|p| p.batch == b && p.error.is_none() && p.precision == precision.to_string() && p.vocoder == vocoder.to_string());
            if let Some(&batch) = opts.batches.iter().filter(|&&b| ran(b)).max() {
                profile = Some(profile_run(model.as_mut(), &items[..batch], opts.device, precision, vocoder));
            }
        }
        graphs.add(&model.flow_graph_stats());
    }
    Ok(Token2WavReport {
        model: manifest.name.clone(),
        device: opts.device.to_string(),
        gpu,
        utterance_seconds: tokens as f64 / 25.0,
        tokens_per_utterance: tokens,
        repeats: opts.repeats,
        cudnn_benchmark: opts.cudnn_benchmark,
        cudnn_attention: opts.cudnn_attention,
        flow_graphs: opts.flow_graphs.graphs,
        flow_graph_max_frames: opts.flow_graphs.max_frames,
        flow_graph_stats: (opts.flow_graphs.graphs > 0).then_some(graphs),
        created_at: chrono::Utc::now().to_rfc3339(),
        points,
        quality,
        profile,
    })
}

/// One run of `items` under the profiler.
fn profile_run(model: &mut dyn Token2WavModel, items: &[SynthItem], device: Device, precision: Precision, vocoder: Precision) -> KernelProfile {
    use crate::model::profiler;
    let table = std::env::temp_dir().join(format!("voxbatch-kernels-{}.tsv", std::process::id()));
    let started = Instant::now();
    let outcome = profiler::profile(device, &table, || model.run_seeded(items, None));
    let wall_seconds = started.elapsed().as_secs_f64();
    let _ = std::fs::remove_file(&table);
    let mut p = KernelProfile {
        precision: precision.to_string(),
        vocoder: vocoder.to_string(),
        batch: items.len(),
        wall_seconds,
        event_seconds: 0.0,
        by_category: Vec::new(),
        top: Vec::new(),
        error: None,
    };
    match outcome {
        Ok((_, rows)) => {
            let totals = super::KernelTotals::of(rows, PROFILE_TOP);
            (p.event_seconds, p.by_category, p.top) = (totals.seconds, totals.by_category, totals.top);
        }
        Err(e) => p.error = Some(e.to_string()),
    }
    p
}

/// The Markdown table (one row per precision and batch).
pub fn table(r: &Token2WavReport) -> String {
    let mut s = format!(
        "token2wav `{}` on {} ({}), {:.1}-s utterances ({} tokens), median of {}{}{}{}\n\n\
         | flow | HiFT | batch | s/batch | audio-s/s | encoder % | flow steps % | HiFT % | peak GiB |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|\n",
        r.model,
        r.gpu,
        r.device,
        r.utterance_seconds,
        r.tokens_per_utterance,
        r.repeats,
        if r.cudnn_benchmark { ", cuDNN benchmark mode" } else { "" },
        if r.cudnn_attention { ", cuDNN attention" } else { "" },
        match &r.flow_graph_stats {
            Some(g) => format!(
                ", flow step graphs ≤ {} of ≤ {} rows × frames ({} captured in {:.2} s, {} replays)",
                r.flow_graphs, r.flow_graph_max_frames, g.captured, g.capture_seconds, g.replays
            ),
            None => String::new(),
        }
    );
    for p in &r.points {
        let peak = p.peak_memory_bytes.map_or("-".to_string(), |b| format!("{:.2}", b as f64 / (1u64 << 30) as f64));
        if let Some(e) = &p.error {
            let e: String = e.chars().take(60).collect();
            s += &format!("| {} | {} | {} | failed: {e} | | | | | {peak} |\n", p.precision, p.vocoder, p.batch);
            continue;
        }
        let pct = |x: f64| 100.0 * x / p.seconds.max(f64::MIN_POSITIVE);
        s += &format!(
            "| {} | {} | {} | {:.3} | {:.1} | {:.1} | {:.1} | {:.1} | {peak} |\n",
            p.precision,
            p.vocoder,
            p.batch,
            p.seconds,
            p.audio_seconds_per_second,
            pct(p.encoder_seconds),
            pct(p.flow_seconds),
            pct(p.vocoder_seconds)
        );
    }
    if !r.quality.is_empty() {
        s += &format!(
            "\nQuality against true fp32 (flow and HiFT in fp32, TF32 off; {} items, same inputs and vocoder draws)\n\n\
             | flow | HiFT | SNR dB mean | SNR dB min | LSD dB |\n|---|---|---:|---:|---:|\n",
            r.quality[0].items
        );
        for q in &r.quality {
            s += &format!("| {} | {} | {:.1} | {:.1} | {:.3} |\n", q.precision, q.vocoder, q.snr_db_mean, q.snr_db_min, q.lsd_db_mean);
        }
    }
    if let Some(p) = &r.profile {
        s += &profile_table(p);
    }
    s
}

/// The profile's Markdown: time by category, then the longest events.
fn profile_table(p: &KernelProfile) -> String {
    let s = format!(
        "\n### Where one run's time went (flow {}, HiFT {}, batch {}; profiled run {:.3} s wall, events {:.3} s)\n\n",
        p.precision, p.vocoder, p.batch, p.wall_seconds, p.event_seconds
    );
    if let Some(e) = &p.error {
        return s + &format!("profile failed: {e}\n");
    }
    s + &super::kernel_tables(p.event_seconds, &p.by_category, &p.top)
}

pub fn write(r: &Token2WavReport, dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let json = dir.join("token2wav.json");
    std::fs::write(&json, serde_json::to_vec_pretty(r).map_err(std::io::Error::other)?)?;
    let md = dir.join("report.md");
    std::fs::write(&md, table(r))?;
    Ok(vec![json, md])
}
