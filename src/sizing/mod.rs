//! Batch sizing: which batch policy a worker (or a bench) runs, from configuration, the device's
//! memory and the calibration profile.
//!
//! [`worker_policy`] builds the policy and the prefetch it needs; [`memory_admission`] builds
//! the memory budget (fraction × device memory − other processes − margin, or a fixed budget)
//! around the matching profile, or a conservative built-in when there is none. Both read NVML
//! and files: call them off the async runtime (`spawn_blocking`).
//!
//! Neighbours: `batch` holds the pure policy and memory model; `worker` and `bench::policy` call
//! this; `calibrate` writes the profiles read here (`profile.rs`).

pub mod llm;
pub mod profile;

use tracing::{info, warn};

use crate::batch::memory::{MemoryBudget, Profile};
use crate::batch::{BatchPolicy, LengthBucketing, TokenBudget, WorkBudget};
use crate::config::{Config, SizingPolicy};
use crate::frontend::SpeakingRates;
use crate::model::tts::TextPlan;
use crate::model::{Device, Manifest, Precision};
pub use profile::ProfileError;

/// Errors choosing a batch size.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SizingError {
    #[error("cannot size batches by memory on {device}; set memory.budget_bytes, or memory.policy = \"tokens\"")]
    NoDeviceMemory { device: Device, source: crate::gpu::GpuError },
    #[error("no memory left for batches on {gpu}: {fraction:.0}% of {total} bytes minus other processes ({others} bytes) minus the margin is {budget:.0}")]
    NoBudget { gpu: String, fraction: f64, total: u64, others: u64, budget: f64 },
    #[error(transparent)]
    Profile(#[from] ProfileError),
    #[error(transparent)]
    Llm(#[from] llm::LlmSizingError),
    #[error("model {model}: {reason}")]
    Model { model: String, reason: String },
    #[error("model {model} has no LLM section ([cosyvoice2.llm] or [cosyvoice3.llm]): kinds cosyvoice2 and cosyvoice3 need the LLM (convert a directory with llm.pt)")]
    NoLlm { model: String },
}

/// Kind `cosyvoice2`: a batch of text jobs may hold up to this many fills of the LLM's slots
/// (segments of [`SEGMENT_SPEECH_TOKENS`]; the jobs' estimated speech tokens added up), so that
/// slots are refilled from the batch's own backlog rather than idling at its tail, and finished
/// segments find like-length peers for token2wav's buckets.
pub const TEXT_BATCH_FILLS: usize = 8;

/// Text models: messages the intake pulls in a row before it looks at the rest of its loop again
/// (`amqp.prefetch = 0`).
pub const TEXT_PREFETCH: u16 = 16;

/// A typical segment's speech tokens (10 s of audio) for [`TEXT_BATCH_FILLS`].
pub const SEGMENT_SPEECH_TOKENS: usize = 250;

/// CPU's LLM slots when neither `llm.slots` nor a memory budget says (the tiny model, tests).
const CPU_SLOTS: usize = 8;

/// A worker's batch policy and the prefetch it needs.
pub struct Sizing<T> {
    pub policy: Box<dyn BatchPolicy<T>>,
    pub prefetch: u16,
    /// Text models: the work (estimated speech tokens) the intake holds waiting for the next
    /// batch; past it the worker stops taking messages, so a fleet shares a backlog of long jobs
    /// by their work, not by a count of messages. `None`: the prefetch count alone.
    pub hold_work: Option<usize>,
}

/// The batch policy the configuration asks for, and the prefetch it needs (three batches of the
/// largest size it would admit for short jobs, unless `amqp.prefetch` is set).
/// `llm_slots`: the slots the loaded model's LLM has (kind `cosyvoice2`: its text batches fill them).
pub fn worker_policy<T: Send + 'static>(
    cfg: &Config,
    manifest: &Manifest,
    device: Device,
    precision: Precision,
    llm_slots: Option<usize>,
) -> Result<Sizing<T>, SizingError> {
    let b = &cfg.batching;
    if manifest.kind.takes_text() {
        // Memory is the model thread's business (LLM slots allocated once, token2wav buckets
        // admitted by the memory model): jobs are batched by the work they bring, a job's length
        // being its estimated speech tokens (both stages' work). A batch holds at most
        // TEXT_BATCH_FILLS fills of the slots, and at most `worker.max_hold` of work at the
        // estimated throughput: its messages stay far inside RabbitMQ's consumer timeout unless
        // the device is slower than `[frontend] estimate_audio_seconds_per_gpu_second` says.
        let slots = llm_slots.ok_or_else(|| SizingError::NoLlm { model: manifest.name.clone() })?;
        let max_jobs = text_batch_jobs(b.max_text_jobs, slots);
        let max_tokens = text_batch_tokens(slots, cfg.worker.max_hold, cfg.frontend.estimate_audio_seconds_per_gpu_second);
        info!(slots, max_jobs, max_tokens, "batch sizing: text jobs by their estimated speech tokens (LLM slots × {TEXT_BATCH_FILLS}, within worker.max_hold)");
        // No length buckets: the model thread buckets segments itself, and a job's length says
        // nothing about padding.
        // The work a batch holds is its jobs' tokens added up (`WorkBudget`), not its size × its
        // longest job: with a chapter in a batch that counted several times the real work.
        let policy = LengthBucketing::with_admission(max_jobs, b.max_wait, WorkBudget { max_tokens }).with_max_length_ratio(f64::INFINITY);
        // Messages are pulled (TEXT_PREFETCH at most in a row; the intake doc says how) until the
        // next batch's work is held: what a worker takes ahead is sized by work, one job past it.
        let prefetch = if cfg.amqp.prefetch > 0 { cfg.amqp.prefetch } else { TEXT_PREFETCH };
        return Ok(Sizing { policy: Box::new(policy), prefetch, hold_work: Some(max_tokens) });
    }
    match cfg.memory.policy {
        SizingPolicy::Tokens => {
            info!(max_batch = b.max_batch, max_batch_tokens = b.max_batch_tokens, "batch sizing: padded-token cap");
            let policy = LengthBucketing::new(b.max_batch, b.max_wait, b.max_batch_tokens).with_max_length_ratio(b.max_length_ratio);
            Ok(Sizing { policy: Box::new(policy), prefetch: cfg.amqp.effective_prefetch(b.max_batch), hold_work: None })
        }
        SizingPolicy::Memory => {
            let (admission, _) = memory_admission(cfg, manifest, device, precision)?;
            let short_batch = admission.largest_batch(16, b.max_batch);
            let prefetch = cfg.amqp.effective_prefetch(short_batch);
            let policy = LengthBucketing::with_admission(b.max_batch, b.max_wait, admission).with_max_length_ratio(b.max_length_ratio);
            Ok(Sizing { policy: Box::new(policy), prefetch, hold_work: None })
        }
    }
}

