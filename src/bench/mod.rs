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
