//! `voxbatch bench llm`: the CosyVoice2 speech-token LM (the tch port) decoding many sequences at
//! once, as issue 13 asks — speech tokens per second (and the audio-seconds they stand for, 25
//! tokens a second) at each slot count, on requests of realistic lengths: text 20–120 tokens,
//! prompts 0–250 speech tokens (with a prompt text of one token per six), outputs 100–750 tokens.
//! Random weights end at random, so output lengths are forced (drawn uniformly from that range,
//! end-of-speech refused until then); the table says so.
//!
//! Each slot count decodes a warm-up (its first `slots` requests: it captures the CUDA graphs of
//! the buckets it meets) and then the timed run of all its requests (`--requests-per-slot` × slots:
//! more per slot means less of the run is the tail, where slots empty with nothing to refill). The reference figure (the official `Qwen2LM.inference`
//! at batch 1, same weights, same call) comes from `tools/bench_llm_reference.py` through
//! `--reference`.
//!
//! After each slot count's run it also says where the run's time went (prefill, launching,
//! waiting for the GPU, host bookkeeping: `DecoderStats`) and times one step and the sampler alone
//! (graph replays over every slot at [`PROFILE_SPAN`] positions).
//!
//! Neighbours: `model::llm` (`SpeechLm`, `BatchDecoder`); `model::memory` for the peak.

use std::path::{Path, PathBuf};
use std::time::Instant;

use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::model::llm::batch::{rows_for, BatchDecoder, DecoderStats};
use crate::model::llm::qwen2::span_for;
use crate::model::llm::speech_lm::{LmRequest, SpeechLm};
use crate::model::memory::MemoryProbe;
use crate::model::{Device, Manifest, ModelError};

/// Speech tokens per second of audio.
pub const TOKENS_PER_AUDIO_SECOND: f64 = 25.0;

pub struct LlmBenchOptions {
    pub model_dir: PathBuf,
    pub device: Device,
    pub slots: Vec<usize>,
    /// Requests per point: this many times the slot count (at least `min_requests`).
    pub requests_per_slot: usize,
    pub min_requests: usize,
    pub graphs: bool,
    /// Each point's step alone under libtorch's profiler ([`StepProfile`]).
    pub profile: bool,
    pub seed: u64,
    /// The reference's figure (tools/bench_llm_reference.py's JSON).
    pub reference: Option<ReferenceRun>,
}

/// What `tools/bench_llm_reference.py` measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReferenceRun {
    pub what: String,
    pub precision: String,
    pub sequences: usize,
    pub tokens: u64,
    pub seconds: f64,
    pub tokens_per_second: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Point {
    pub slots: usize,
    pub requests: usize,
    pub tokens: u64,
    pub seconds: f64,
    pub tokens_per_second: f64,
    pub audio_seconds_per_second: f64,
    pub steps: u64,
    /// Mean sequences per decode step.
    pub mean_active: f64,
    pub cache_bytes: u64,
    pub peak_memory_bytes: Option<u64>,
    pub decoder: DecoderStats,
    /// One step over all slots reading [`PROFILE_SPAN`] positions, graph replays alone (ms).
    pub step_ms: Option<f64>,
    /// The sampler's draws over all slots alone (ms), included in `step_ms`.
    pub sampler_ms: Option<f64>,
    /// The step alone under the profiler (`--profile`).
    pub step_profile: Option<StepProfile>,
    pub error: Option<String>,
}

/// [`PROFILE_STEPS`] steps alone (as `step_ms` times them) under libtorch's profiler: where a
/// step's device time goes.
#[derive(Debug, Clone, Serialize)]
pub struct StepProfile {
    pub steps: usize,
    /// The events' time added up, per step (on a GPU: kernels and copies).
    pub event_ms_per_step: f64,
    /// Events per step (on a GPU: kernel launches, a graph's included).
    pub events_per_step: f64,
    /// (category, seconds over all the steps), longest first.
    pub by_category: Vec<(String, f64)>,
    /// The longest events over all the steps.
    pub top: Vec<crate::model::profiler::ProfileRow>,
    pub error: Option<String>,
}

/// Steps a [`StepProfile`] holds.
pub const PROFILE_STEPS: usize = 10;