/// Jobs a batch of text jobs may hold: `batching.max_text_jobs`, else [`TEXT_BATCH_FILLS`] fills
/// of the LLM's `slots`.
pub fn text_batch_jobs(max_text_jobs: Option<usize>, slots: usize) -> usize {
    max_text_jobs.unwrap_or(slots * TEXT_BATCH_FILLS).max(1)
}

/// The speech tokens (the jobs' estimates added up) a batch of text jobs may hold:
/// [`TEXT_BATCH_FILLS`] fills of `slots`, and no more than `max_hold` of work at
/// `audio_seconds_per_second`.
pub fn text_batch_tokens(slots: usize, max_hold: std::time::Duration, audio_seconds_per_second: f64) -> usize {
    let fills = slots * SEGMENT_SPEECH_TOKENS * TEXT_BATCH_FILLS;
    let hold = max_hold.as_secs_f64() * audio_seconds_per_second * SpeakingRates::TOKENS_PER_SECOND;
    fills.min(hold as usize).max(1)
}

/// How a `cosyvoice2` model's two stages are sized on `device`: the LLM's slots (`llm::plan`:
/// `llm.memory_share` of the memory budget, or `llm.slots`) and token2wav's batches of finished
/// segments (the token2wav memory model over the rest of the budget). At most
/// `llm.token2wav_max_bucket` segments a bucket. With `memory.policy = "tokens"`: `llm.slots` (else
/// `llm.max_slots` on a GPU, 8 on CPU) and `batching.max_batch_tokens`. Reads NVML and files: off the async runtime.
pub fn text_plan(cfg: &Config, manifest: &Manifest, device: Device, precision: Precision) -> Result<TextPlan, SizingError> {
    let dims = manifest.llm().map(|(_, d)| d.clone()).ok_or_else(|| SizingError::NoLlm { model: manifest.name.clone() })?;
    let b = &cfg.batching;
    match cfg.memory.policy {
        SizingPolicy::Tokens => {
            let slots = cfg.llm.slots.unwrap_or(if device == Device::Cpu { CPU_SLOTS } else { cfg.llm.max_slots });
            let token2wav = Box::new(TokenBudget { max_batch_tokens: b.max_batch_tokens });
            Ok(TextPlan { llm: cfg.llm.clone(), slots, token2wav, token2wav_max_batch: cfg.llm.token2wav_max_bucket })
        }
        SizingPolicy::Memory => {
            let (budget, gpu_name) = budget_bytes(cfg, device)?;
            // The LM's weights as it loads them (bf16 on a GPU: half the fp32 file).
            let kind = crate::model::llm::speech_lm::SpeechLm::weights_kind(device.to_tch());
            let file = std::fs::metadata(manifest.dir.join(crate::model::llm::speech_lm::LLM_FILE)).map(|m| m.len()).unwrap_or(0);
            let weights = if kind == tch::Kind::Float { file } else { file / 2 };
            let system = crate::model::tts::system_prompt_tokens(manifest).map_err(|e| SizingError::Model { model: manifest.name.clone(), reason: e.to_string() })?;
            let mut llm = llm::plan(&cfg.llm, &dims, system, kind, weights, budget as u64)?;
            if device == Device::Cpu && cfg.llm.slots.is_none() {
                llm.slots = llm.slots.min(CPU_SLOTS);
            }
            let (admission, _) = admission_within(cfg, manifest, device, precision, budget - llm.share_bytes as f64, gpu_name)?;
            info!(slots = llm.slots, llm_share_bytes = llm.share_bytes, "LLM slots from the memory budget; token2wav batches from the rest");
            Ok(TextPlan { llm: cfg.llm.clone(), slots: llm.slots, token2wav: Box::new(admission), token2wav_max_batch: cfg.llm.token2wav_max_bucket })
        }
    }
}

