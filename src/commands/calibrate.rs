//! `voxbatch calibrate`: measure peak memory over batch × length, fit and save the profile.

use std::path::{Path, PathBuf};

use super::{load_model, CommandError};
use crate::batch::memory::{CalibrationPoint, Profile};
use crate::config::Config;

/// Calibrates the configured model on the configured device and precision, saves the profile
/// under `memory.calibration_dir`, and records it in Postgres unless `record` is false.
pub async fn calibrate(
    cfg: &Config,
    opts: &crate::calibrate::CalibrateOptions,
    record: bool,
    progress: impl FnMut(&CalibrationPoint),
) -> Result<(Profile, PathBuf), CommandError> {
    let model = load_model(cfg, cfg.model.device).await?;
    let profile = crate::calibrate::calibrate(&model, opts, progress).await?;
    let (dir, p) = (cfg.memory.calibration_dir.clone(), profile.clone());
    let path = tokio::task::spawn_blocking(move || crate::sizing::profile::save(&p, &dir))
        .await
        .map_err(|e| CommandError::Usage(format!("profile writer stopped: {e}")))??;
    if record {
        let db = super::open_db(cfg).await?;
        db.record_calibration(&profile).await?;
    }
    Ok((profile, path))
}

/// The header of the points table `calibrate` prints as it measures.
pub fn calibration_point_header() -> String {
    format!("{:>6} {:>7} {:>8} {:>12} {:>11}\n", "batch", "tokens", "frames", "peak_mib", "latency_ms")
}

/// One measured point, a line under [`calibration_point_header`].
pub fn calibration_point_text(p: &CalibrationPoint) -> String {
    format!("{:>6} {:>7} {:>8} {:>12.1} {:>11.1}\n", p.batch, p.len_tokens, p.len_frames, p.peak_bytes as f64 / 1048576.0, p.latency_ms)
}

/// The fit and where the profile went.
pub fn calibrated_text(profile: &Profile, path: &Path, recorded: bool) -> String {
    let f = &profile.fit;
    format!(
        "fit: peak(B, L) = {:.3} GiB + B·({:.1}·L + {:.4}·L²) bytes, L = longest output in frames\n     R² = {:.5}, worst error = {:.2}% of the largest peak ({:.2}% of its own peak) over {} points\n\
         profile for {} on {} {}: {}{}\n",
        f.model.m0 / (1u64 << 30) as f64,
        f.model.a,
        f.model.b,
        f.r2,
        f.worst_error_of_max_peak * 100.0,
        f.worst_rel_error * 100.0,
        profile.points.len(),
        profile.model,
        profile.gpu,
        profile.precision,
        path.display(),
        if recorded { " (and table calibrations)" } else { "" }
    )
}
