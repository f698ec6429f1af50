//! The peak-memory model and the memory-budget admission rule.
//!
//! `peak(B, L) = M0 + B·(a·L + b·L²)`, with `L` the batch's longest output in frames (input tokens
//! × the model's frames per token) and `B` the batch size, fitted by least squares on calibration
//! points (`voxbatch calibrate`) per model × GPU × precision and saved as a [`Profile`]. The
//! admission rule admits the largest batch whose predicted peak fits the budget
//! (`vram_fraction` × total − other processes − margin) times a safety factor that shrinks
//! multiplicatively after an out-of-memory error and relaxes additively after clean batches (AIMD).
//!
//! Pure code, no I/O: profiles are read and written by `sizing::profile`.


use serde::{Deserialize, Serialize};

use super::{Admission, BatchOutcome, FlushReason};

/// `peak(B, L) = m0 + B·(a·L + b·L²)` in bytes, `L` in output frames.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct MemoryModel {
    pub m0: f64,
    pub a: f64,
    pub b: f64,
}

impl MemoryModel {
    pub fn predict(&self, batch: usize, frames: usize) -> f64 {
        let (bsz, l) = (batch as f64, frames as f64);
        self.m0 + bsz * (self.a * l + self.b * l * l)
    }
}

/// One measured forward pass.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CalibrationPoint {
    pub batch: usize,
    pub len_tokens: usize,
    pub len_frames: usize,
    pub peak_bytes: u64,
    pub latency_ms: f64,
}

/// A fitted model and how well it fits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Fit {
    pub model: MemoryModel,
    /// Coefficient of determination on the raw peaks.
    pub r2: f64,
    /// max |predicted − measured| / measured over the points.
    pub worst_rel_error: f64,
    /// max |predicted − measured| over the points as a share of the largest peak measured: the
    /// error in the terms the budget is in (`calibrate::accept_fit` judges a fit by it). Profiles
    /// written before 2026-12-05 lack it: `sizing::profile::load_matching` measures it again from
    /// their points.
    #[serde(default)]
    pub worst_error_of_max_peak: f64,
}

/// Solves `m x = y` (3×3 at most) by Gaussian elimination with partial pivoting.
fn solve(mut m: Vec<Vec<f64>>, mut y: Vec<f64>) -> Option<Vec<f64>> {
    let n = y.len();
    for col in 0..n {
        let pivot = (col..n).max_by(|&i, &j| m[i][col].abs().total_cmp(&m[j][col].abs()))?;
        if m[pivot][col].abs() < 1e-300 {
            return None;
        }
        m.swap(col, pivot);
        y.swap(col, pivot);
        for row in col + 1..n {
            let f = m[row][col] / m[col][col];
            for k in col..n {
                m[row][k] -= f * m[col][k];
            }
            y[row] -= f * y[col];
        }
    }
    let mut x = vec![0.0; n];
    for row in (0..n).rev() {
        let s: f64 = (row + 1..n).map(|k| m[row][k] * x[k]).sum();
        x[row] = (y[row] - s) / m[row][row];
    }
    Some(x)
}

