//! Calibration profiles on disk: `<dir>/<model>__<gpu>__<precision>.json`.
//!
//! Neighbours: `calibrate` writes them; `sizing` reads the one matching a worker's model, GPU and
//! precision; `batch::memory::Profile` is the data.

use std::path::{Path, PathBuf};

use crate::batch::memory::{slug, Fit, Profile};

/// Errors reading or writing a profile.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProfileError {
    #[error("cannot read calibration profile {path}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path} is not a calibration profile")]
    Parse { path: PathBuf, source: serde_json::Error },
    #[error("{path} is for {found}, not {wanted}; run `voxbatch calibrate` again or remove it")]
    Mismatch { path: PathBuf, found: String, wanted: String },
    #[error("cannot write calibration profile {path}")]
    Write { path: PathBuf, source: std::io::Error },
    #[error("cannot serialise the calibration profile")]
    Serialize(#[source] serde_json::Error),
}

/// Where the profile of `model` on `gpu` at `precision` lives under `dir`.
pub fn path(dir: &Path, model: &str, gpu: &str, precision: &str) -> PathBuf {
    dir.join(Profile::file_name(model, gpu, precision))
}

/// The matching profile under `dir`, `None` when there is none. How well its model fits is
/// measured again from its points (`Fit::of`): a profile written before a statistic existed, or
/// whose model was edited by hand, reads with the figures of what it holds.
pub fn load_matching(dir: &Path, model: &str, gpu: &str, precision: &str) -> Result<Option<Profile>, ProfileError> {
    let path = path(dir, model, gpu, precision);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(ProfileError::Read { path, source }),
    };
    let mut p: Profile = serde_json::from_str(&text).map_err(|source| ProfileError::Parse { path: path.clone(), source })?;
    if !p.points.is_empty() {
        p.fit = Fit::of(p.fit.model, &p.points);
    }
    if p.model != model || slug(&p.gpu) != slug(gpu) || p.precision != precision {
        let found = format!("{} on {} {}", p.model, p.gpu, p.precision);
        return Err(ProfileError::Mismatch { path, found, wanted: format!("{model} on {gpu} {precision}") });
    }
    Ok(Some(p))
}

/// Writes `profile` under `dir` (created if missing); returns its path.
pub fn save(profile: &Profile, dir: &Path) -> Result<PathBuf, ProfileError> {
    let path = path(dir, &profile.model, &profile.gpu, &profile.precision);
    let bytes = serde_json::to_vec_pretty(profile).map_err(ProfileError::Serialize)?;
    std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::write(&path, bytes))
        .map_err(|source| ProfileError::Write { path: path.clone(), source })?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_round_trip_and_must_match() {
        let dir = tempfile::tempdir().unwrap();
        let p = Profile::builtin("reference-tiny", "NVIDIA H200", "bf16", 6, 240, 1000);
        let path = save(&p, dir.path()).unwrap();
        assert!(path.ends_with("reference-tiny__nvidia-h200__bf16.json"));
        assert_eq!(load_matching(dir.path(), "reference-tiny", "NVIDIA H200", "bf16").unwrap(), Some(p));
        assert_eq!(load_matching(dir.path(), "reference-tiny", "NVIDIA H200", "fp32").unwrap(), None);
    }

    #[test]
    fn a_broken_or_mismatched_profile_is_an_error_not_a_silent_default() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(path(dir.path(), "m", "gpu", "bf16"), "{ not json").unwrap();
        assert!(matches!(load_matching(dir.path(), "m", "gpu", "bf16"), Err(ProfileError::Parse { .. })));
        let other = Profile::builtin("other", "gpu", "bf16", 6, 240, 1000);
        std::fs::write(path(dir.path(), "m", "gpu", "fp16"), serde_json::to_vec(&other).unwrap()).unwrap();
        let e = load_matching(dir.path(), "m", "gpu", "fp16").unwrap_err();
        assert!(e.to_string().contains("is for other on gpu bf16"), "{e}");
    }

    #[test]
    fn a_profile_written_before_the_largest_peak_error_existed_reads_with_it_measured_from_its_points() {
        // The H200 profile of 2026-12-02 holds `worst_rel_error` only.
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("calibration");
        let text = std::fs::read_to_string(path(&repo, "reference-large", "NVIDIA H200", "bf16")).unwrap();
        assert!(!text.contains("worst_error_of_max_peak"));
        let p = load_matching(&repo, "reference-large", "NVIDIA H200", "bf16").unwrap().unwrap();
        let stored: Profile = serde_json::from_str(&text).unwrap();
        assert_eq!(stored.fit.worst_error_of_max_peak, 0.0, "serde's default");
        assert!(p.fit.worst_error_of_max_peak > 1e-6 && p.fit.worst_error_of_max_peak <= p.fit.worst_rel_error, "{:?}", p.fit);
        assert_eq!(p.fit.model, stored.fit.model);
        assert!((p.fit.worst_rel_error - stored.fit.worst_rel_error).abs() < 1e-12 && (p.fit.r2 - stored.fit.r2).abs() < 1e-12);

        // A model edited by hand reads with the error of what it now predicts.
        let dir = tempfile::tempdir().unwrap();
        let mut edited = stored.clone();
        edited.fit.model.m0 += 0.5 * p.points.iter().map(|q| q.peak_bytes as f64).fold(0.0, f64::max);
        save(&edited, dir.path()).unwrap();
        let read = load_matching(dir.path(), "reference-large", "NVIDIA H200", "bf16").unwrap().unwrap();
        assert!(read.fit.worst_error_of_max_peak >= 0.5, "{:?}", read.fit);
    }
}