/// Positions each row reads in the step profile: about the mean context of the stated lengths
/// (input ≈ 220 positions, then half of ≈ 425 outputs), rounded to a span bucket.
pub const PROFILE_SPAN: i64 = 512;

#[derive(Debug, Clone, Serialize)]
pub struct LlmReport {
    pub model: String,
    pub device: String,
    pub gpu: String,
    pub precision: String,
    pub lengths: String,
    pub created_at: String,
    pub points: Vec<Point>,
    pub reference: Option<ReferenceRun>,
    /// The slots a worker would give the LM on this device with the default configuration.
    pub worker_plan: Option<crate::sizing::llm::LlmPlan>,
}

/// The stated length distribution.
const LENGTHS: &str = "text U[20,120] tokens; prompt speech U[0,250] tokens, prompt text = prompt/6; output forced U[100,750] tokens";

/// `n` requests of the stated lengths (fixed seed); with `end_of_prompt` (CosyVoice3, whose input
/// must hold it) each prompt text ends with it.
pub fn requests(n: usize, vocab: i64, speech_tokens: i64, end_of_prompt: Option<i64>, seed: u64) -> Vec<LmRequest> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n)
        .map(|i| {
            let text = rng.gen_range(20..=120);
            let prompt = rng.gen_range(0..=250);
            LmRequest {
                text: (0..text).map(|_| rng.gen_range(0..vocab)).collect(),
                prompt_text: (0..prompt / 6).map(|_| rng.gen_range(0..vocab)).chain(end_of_prompt).collect(),
                prompt_speech: (0..prompt).map(|_| rng.gen_range(0..speech_tokens)).collect(),
                seed: seed ^ i as u64,
                forced_len: Some(rng.gen_range(100..=750)),
            }
        })
        .collect()
}

pub fn run(opts: &LlmBenchOptions, mut progress: impl FnMut(&Point)) -> Result<LlmReport, ModelError> {
    let manifest = Manifest::load(&opts.model_dir)?;
    let (family, dims) = manifest.llm().map(|(f, d)| (f, d.clone())).ok_or_else(|| {
        ModelError::Manifest {
            dir: opts.model_dir.display().to_string(),
            reason: "model.toml has no [cosyvoice2.llm] or [cosyvoice3.llm] (convert llm.pt with tools/convert_cosyvoice.py)".into(),
        }
    })?;
    let (lm, params, ratios) = SpeechLm::load(&opts.model_dir, family, &dims, opts.device.to_tch())?;
    let gpu = crate::gpu::memory_info(opts.device).map(|i| i.name).unwrap_or_else(|_| opts.device.to_string());
    let probe = MemoryProbe::new(opts.device);
    let worker_plan = default_plan(opts.device, &dims, &lm, &opts.model_dir);
    let mut points = Vec::new();
    for &slots in &opts.slots {
        let n = (slots * opts.requests_per_slot).max(opts.min_requests);
        let reqs = requests(n, dims.vocab, dims.speech_tokens, dims.end_of_prompt, opts.seed);
        let max_positions = reqs.iter().map(|r| lm.positions_needed(r, ratios)).max().unwrap_or(1);
        probe.reset();
        let point = tch::no_grad(|| -> Result<Point, tch::TchError> {
            let mut dec = BatchDecoder::new(&lm, slots, max_positions, params, opts.graphs)?;
            // Warm-up on the first `slots` requests: captures most graphs the timed run meets (any
            // other is captured inside it, its time in the graphs column).
            lm.generate(&mut dec, &reqs[..slots.min(reqs.len())], ratios)?;
            let before = dec.stats().clone();
            let started = Instant::now();
            let out = lm.generate(&mut dec, &reqs, ratios)?;
            let seconds = started.elapsed().as_secs_f64();
            let tokens: u64 = out.iter().filter_map(|r| r.as_ref().ok()).map(|o| o.tokens.len() as u64).sum();
            let steps = dec.stats().steps - before.steps;
            let decoder = dec.stats().timings_since(&before);
            // The step alone, after the run (it clobbers the cache).
            let rows = rows_for(slots, slots);
            let span = span_for(PROFILE_SPAN, dec.max_positions());
            let step_ms = dec.time_step(&lm, rows, span, 20)? * 1e3;
            let sampler_ms = dec.time_sampler(rows, dims.speech_tokens + 3, 20)? * 1e3;
            let step_profile = opts.profile.then(|| profile_steps(&mut dec, &lm, rows, span, opts.device));
            let positions: u64 = reqs.iter().map(|r| r.forced_len.unwrap_or(0) as u64).sum();
            Ok(Point {
                slots,
                requests: n,
                tokens,
                seconds,
                tokens_per_second: tokens as f64 / seconds,
                audio_seconds_per_second: tokens as f64 / TOKENS_PER_AUDIO_SECOND / seconds,
                steps,
                mean_active: positions as f64 / steps.max(1) as f64,
                cache_bytes: dec.cache_bytes(),
                peak_memory_bytes: None,
                decoder,
                step_ms: Some(step_ms),
                sampler_ms: Some(sampler_ms),
                step_profile,
                error: None,
            })
        });
        let point = match point {
            Ok(p) => Point { peak_memory_bytes: probe.peak(), ..p },
            Err(e) => {
                probe.release_cached();
                Point {
                    slots,
                    requests: n,
                    tokens: 0,
                    seconds: 0.0,
                    tokens_per_second: 0.0,
                    audio_seconds_per_second: 0.0,
                    steps: 0,
                    mean_active: 0.0,
                    cache_bytes: 0,
                    peak_memory_bytes: probe.peak(),
                    decoder: DecoderStats::default(),
                    step_ms: None,
                    sampler_ms: None,
                    step_profile: None,
                    error: Some(e.to_string()),
                }
            }
        };
        progress(&point);
        points.push(point);
    }
    Ok(LlmReport {
        model: manifest.name.clone(),
        device: opts.device.to_string(),
        gpu,
        precision: format!("{:?}", lm.kind()).to_lowercase(),
        lengths: LENGTHS.to_string(),
        created_at: chrono::Utc::now().to_rfc3339(),
        points,
        reference: opts.reference.clone(),
        worker_plan,
    })
}