/// The bytes batches may use on `device` (fraction × device memory − other processes − margin,
/// or `memory.budget_bytes`), and the device's name.
fn budget_bytes(cfg: &Config, device: Device) -> Result<(f64, String), SizingError> {
    let m = &cfg.memory;
    let info = match (crate::gpu::memory_info(device), m.budget_bytes) {
        (Ok(i), _) => Some(i),
        (Err(_), Some(_)) => None,
        (Err(source), None) => return Err(SizingError::NoDeviceMemory { device, source }),
    };
    let gpu_name = match (&info, device) {
        (Some(i), _) => i.name.clone(),
        (None, Device::Cpu) => "cpu".to_string(),
        (None, Device::Cuda(_)) => "unknown-gpu".to_string(),
    };
    let budget = match (m.budget_bytes, &info) {
        (Some(bytes), _) => bytes as f64,
        (None, Some(i)) => m.vram_fraction * i.total_bytes as f64 - i.used_by_others_bytes as f64 - m.safety_margin_bytes as f64,
        (None, None) => 0.0,
    };
    if budget <= 0.0 {
        return Err(SizingError::NoBudget {
            gpu: gpu_name,
            fraction: m.vram_fraction * 100.0,
            total: info.as_ref().map(|i| i.total_bytes).unwrap_or(0),
            others: info.as_ref().map(|i| i.used_by_others_bytes).unwrap_or(0),
            budget,
        });
    }
    Ok((budget, gpu_name))
}