/// Least squares in bytes of `peak = m0 + B·(a·L + b·L²)`: the budget is in bytes and the batches
/// it sizes are the large ones, so the large peaks weigh most. (Until 2026-12-05 the fit weighed
/// relative errors, every point alike; the compiled token2wav's small batches carry a bounded,
/// length-dependent offset of up to ≈ 1.2 GiB that no batch × length term follows, and fitting it
/// there tilted the model off the large batches by 16 % of the largest peak, where least squares
/// in bytes stays within 1.6 %: H100, docs/PERFORMANCE.md.) Coefficients are kept non-negative:
/// when the full model gives a negative one, the best valid sub-model (`b = 0` or `a = 0`) is
/// used. `None` with fewer than two points.
pub fn fit(points: &[CalibrationPoint]) -> Option<Fit> {
    if points.len() < 2 {
        return None;
    }
    // Scaled features keep the normal equations well conditioned.
    const SA: f64 = 1e3;
    const SB: f64 = 1e6;
    let rows: Vec<([f64; 3], f64)> = points
        .iter()
        .map(|p| {
            let (b, l) = (p.batch as f64, p.len_frames as f64);
            let y = p.peak_bytes as f64;
            ([1.0, b * l / SA, b * l * l / SB], y)
        })
        .collect();
    let mut best: Option<(MemoryModel, f64)> = None;
    for cols in [&[0usize, 1, 2][..], &[0, 1][..], &[0, 2][..]] {
        let k = cols.len();
        let mut m = vec![vec![0.0; k]; k];
        let mut v = vec![0.0; k];
        for (x, y) in &rows {
            for i in 0..k {
                v[i] += x[cols[i]] * y;
                for j in 0..k {
                    m[i][j] += x[cols[i]] * x[cols[j]];
                }
            }
        }
        let Some(sol) = solve(m, v) else { continue };
        let mut coef = [0.0; 3];
        for (i, &c) in cols.iter().enumerate() {
            coef[c] = sol[i];
        }
        if coef.iter().any(|c| *c < 0.0 || !c.is_finite()) {
            continue;
        }
        let model = MemoryModel { m0: coef[0], a: coef[1] / SA, b: coef[2] / SB };
        let sse: f64 = points.iter().map(|p| (model.predict(p.batch, p.len_frames) - p.peak_bytes as f64).powi(2)).sum();
        if best.as_ref().is_none_or(|(_, e)| sse < *e) {
            best = Some((model, sse));
        }
    }
    let (model, _) = best?;
    Some(Fit::of(model, points))
}

impl Fit {
    /// `model` and how well it fits `points` (at least one).
    pub fn of(model: MemoryModel, points: &[CalibrationPoint]) -> Fit {
        let errors: Vec<(f64, f64)> =
            points.iter().map(|p| ((model.predict(p.batch, p.len_frames) - p.peak_bytes as f64).abs(), p.peak_bytes as f64)).collect();
        let mean = errors.iter().map(|(_, y)| y).sum::<f64>() / errors.len().max(1) as f64;
        let ss_tot: f64 = errors.iter().map(|(_, y)| (y - mean).powi(2)).sum();
        let ss_res: f64 = errors.iter().map(|(e, _)| e * e).sum();
        let r2 = if ss_tot > 0.0 { 1.0 - ss_res / ss_tot } else { 1.0 };
        let worst_rel_error = errors.iter().map(|(e, y)| e / y.max(1.0)).fold(0.0, f64::max);
        let max_peak = errors.iter().map(|(_, y)| *y).fold(1.0, f64::max);
        let worst_error_of_max_peak = errors.iter().map(|(e, _)| *e).fold(0.0, f64::max) / max_peak;
        Fit { model, r2, worst_rel_error, worst_error_of_max_peak }
    }
}

/// A calibration profile: the fitted model for one model × GPU × precision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    pub model: String,
    /// NVML device name, or "cpu".
    pub gpu: String,
    pub precision: String,
    /// "calibration" or "built-in".
    pub source: String,
    pub frames_per_token: u32,
    pub total_memory_bytes: u64,
    pub vram_fraction: f64,
    pub fit: Fit,
    #[serde(default)]
    pub points: Vec<CalibrationPoint>,
    pub created_at: String,
}

/// File-name-safe form of a name ("NVIDIA H200" → "nvidia-h200").
pub fn slug(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c.to_ascii_lowercase());
        } else if !out.ends_with('-') {
            out.push('-');
        }
    }
    out.trim_matches('-').to_string()
}

impl Profile {
    pub fn file_name(model: &str, gpu: &str, precision: &str) -> String {
        format!("{}__{}__{}.json", slug(model), slug(gpu), slug(precision))
    }

    /// The conservative built-in used when no calibration exists: weights kept three times over,
    /// and 512 live fp32 values per output sample (more than any CNN vocoder stack holds).
    pub fn builtin(model: &str, gpu: &str, precision: &str, frames_per_token: u32, samples_per_frame: u32, weights_bytes: u64) -> Profile {
        let per_frame = 4.0 * 512.0 * f64::from(samples_per_frame);
        Profile {
            model: model.to_string(),
            gpu: gpu.to_string(),
            precision: precision.to_string(),
            source: "built-in".to_string(),
            frames_per_token,
            total_memory_bytes: 0,
            vram_fraction: 0.0,
            fit: Fit { model: MemoryModel { m0: 3.0 * weights_bytes as f64, a: per_frame, b: 0.0 }, r2: 0.0, worst_rel_error: 0.0, worst_error_of_max_peak: 0.0 },
            points: Vec::new(),
            created_at: String::new(),
        }
    }

