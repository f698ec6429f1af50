//! Reading job files for `voxbatch enqueue`: `.txt` (one job per non-empty line) and `.jsonl`
//! (one job object per line; `job_id` optional, generated when absent).
//!
//! Every line is validated before anything is published: a file with a bad line is refused whole,
//! with each bad line's number and reason, so nothing is half-enqueued.
//!
//! Neighbours: `job` validates each line; `queue::Publisher` publishes the result.

use std::path::Path;

use serde_json::Value;

use crate::config::Limits;
use crate::job::{parse_job, Job, Rejection};

/// Errors reading a job file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EnqueueError {
    #[error("cannot read {path}")]
    Read { path: String, source: std::io::Error },
    #[error("{path}: unknown file type; use .txt (one job per line) or .jsonl (one JSON job per line)")]
    UnknownFormat { path: String },
    #[error("{path}: {count} invalid line(s), nothing was enqueued:\n{details}")]
    InvalidLines { path: String, count: usize, details: String },
    #[error("{path}: no jobs (the file has no non-empty lines)")]
    Empty { path: String },
}

/// Defaults applied to lines that do not set them.
#[derive(Debug, Clone, Default)]
pub struct LineDefaults {
    pub campaign: Option<String>,
    pub voice: Option<String>,
}

/// Reads and validates every job of `path`.
pub fn read_jobs(path: &Path, defaults: &LineDefaults, limits: &Limits) -> Result<Vec<Job>, EnqueueError> {
    let shown = path.display().to_string();
    let jsonl = match path.extension().and_then(|e| e.to_str()) {
        Some("txt") => false,
        Some("jsonl") | Some("ndjson") => true,
        _ => return Err(EnqueueError::UnknownFormat { path: shown }),
    };
    let bytes = std::fs::read(path).map_err(|source| EnqueueError::Read { path: shown.clone(), source })?;
    let mut jobs = Vec::new();
    let mut errors: Vec<(usize, Rejection)> = Vec::new();
    for (n, line) in bytes.split(|&b| b == b'\n').enumerate() {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let body = if jsonl { with_defaults_jsonl(line, defaults) } else { with_defaults_txt(line, defaults) };
        match parse_job(&body, limits, None, false) {
            Ok(job) => jobs.push(job),
            Err(e) => errors.push((n + 1, e)),
        }
    }
    if !errors.is_empty() {
        let count = errors.len();
        let mut details: Vec<String> = errors.iter().take(20).map(|(n, e)| format!("  line {n}: {e}")).collect();
        if count > 20 {
            details.push(format!("  … and {} more", count - 20));
        }
        return Err(EnqueueError::InvalidLines { path: shown, count, details: details.join("\n") });
    }
    if jobs.is_empty() {
        return Err(EnqueueError::Empty { path: shown });
    }
    Ok(jobs)
}

fn insert_defaults(obj: &mut serde_json::Map<String, Value>, defaults: &LineDefaults) {
    for (field, value) in [("campaign", &defaults.campaign), ("voice", &defaults.voice)] {
        if let Some(v) = value {
            obj.entry(field).or_insert_with(|| Value::String(v.clone()));
        }
    }
}

fn with_defaults_txt(line: &[u8], defaults: &LineDefaults) -> Vec<u8> {
    let Ok(text) = std::str::from_utf8(line) else {
        return line.to_vec(); // parse_job reports the invalid UTF-8
    };
    let mut obj = serde_json::Map::new();
    obj.insert("text".into(), Value::String(text.trim().to_string()));
    insert_defaults(&mut obj, defaults);
    serde_json::to_vec(&Value::Object(obj)).unwrap_or_default()
}

fn with_defaults_jsonl(line: &[u8], defaults: &LineDefaults) -> Vec<u8> {
    match serde_json::from_slice::<Value>(line) {
        Ok(Value::Object(mut obj)) => {
            insert_defaults(&mut obj, defaults);
            serde_json::to_vec(&Value::Object(obj)).unwrap_or_default()
        }
        _ => line.to_vec(), // parse_job reports what is wrong
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn txt_lines_become_jobs_with_the_given_campaign_and_voice() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.txt");
        std::fs::write(&p, "Hello world.\n\n  你好，世界。 \r\n").unwrap();
        let d = LineDefaults { campaign: Some("book".into()), voice: Some("narrator".into()) };
        let jobs = read_jobs(&p, &d, &Limits::default()).unwrap();
        assert_eq!(jobs.len(), 2);
        assert_eq!(jobs[1].text, "你好，世界。");
        assert!(jobs.iter().all(|j| j.campaign == "book" && j.voice == "narrator"));
        assert_ne!(jobs[0].job_id, jobs[1].job_id);
    }

    #[test]
    fn jsonl_keeps_its_own_fields_and_bad_lines_refuse_the_whole_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.jsonl");
        std::fs::write(&p, "{\"text\":\"a\",\"campaign\":\"own\"}\n{\"text\":\"b\"}\n").unwrap();
        let d = LineDefaults { campaign: Some("flag".into()), voice: None };
        let jobs = read_jobs(&p, &d, &Limits::default()).unwrap();
        assert_eq!((jobs[0].campaign.as_str(), jobs[1].campaign.as_str()), ("own", "flag"));
        std::fs::write(&p, "{\"text\":\"a\"}\nnot json\n{\"text\":\"\"}\n").unwrap();
        let e = read_jobs(&p, &d, &Limits::default()).unwrap_err().to_string();
        assert!(e.contains("2 invalid line(s)") && e.contains("line 2") && e.contains("line 3"), "{e}");
        let q = dir.path().join("a.csv");
        std::fs::write(&q, "x").unwrap();
        assert!(matches!(read_jobs(&q, &d, &Limits::default()), Err(EnqueueError::UnknownFormat { .. })));
    }
}
