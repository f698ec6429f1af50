//! `voxbatch calibrate`: measure peak memory over batch × length, fit and save the profile.

use std::path::PathBuf;

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
