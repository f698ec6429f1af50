//! Calibration: measure a model's peak memory over batch size × padded length and fit the memory
//! model the batch policy sizes batches with.
//!
//! Sweeps lengths (powers of two, in input tokens) and batch sizes (powers of two), running one
//! forward pass per point on the inference thread and reading its peak memory (CUDA caching
//! allocator peak, reset between points; CPU peak resident set). A batch-size sweep stops at an
//! out-of-memory error or when the peak passes the ceiling (`vram_fraction` × total); the length
//! sweep stops when even one job passes it. Then `peak(B, L) = M0 + B·(a·L + b·L²)` is fitted.
//!
//! Neighbours: `model` runs the passes; `batch::memory` holds the fit and the profile format;
//! `worker` loads the profile this writes.

use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};

use crate::batch::memory::{fit, CalibrationPoint, Profile};
use crate::model::{Device, ModelError, ModelHandle, SynthItem};

/// Errors of calibration.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CalibrateError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("cannot read the memory of {device}: {reason}")]
    Memory { device: Device, reason: String },
    #[error("the model produced no peak-memory readings on {0} (is the libtorch shim built with CUDA?)")]
    NoReadings(Device),
    #[error("only {0} calibration point(s) fit under the ceiling; lower --min-tokens or raise --vram-fraction")]
    TooFewPoints(usize),
    #[error(
        "the peaks do not follow batch × length (fit R² {r2:.3}, worst error {:.0}% > {:.0}%): no profile written{hint}",
        worst_rel_error * 100.0,
        MAX_FIT_ERROR * 100.0
    )]
    PoorFit { r2: f64, worst_rel_error: f64, hint: &'static str },
}

/// The largest error a profile may make on its own points: the memory policy sizes batches by it.
/// Calibrations on GPUs fit within 5 % (docs/PERFORMANCE.md); cuDNN's benchmark mode did not (97 %:
/// its algorithm searches take workspaces of whatever memory is free, 9–33 GiB even at batch 1 or 2).
pub const MAX_FIT_ERROR: f64 = 0.25;

/// Whether a fit is good enough to size batches by ([`MAX_FIT_ERROR`]); `cudnn_benchmark` adds
/// the likely reason to the error.
pub fn accept_fit(fit: &crate::batch::memory::Fit, cudnn_benchmark: bool) -> Result<(), CalibrateError> {
    if fit.worst_rel_error.is_finite() && fit.worst_rel_error <= MAX_FIT_ERROR {
        return Ok(());
    }
    let hint = if cudnn_benchmark {
        " — cuDNN benchmark mode is on ([model] cudnn_benchmark): each new shape's algorithm search takes \
         workspaces of whatever memory is free, which no batch × length model predicts; calibrate with it off"
    } else {
        ""
    };
    Err(CalibrateError::PoorFit { r2: fit.r2, worst_rel_error: fit.worst_rel_error, hint })
}

/// What to sweep.
#[derive(Debug, Clone)]
pub struct CalibrateOptions {
    pub vram_fraction: f64,
    pub min_tokens: usize,
    pub max_tokens: usize,
    pub max_batch: usize,
    /// Stop sweeping after this long (the fit uses what was measured).
    pub time_budget: Duration,
    pub seed: u64,
}

impl Default for CalibrateOptions {
    fn default() -> Self {
        CalibrateOptions { vram_fraction: 0.8, min_tokens: 16, max_tokens: 4096, max_batch: 1024, time_budget: Duration::from_secs(600), seed: 7 }
    }
}

/// Random token ids (never 0, the padding id) for `batch` jobs of `len` tokens.
pub fn synthetic_batch(rng: &mut rand::rngs::StdRng, batch: usize, len: usize, vocab: i64, voices: usize) -> Vec<SynthItem> {
    (0..batch)
        .map(|_| SynthItem::tokens((0..len).map(|_| rng.gen_range(1..vocab.max(2))).collect(), rng.gen_range(0..voices.max(1)) as i64))
        .collect()
}