    /// The built-in with `bytes` per item per (output frame)² added: what a model's attention
    /// over all of an item's frames holds at once (`Manifest::attention_bytes_per_frame_squared`;
    /// CosyVoice3's DiT), which no linear term bounds for long items.
    pub fn with_quadratic(mut self, bytes: f64) -> Profile {
        self.fit.model.b += bytes;
        self
    }
}

/// AIMD settings of the safety factor.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Aimd {
    pub initial: f64,
    /// Multiplied into the factor after an out-of-memory error.
    pub backoff: f64,
    /// Added after `recover_after` clean batches in a row, up to 1.
    pub step: f64,
    pub recover_after: u32,
    pub floor: f64,
}

impl Default for Aimd {
    fn default() -> Self {
        Aimd { initial: 0.95, backoff: 0.7, step: 0.02, recover_after: 20, floor: 0.2 }
    }
}

/// Admits a batch when its predicted peak fits `budget × safety` (and the token cap).
#[derive(Debug, Clone)]
pub struct MemoryBudget {
    pub model: MemoryModel,
    pub frames_per_token: usize,
    /// Bytes batches may peak at.
    pub budget_bytes: f64,
    pub max_batch_tokens: usize,
    pub aimd: Aimd,
    safety: f64,
    clean_streak: u32,
}

impl MemoryBudget {
    pub fn new(model: MemoryModel, frames_per_token: usize, budget_bytes: f64, max_batch_tokens: usize, aimd: Aimd) -> Self {
        MemoryBudget { model, frames_per_token, budget_bytes, max_batch_tokens, aimd, safety: aimd.initial, clean_streak: 0 }
    }

    /// The current safety factor.
    pub fn safety(&self) -> f64 {
        self.safety
    }

    /// Largest batch (≤ `cap`) admitted at `max_tokens`.
    pub fn largest_batch(&self, max_tokens: usize, cap: usize) -> usize {
        (1..=cap).rev().find(|&b| self.check(b, max_tokens).is_none()).unwrap_or(1)
    }
}

impl Admission for MemoryBudget {
    fn check(&self, batch: usize, max_tokens: usize) -> Option<FlushReason> {
        if batch * max_tokens > self.max_batch_tokens {
            return Some(FlushReason::Tokens);
        }
        let predicted = self.model.predict(batch, max_tokens * self.frames_per_token);
        (predicted > self.budget_bytes * self.safety).then_some(FlushReason::Memory)
    }

    fn predicted_peak(&self, batch: usize, max_tokens: usize) -> Option<f64> {
        Some(self.model.predict(batch, max_tokens * self.frames_per_token))
    }

