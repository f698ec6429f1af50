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
        "the peaks do not follow batch × length (fit R² {r2:.3}, worst error {:.0}% of the largest peak > {:.0}%): no profile written{hint}",
        worst_error * 100.0,
        MAX_FIT_ERROR * 100.0
    )]
    PoorFit { r2: f64, worst_error: f64, hint: &'static str },
}

/// The largest error a profile may make on its own points, as a share of the largest peak
/// measured (`Fit::worst_error_of_max_peak`): the memory policy sizes batches against a budget in
/// bytes by it. GPU calibrations fit within 2 % (docs/PERFORMANCE.md: 0.01 % for the eager port on
/// the H200, 1.6 % for the compiled token2wav on an H100, whose small batches carry a bounded
/// offset); cuDNN's benchmark mode did not (33–47 %: its algorithm searches take workspaces of
/// whatever memory is free, 9–33 GiB even at batch 1 or 2).
pub const MAX_FIT_ERROR: f64 = 0.10;

/// Whether a fit is good enough to size batches by ([`MAX_FIT_ERROR`]); `cudnn_benchmark` adds
/// the likely reason to the error.
pub fn accept_fit(fit: &crate::batch::memory::Fit, cudnn_benchmark: bool) -> Result<(), CalibrateError> {
    if fit.worst_error_of_max_peak.is_finite() && fit.worst_error_of_max_peak <= MAX_FIT_ERROR {
        return Ok(());
    }
    let hint = if cudnn_benchmark {
        " — cuDNN benchmark mode is on ([model] cudnn_benchmark): each new shape's algorithm search takes \
         workspaces of whatever memory is free, which no batch × length model predicts; calibrate with it off"
    } else {
        ""
    };
    Err(CalibrateError::PoorFit { r2: fit.r2, worst_error: fit.worst_error_of_max_peak, hint })
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
    use crate::batch::memory::{CalibrationPoint, Fit, MemoryModel};

    fn fit_with(worst_error_of_max_peak: f64) -> Fit {
        Fit { model: MemoryModel { m0: 5e8, a: 3e5, b: 0.0 }, r2: 0.9, worst_rel_error: 0.5, worst_error_of_max_peak }
    }

    #[test]
    fn a_fit_that_misses_its_own_points_is_refused_and_names_cudnn_benchmark_mode_when_on() {
        assert!(accept_fit(&fit_with(0.016), false).is_ok());
        assert!(accept_fit(&fit_with(MAX_FIT_ERROR), true).is_ok());
        let plain = accept_fit(&fit_with(0.47), false).unwrap_err().to_string();
        assert!(plain.contains("no profile written") && plain.contains("47% of the largest peak") && !plain.contains("cudnn"), "{plain}");
        let bench = accept_fit(&fit_with(0.47), true).unwrap_err().to_string();
        assert!(bench.contains("cudnn_benchmark"), "{bench}");
        assert!(accept_fit(&fit_with(f64::NAN), false).is_err(), "a fit with no error figure is not a fit");
    }

    /// Batch, mel frames, peak MiB: `voxbatch calibrate` of the compiled token2wav (both packages,
    /// `time-major-strided-copy`) on an H100, 2026-12-05
    /// (bench/results/2026-12-05-h100-s20-e-calibrate-compiled-copy.log): small batches carry an
    /// offset that grows with length to ≈ 1.2 GiB and stops there. One row per length.
    const COMPILED_H100: &[(usize, usize, f64)] = &[
        (1, 32, 533.6), (2, 32, 579.0), (4, 32, 632.5), (8, 32, 706.5), (16, 32, 827.8), (32, 32, 1023.0), (64, 32, 1392.1), (128, 32, 2098.8), (256, 32, 3476.8),
        (1, 64, 906.6), (2, 64, 960.7), (4, 64, 1035.1), (8, 64, 1154.4), (16, 64, 1348.6), (32, 64, 1718.1), (64, 64, 2420.8), (128, 64, 3794.0), (256, 64, 6415.0),
        (1, 128, 1242.8), (2, 128, 1318.3), (4, 128, 1435.2), (8, 128, 1628.1), (16, 128, 1992.8), (32, 128, 2685.8), (64, 128, 4039.4), (128, 128, 6661.0), (256, 128, 11906.2),
        (1, 256, 1502.9), (2, 256, 1619.6), (4, 256, 1813.9), (8, 256, 2181.3), (16, 256, 2880.0), (32, 256, 4243.9), (64, 256, 6865.1), (128, 256, 12109.7), (256, 256, 22601.7),
        (1, 512, 1808.5), (2, 512, 1997.6), (4, 512, 2305.8), (8, 512, 2972.0), (16, 512, 4303.0), (32, 512, 6925.3), (64, 512, 12170.7), (128, 512, 22661.9), (256, 512, 43642.7),
        (1, 1024, 2013.7), (2, 1024, 2343.5), (4, 1024, 3002.3), (8, 1024, 4322.9), (16, 1024, 6945.5), (32, 1024, 12190.8), (64, 1024, 22681.1), (128, 1024, 43661.9),
    ];
    /// The same packages with cuDNN's benchmark mode, same session
    /// (…-s20-c-calibrate-compiled-cudnn-benchmark.log).
    const COMPILED_H100_CUDNN_BENCHMARK: &[(usize, usize, f64)] = &[
        (1, 32, 534.9), (2, 32, 9042.2), (4, 32, 9111.0), (8, 32, 9248.5), (16, 32, 9580.3), (32, 32, 10211.9), (64, 32, 11444.8), (128, 32, 13873.8), (256, 32, 18699.3),
        (1, 64, 34232.4), (2, 64, 34333.3), (4, 64, 34535.1), (8, 64, 35123.2), (16, 64, 36264.9), (32, 64, 38521.5), (64, 64, 42995.6), (128, 64, 51909.4), (256, 64, 69613.0),
        (1, 128, 34379.2), (2, 128, 34559.0), (4, 128, 34883.5), (8, 128, 35498.8), (16, 128, 36701.4), (32, 128, 39067.9), (64, 128, 43769.8), (128, 128, 53087.9), (256, 128, 71732.1),
    ];

    fn fit_of(points: &[(usize, usize, f64)]) -> Fit {
        let points: Vec<CalibrationPoint> = points
            .iter()
            .map(|&(batch, len_frames, mib)| CalibrationPoint { batch, len_tokens: len_frames / 2, len_frames, peak_bytes: (mib * 1048576.0) as u64, latency_ms: 0.0 })
            .collect();
        crate::batch::memory::fit(&points).unwrap()
    }

    #[test]
    fn the_compiled_token2wavs_measured_peaks_are_fitted_in_bytes_and_benchmark_modes_are_refused() {
        let fit = fit_of(COMPILED_H100);
        assert!(accept_fit(&fit, false).is_ok(), "{fit:?}");
        assert!(fit.worst_error_of_max_peak < 0.02, "{fit:?}");
        // The batches the budget sizes: every peak over a quarter of the largest within 3 %.
        let largest = COMPILED_H100.iter().map(|p| p.2).fold(0.0, f64::max);
        for &(batch, frames, mib) in COMPILED_H100.iter().filter(|p| p.2 > largest / 4.0) {
            let predicted = fit.model.predict(batch, frames) / 1048576.0;
            assert!((predicted / mib - 1.0).abs() < 0.03, "batch {batch} × {frames} frames: {predicted:.0} MiB predicted, {mib} measured");
        }
        let searched = fit_of(COMPILED_H100_CUDNN_BENCHMARK);
        assert!(accept_fit(&searched, true).is_err(), "{searched:?}");
    }
}