/// [`PROFILE_STEPS`] steps of `rows` rows reading `span` positions, as `time_step` runs them
/// (graph replays where graphs are on), under the profiler.
fn profile_steps(dec: &mut BatchDecoder, lm: &SpeechLm, rows: i64, span: i64, device: Device) -> StepProfile {
    use crate::model::profiler;
    let table = std::env::temp_dir().join(format!("voxbatch-llm-step-{}-{rows}.tsv", std::process::id()));
    let outcome = profiler::profile(device, &table, || dec.time_step(lm, rows, span, PROFILE_STEPS));
    let _ = std::fs::remove_file(&table);
    let mut p = StepProfile { steps: PROFILE_STEPS, event_ms_per_step: 0.0, events_per_step: 0.0, by_category: Vec::new(), top: Vec::new(), error: None };
    match outcome {
        Ok((_, rows)) => {
            // time_step runs one step more first, outside its timing but inside the profile.
            let steps = (PROFILE_STEPS + 1) as f64;
            let totals = super::KernelTotals::of(rows, 40);
            p.event_ms_per_step = totals.seconds * 1e3 / steps;
            p.events_per_step = totals.events as f64 / steps;
            (p.by_category, p.top) = (totals.by_category, totals.top);
        }
        Err(e) => p.error = Some(e.to_string()),
    }
    p
}

/// What `sizing::llm::plan` gives with the default configuration on `device` (None without one).
fn default_plan(device: Device, dims: &crate::model::LlmDims, lm: &SpeechLm, dir: &Path) -> Option<crate::sizing::llm::LlmPlan> {
    let cfg = crate::config::Config::defaults().ok()?;
    let info = crate::gpu::memory_info(device).ok()?;
    let budget = cfg.memory.vram_fraction * info.total_bytes as f64 - info.used_by_others_bytes as f64 - cfg.memory.safety_margin_bytes as f64;
    let weights = std::fs::metadata(dir.join(crate::model::llm::speech_lm::LLM_FILE)).ok()?.len() / 4 * lm.kind().elt_size_in_bytes() as u64;
    let manifest = crate::model::Manifest::load(dir).ok()?;
    let system = crate::model::tts::system_prompt_tokens(&manifest).ok()?;
    crate::sizing::llm::plan(&cfg.llm, dims, system, lm.kind(), weights, budget.max(0.0) as u64).ok()
}