/// The memory budget for `device` around the matching calibration profile (or the built-in),
/// and that profile.
pub fn memory_admission(cfg: &Config, manifest: &Manifest, device: Device, precision: Precision) -> Result<(MemoryBudget, Profile), SizingError> {
    let (budget, gpu_name) = budget_bytes(cfg, device)?;
    admission_within(cfg, manifest, device, precision, budget, gpu_name)
}

/// [`memory_admission`] over `budget` bytes of the GPU named `gpu_name`.
fn admission_within(cfg: &Config, manifest: &Manifest, device: Device, precision: Precision, budget: f64, gpu_name: String) -> Result<(MemoryBudget, Profile), SizingError> {
    let m = &cfg.memory;
    let cli_precision = precision;
    let precision = crate::model::compiled::profile_precision(manifest, device, precision, cfg.model.cudnn_benchmark);
    let profile = match profile::load_matching(&m.calibration_dir, &manifest.name, &gpu_name, &precision)? {
        Some(p) => {
            info!(model = %manifest.name, gpu = %gpu_name, %precision, r2 = p.fit.r2, worst_error_of_max_peak = p.fit.worst_error_of_max_peak, "using calibration profile");
            p
        }
        None => {
            warn!(
                "no calibration profile for model {} on {gpu_name} {precision} in {}; using a conservative built-in. \
                 Run `voxbatch calibrate --model {} --device {device} --precision {cli_precision}` for full batches",
                manifest.name,
                m.calibration_dir.display(),
                manifest.dir.display()
            );
            Profile::builtin(&manifest.name, &gpu_name, &precision, manifest.frames_per_token, manifest.samples_per_frame, manifest.weights_bytes())
                .with_quadratic(manifest.attention_bytes_per_frame_squared())
        }
    };
    // What a CosyVoice2 or CosyVoice3 model's flow step graphs may hold on a GPU with an estimator
    // package (what they capture) is not the batches' (the calibrated peaks do not include it).
    let family = manifest.cosyvoice2.is_some() || manifest.cosyvoice3.is_some();
    let graphs = match device {
        Device::Cuda(_) if family && crate::model::compiled::has_estimator_package(&manifest.dir, device, cli_precision) => {
            cfg.model.flow_graphs.reserve_bytes() as f64
        }
        _ => 0.0,
    };
    let budget = budget - graphs;
    let admission = MemoryBudget::new(profile.fit.model, manifest.frames_per_token as usize, budget, cfg.batching.max_batch_tokens, m.aimd);
    info!(budget_bytes = budget as u64, flow_graph_reserve_bytes = graphs as u64, gpu = %gpu_name, source = %profile.source, "batch sizing: predicted peak memory under budget");
    Ok((admission, profile))
}

/// How a profile reads in a bench table.
pub fn describe(profile: &Profile) -> String {
    if profile.source == "built-in" {
        "built-in (no calibration)".to_string()
    } else {
        format!("calibrated {} (R² {:.4}, worst error {:.1}% of the largest peak)", profile.created_at, profile.fit.r2, profile.fit.worst_error_of_max_peak * 100.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_text_batch_fills_the_slots_but_never_holds_more_than_max_hold_of_work() {
        // The H200 at its measured 200 audio-s/s, max_hold 5 min: 60,000 s of audio = 1.5 M
        // tokens would be allowed; 512 slots × 250 × 8 fills = 1,024,000 is the binding cap.
        assert_eq!(text_batch_tokens(512, Duration::from_secs(300), 200.0), 1_024_000);
        // A device estimated at 20 audio-s/s: 5 min of work is 6,000 s of audio = 150,000 tokens.
        assert_eq!(text_batch_tokens(512, Duration::from_secs(300), 20.0), 150_000);
        assert_eq!(text_batch_tokens(8, Duration::from_secs(300), 200.0), 16_000);
    }

    #[test]
    fn a_text_batch_holds_max_text_jobs_when_set_else_eight_fills_of_the_slots() {
        // Issue 39, item 6: `batching.max_batch` caps token2wav buckets for text models; their
        // batches of jobs have a cap of their own, named and honoured.
        assert_eq!(text_batch_jobs(None, 8), 64);
        assert_eq!(text_batch_jobs(Some(4), 8), 4);
        assert_eq!(text_batch_jobs(Some(4), 512), 4);
    }
}
