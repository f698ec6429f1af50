//! Benchmarks: they print a table and write JSON (and plots) under `bench/results/`; they are not
//! tests and never assert on time. Every figure quoted in docs/PERFORMANCE.md comes from here.
//!
//! - [`sweetspot`]: the expert's checklist: baseline, precision and quality, batch sweep, knee,
//!   soak, cost table, recommended configuration.
//! - [`policy`]: the memory-aware batch policy against fixed batch sizes on a mixed-length corpus.
//! - [`token2wav`]: CosyVoice2 token2wav throughput per batch size and precision, time per stage.
//! - [`llm`]: the CosyVoice2 speech-token LM, tokens per second per slot count, against the reference.
//!
//! Neighbours: `model` runs the passes, `batch` and `sizing` decide the batches, the worker's
//! split-on-failure path runs them (`worker::synthesize_splitting`), `plot` draws.

pub mod corpus;
pub mod llm;
pub mod policy;
pub mod quality;
pub mod sweetspot;
pub mod token2wav;

use std::path::{Path, PathBuf};

/// `bench/results/<name>-<UTC timestamp>/`, created.
pub fn results_dir(root: &Path, name: &str) -> std::io::Result<PathBuf> {
    let dir = root.join(format!("{name}-{}", chrono::Utc::now().format("%Y%m%dT%H%M%SZ")));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// A profile's events added up (`model::profiler`'s rows, longest first): their seconds and
/// count, their time by category (longest first) and the `keep` longest — what both benches'
/// profiles report.
pub struct KernelTotals {
    pub seconds: f64,
    pub events: u64,
    pub by_category: Vec<(String, f64)>,
    pub top: Vec<crate::model::profiler::ProfileRow>,
}

impl KernelTotals {
    pub fn of(rows: Vec<crate::model::profiler::ProfileRow>, keep: usize) -> KernelTotals {
        KernelTotals {
            seconds: rows.iter().map(|r| r.seconds).sum(),
            events: rows.iter().map(|r| r.count).sum(),
            by_category: crate::model::profiler::by_category(&rows).into_iter().map(|(c, s)| (c.to_string(), s)).collect(),
            top: rows.into_iter().take(keep).collect(),
        }
    }
}

/// A profile's Markdown: its events' time by category, then the 25 longest events, each with its
/// share of `event_seconds`.
pub fn kernel_tables(event_seconds: f64, by_category: &[(String, f64)], top: &[crate::model::profiler::ProfileRow]) -> String {
    let share = |secs: f64| 100.0 * secs / event_seconds.max(f64::MIN_POSITIVE);
    let mut s = "| category | seconds | share |\n|---|---:|---:|\n".to_string();
    for (c, secs) in by_category {
        s += &format!("| {c} | {secs:.4} | {:.1} % |\n", share(*secs));
    }
    s += "\n| event | category | calls | seconds | share |\n|---|---|---:|---:|---:|\n";
    for r in top.iter().take(25) {
        let name: String = r.name.chars().take(90).collect();
        s += &format!("| `{name}` | {} | {} | {:.4} | {:.1} % |\n", r.category, r.count, r.seconds, share(r.seconds));
    }
    s
}