/// The Markdown table (one row per slot count, then the reference).
pub fn table(r: &LlmReport) -> String {
    let mut s = format!(
        "speech-token LM `{}` on {} ({}), weights {} (logits and sampling fp32), random weights: {}\n\n\
         | slots | requests | tokens | s | tokens/s | audio-s/s | × reference | mean active | steps | graphs (capture s) | KV cache GiB | peak GiB |\n\
         |---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|\n",
        r.model, r.gpu, r.device, r.precision, r.lengths
    );
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    for p in &r.points {
        let peak = p.peak_memory_bytes.map_or("-".to_string(), |b| format!("{:.2}", gib(b)));
        if let Some(e) = &p.error {
            let e: String = e.chars().take(80).collect();
            s += &format!("| {} | {} | failed: {e} | | | | | | | | | {peak} |\n", p.slots, p.requests);
            continue;
        }
        let ratio = r.reference.as_ref().map_or("-".to_string(), |rf| format!("{:.1}×", p.tokens_per_second / rf.tokens_per_second));
        let graphs = match &p.decoder.eager_reason {
            Some(why) => format!("eager ({why})"),
            None => format!("{} ({:.1})", p.decoder.graphs_captured, p.decoder.capture_seconds),
        };
        s += &format!(
            "| {} | {} | {} | {:.2} | {:.0} | {:.1} | {ratio} | {:.1} | {} | {graphs} | {:.2} | {peak} |\n",
            p.slots,
            p.requests,
            p.tokens,
            p.seconds,
            p.tokens_per_second,
            p.audio_seconds_per_second,
            p.mean_active,
            p.steps,
            gib(p.cache_bytes)
        );
    }
    s += "\nWhere the time went (seconds of the timed run; the GPU idles through prefill's host part and the host's bookkeeping), and one step alone (graph replays, every row reading ";
    s += &format!("{PROFILE_SPAN} positions):\n\n| slots | prefill s (passes, positions) | launch s | wait s | host s | step ms alone | sampler ms alone |\n|---:|---|---:|---:|---:|---:|---:|\n");
    for p in r.points.iter().filter(|p| p.error.is_none()) {
        let d = &p.decoder;
        let ms = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}"));
        s += &format!(
            "| {} | {:.2} ({}, {}) | {:.2} | {:.2} | {:.2} | {} | {} |\n",
            p.slots, d.prefill_seconds, d.prefills, d.prefill_positions, d.launch_seconds, d.wait_seconds, d.host_seconds, ms(p.step_ms), ms(p.sampler_ms)
        );
    }
    for p in r.points.iter().filter(|p| p.error.is_none()) {
        let Some(sp) = &p.step_profile else { continue };
        s += &format!("\n### One step of {} slots under the profiler ({} steps + 1: {:.3} ms of events a step, {:.0} events a step)\n\n", p.slots, sp.steps, sp.event_ms_per_step, sp.events_per_step);
        match &sp.error {
            Some(e) => s += &format!("profile failed: {e}\n"),
            None => s += &super::kernel_tables(sp.by_category.iter().map(|(_, v)| v).sum(), &sp.by_category, &sp.top),
        }
    }
    if let Some(p) = &r.worker_plan {
        s += &format!(
            "\nA worker on this device with the default configuration ([llm] memory_share {:.0} GB of the budget): {} slots of {} positions ({:.1} MB each).\n",
            p.share_bytes as f64 / 1e9,
            p.slots,
            p.max_positions,
            p.bytes_per_slot as f64 / 1e6
        );
    }
    if let Some(rf) = &r.reference {
        s += &format!(
            "\nReference: {} ({}), {} sequences, {} tokens in {:.2} s: **{:.1} tokens/s** ({:.2} audio-s/s)\n",
            rf.what,
            rf.precision,
            rf.sequences,
            rf.tokens,
            rf.seconds,
            rf.tokens_per_second,
            rf.tokens_per_second / TOKENS_PER_AUDIO_SECOND
        );
    }
    s
}

pub fn write(r: &LlmReport, dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let json = dir.join("llm.json");
    std::fs::write(&json, serde_json::to_vec_pretty(r).map_err(std::io::Error::other)?)?;
    let md = dir.join("report.md");
    std::fs::write(&md, table(r))?;
    Ok(vec![json, md])
}