    fn observe(&mut self, outcome: &BatchOutcome) {
        match outcome {
            BatchOutcome::OutOfMemory => {
                self.safety = (self.safety * self.aimd.backoff).max(self.aimd.floor);
                self.clean_streak = 0;
            }
            BatchOutcome::Clean => {
                self.clean_streak += 1;
                if self.clean_streak >= self.aimd.recover_after {
                    self.safety = (self.safety + self.aimd.step).min(1.0);
                    self.clean_streak = 0;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pt(batch: usize, frames: usize, m: &MemoryModel) -> CalibrationPoint {
        CalibrationPoint { batch, len_tokens: frames, len_frames: frames, peak_bytes: m.predict(batch, frames) as u64, latency_ms: 1.0 }
    }

    #[test]
    fn the_fit_recovers_known_coefficients() {
        let truth = MemoryModel { m0: 2e9, a: 3e5, b: 40.0 };
        let mut pts = Vec::new();
        for b in [1, 2, 4, 8, 16] {
            for l in [64, 128, 256, 512, 1024] {
                pts.push(pt(b, l, &truth));
            }
        }
        let f = fit(&pts).unwrap();
        assert!((f.model.m0 / truth.m0 - 1.0).abs() < 1e-4, "{f:?}");
        assert!((f.model.a / truth.a - 1.0).abs() < 1e-4, "{f:?}");
        assert!((f.model.b / truth.b - 1.0).abs() < 1e-3, "{f:?}");
        assert!(f.r2 > 0.999999 && f.worst_rel_error < 1e-4 && f.worst_error_of_max_peak < 1e-4);
    }

    #[test]
    fn the_fit_keeps_coefficients_non_negative_and_reports_its_error() {
        // Linear in L with noise: the quadratic term must not go negative.
        let truth = MemoryModel { m0: 1e8, a: 1e4, b: 0.0 };
        let mut pts = Vec::new();
        for (i, (b, l)) in [(1, 100), (2, 100), (4, 200), (8, 400), (1, 800), (16, 50)].into_iter().enumerate() {
            let mut p = pt(b, l, &truth);
            p.peak_bytes = (p.peak_bytes as f64 * if i % 2 == 0 { 1.02 } else { 0.98 }) as u64;
            pts.push(p);
        }
        let f = fit(&pts).unwrap();
        assert!(f.model.m0 >= 0.0 && f.model.a >= 0.0 && f.model.b >= 0.0, "{f:?}");
        assert!(f.worst_rel_error > 0.0 && f.worst_rel_error < 0.1, "{f:?}");
        assert!(fit(&pts[..1]).is_none());
    }

    #[test]
    fn a_quadratic_builtin_charges_long_items_more_than_the_linear_one() {
        // CosyVoice3 full (16 heads: 392 bytes per frame²) on 30-s items (1,500 frames): the
        // attention adds 0.88 GB an item to the linear term's 1.47 GB.
        let linear = Profile::builtin("m", "gpu", "bf16", 2, 480, 1 << 30);
        let with = linear.clone().with_quadratic(2.0 * (3.0 * 16.0 + 1.0) * 4.0);
        let (short, long) = (with.fit.model.predict(1, 100) - linear.fit.model.predict(1, 100), with.fit.model.predict(1, 1500) - linear.fit.model.predict(1, 1500));
        assert!((long - 392.0 * 1500.0 * 1500.0).abs() < 1.0 && (short - 392.0 * 1e4).abs() < 1.0);
        assert_eq!(with.fit.model.predict(4, 1500) - with.fit.model.m0, 4.0 * (with.fit.model.predict(1, 1500) - with.fit.model.m0), "per item");
    }

    #[test]
    fn admission_takes_the_largest_batch_under_the_budget() {
        let m = MemoryModel { m0: 1000.0, a: 10.0, b: 0.0 };
        let mut budget = MemoryBudget::new(m, 2, 10_000.0, 1_000_000, Aimd { initial: 1.0, ..Aimd::default() });
        // 1000 + B·(10·2·L) ≤ 10000 → B·L ≤ 450
        assert_eq!(budget.largest_batch(45, 64), 10);
        assert_eq!(budget.check(10, 45), None);
        assert_eq!(budget.check(11, 45), Some(FlushReason::Memory));
        assert_eq!(budget.largest_batch(1000, 64), 1, "a job too big alone still gets batch size 1");
        budget.max_batch_tokens = 300;
        assert_eq!(budget.check(10, 45), Some(FlushReason::Tokens));
    }

    #[test]
    fn aimd_shrinks_after_oom_and_relaxes_after_clean_batches() {
        let m = MemoryModel { m0: 0.0, a: 1.0, b: 0.0 };
        let aimd = Aimd { initial: 1.0, backoff: 0.5, step: 0.1, recover_after: 3, floor: 0.2 };
        let mut budget = MemoryBudget::new(m, 1, 100.0, usize::MAX, aimd);
        assert_eq!(budget.largest_batch(10, 64), 10);
        budget.observe(&BatchOutcome::OutOfMemory);
        assert_eq!(budget.safety(), 0.5);
        assert_eq!(budget.largest_batch(10, 64), 5);
        for _ in 0..3 {
            budget.observe(&BatchOutcome::OutOfMemory);
        }
        assert_eq!(budget.safety(), 0.2, "never below the floor");
        for _ in 0..2 {
            budget.observe(&BatchOutcome::Clean);
        }
        assert_eq!(budget.safety(), 0.2, "not before `recover_after` clean batches");
        budget.observe(&BatchOutcome::Clean);
        assert!((budget.safety() - 0.3).abs() < 1e-12);
        for _ in 0..100 {
            budget.observe(&BatchOutcome::Clean);
        }
        assert_eq!(budget.safety(), 1.0, "capped at 1");
    }
}