/// Runs the sweep and fits the profile. `progress(point)` is called after each measured point.
pub async fn calibrate(
    model: &ModelHandle,
    opts: &CalibrateOptions,
    mut progress: impl FnMut(&CalibrationPoint),
) -> Result<Profile, CalibrateError> {
    let manifest = model.manifest().clone();
    let device = model.device();
    // NVML (the memory and the architecture the profile's kernels label needs): off the async runtime.
    let (man, precision, cudnn_benchmark) = (manifest.clone(), model.precision(), model.cudnn_benchmark());
    let profile_precision = tokio::task::spawn_blocking(move || crate::model::compiled::profile_precision(&man, device, precision, cudnn_benchmark))
        .await
        .map_err(|e| CalibrateError::Memory { device, reason: e.to_string() })?;
    let info = tokio::task::spawn_blocking(move || crate::gpu::memory_info(device))
        .await
        .map_err(|e| CalibrateError::Memory { device, reason: e.to_string() })?
        .map_err(|e| CalibrateError::Memory { device, reason: e.to_string() })?;
    let ceiling = opts.vram_fraction * info.total_bytes as f64;
    let vocab = manifest.vocab_size();
    let mut rng = rand::rngs::StdRng::seed_from_u64(opts.seed);
    let started = Instant::now();
    // Warm-up: the first pass loads kernels and allocator pools.
    model.synthesize(synthetic_batch(&mut rng, 1, opts.min_tokens, vocab, manifest.voices.len())).await?;

    let mut points = Vec::new();
    let mut len = opts.min_tokens.max(1);
    'lengths: while len <= opts.max_tokens {
        let mut batch = 1;
        while batch <= opts.max_batch {
            if started.elapsed() > opts.time_budget {
                tracing::warn!("calibration time budget spent; fitting what was measured");
                break 'lengths;
            }
            let items = synthetic_batch(&mut rng, batch, len, vocab, manifest.voices.len());
            let t0 = Instant::now();
            match model.synthesize(items).await {
                Ok(out) => {
                    let peak = out.peak_bytes.ok_or(CalibrateError::NoReadings(device))?;
                    let point = CalibrationPoint {
                        batch,
                        len_tokens: len,
                        len_frames: len * manifest.frames_per_token as usize,
                        peak_bytes: peak,
                        latency_ms: t0.elapsed().as_secs_f64() * 1000.0,
                    };
                    progress(&point);
                    points.push(point);
                    if peak as f64 > ceiling {
                        if batch == 1 {
                            break 'lengths;
                        }
                        break;
                    }
                }
                Err(e) if e.is_oom() => {
                    tracing::info!(batch, len, "out of memory: end of this sweep");
                    if batch == 1 {
                        break 'lengths;
                    }
                    break;
                }
                Err(e) => return Err(e.into()),
            }
            batch *= 2;
        }
        len *= 2;
    }
    // Points over the ceiling are outside the range batches will use; keep them only if needed.
    let under: Vec<CalibrationPoint> = points.iter().filter(|p| (p.peak_bytes as f64) <= ceiling).cloned().collect();
    let used = if under.len() >= 3 { under } else { points.clone() };
    let fitted = fit(&used).ok_or(CalibrateError::TooFewPoints(used.len()))?;
    accept_fit(&fitted, cudnn_benchmark)?;
    Ok(Profile {
        model: manifest.name.clone(),
        gpu: info.name,
        precision: profile_precision,
        source: "calibration".to_string(),
        frames_per_token: manifest.frames_per_token,
        total_memory_bytes: info.total_bytes,
        vram_fraction: opts.vram_fraction,
        fit: fitted,
        points: used,
        created_at: chrono::Utc::now().to_rfc3339(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::memory::{Fit, MemoryModel};

    fn fit_with(worst_rel_error: f64) -> Fit {
        Fit { model: MemoryModel { m0: 5e8, a: 3e5, b: 0.0 }, r2: 0.9, worst_rel_error }
    }

    #[test]
    fn a_fit_that_misses_its_own_points_is_refused_and_names_cudnn_benchmark_mode_when_on() {
        // The H200's calibrations fit within 5 %; session 19's benchmark-mode sweep on an H100 missed by 97 %.
        assert!(accept_fit(&fit_with(0.045), false).is_ok());
        assert!(accept_fit(&fit_with(MAX_FIT_ERROR), true).is_ok());
        let plain = accept_fit(&fit_with(0.97), false).unwrap_err().to_string();
        assert!(plain.contains("no profile written") && plain.contains("97%") && !plain.contains("cudnn"), "{plain}");
        let bench = accept_fit(&fit_with(0.97), true).unwrap_err().to_string();
        assert!(bench.contains("cudnn_benchmark"), "{bench}");
        assert!(accept_fit(&fit_with(f64::NAN), false).is_err(), "a fit with no error figure is not a fit");
    }
}
