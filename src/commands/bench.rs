//! `voxbatch bench …`: run a benchmark and write its results under `bench/results/<name>-<time>/`.

use std::path::{Path, PathBuf};

use super::{io, load_model, CommandError};
use crate::bench::{self, llm, policy, sweetspot, token2wav};
use crate::config::Config;
use crate::model::ModelError;

/// The sweet-spot bench; returns its report and the files written.
pub async fn bench_sweetspot(
    opts: &sweetspot::SweetSpotOptions,
    out_root: &Path,
    progress: impl FnMut(&str),
) -> Result<(sweetspot::SweetSpotReport, Vec<PathBuf>), CommandError> {
    let report = sweetspot::run(opts, progress).await?;
    let paths = write_results(out_root, "sweetspot", report.clone(), |r, dir| sweetspot::write(&r, dir)).await?;
    Ok((report, paths))
}

/// The token2wav bench, CosyVoice2 or CosyVoice3 (on a blocking thread: it drives libtorch directly).
pub async fn bench_token2wav(
    opts: token2wav::Token2WavBenchOptions,
    out_root: &Path,
    progress: impl FnMut(&token2wav::Point) + Send + 'static,
) -> Result<(token2wav::Token2WavReport, Vec<PathBuf>), CommandError> {
    let report = tokio::task::spawn_blocking(move || token2wav::run(&opts, progress)).await.map_err(|_| ModelError::ThreadGone)??;
    let paths = write_results(out_root, "token2wav", report.clone(), |r, dir| token2wav::write(&r, dir)).await?;
    Ok((report, paths))
}

/// The speech-token LM bench (on a blocking thread: it drives libtorch directly).
pub async fn bench_llm(
    opts: llm::LlmBenchOptions,
    out_root: &Path,
    progress: impl FnMut(&llm::Point) + Send + 'static,
) -> Result<(llm::LlmReport, Vec<PathBuf>), CommandError> {
    let report = tokio::task::spawn_blocking(move || llm::run(&opts, progress)).await.map_err(|_| ModelError::ThreadGone)??;
    let paths = write_results(out_root, "llm", report.clone(), |r, dir| llm::write(&r, dir)).await?;
    Ok((report, paths))
}

/// The policy bench with the configured model, device and memory settings.
pub async fn bench_policy(
    cfg: &Config,
    jobs: usize,
    seed: u64,
    policy_only: bool,
    out_root: &Path,
    progress: impl FnMut(&policy::RunResult),
) -> Result<(policy::PolicyReport, Vec<PathBuf>), CommandError> {
    let m = &cfg.model;
    let model = load_model(cfg, m.device).await?;
    let manifest = model.manifest().clone();
    let (c, man, device, precision) = (cfg.clone(), manifest.clone(), m.device, m.precision);
    let (admission, profile, gpu) = tokio::task::spawn_blocking(move || {
        let (admission, profile) = crate::sizing::memory_admission(&c, &man, device, precision)?;
        Ok::<_, crate::sizing::SizingError>((admission, profile.clone(), profile.gpu))
    })
    .await
    .map_err(|_| ModelError::ThreadGone)??;
    let opts = policy::PolicyBenchOptions {
        jobs,
        seed,
        max_batch: cfg.batching.max_batch,
        gpu_name: gpu,
        profile_source: crate::sizing::describe(&profile),
        max_length_ratio: cfg.batching.max_length_ratio,
        policy_only,
    };
    let report = policy::run(&model, admission, &opts, progress).await;
    let paths = write_results(out_root, "policy", report.clone(), |r, dir| policy::write(&r, dir)).await?;
    Ok((report, paths))
}

/// Writes a report under `out_root/<name>-<time>/` on a blocking thread; returns the files.
async fn write_results<T: Send + 'static>(
    out_root: &Path,
    name: &'static str,
    report: T,
    write: impl FnOnce(T, &Path) -> std::io::Result<Vec<PathBuf>> + Send + 'static,
) -> Result<Vec<PathBuf>, CommandError> {
    let root = out_root.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let dir = bench::results_dir(&root, name).map_err(io("create the results directory"))?;
        write(report, &dir).map_err(io("write the results"))
    })
    .await
    .map_err(|_| ModelError::ThreadGone)?
}

/// The policy bench's synthetic corpus as JSONL lines (for `enqueue`): same seed, same texts.
pub fn bench_corpus(jobs: usize, seed: u64) -> Vec<String> {
    let voices = ["default", "narrator", "bright", "deep"];
    bench::corpus::mixed_lengths(jobs, seed)
        .into_iter()
        .enumerate()
        .map(|(i, text)| serde_json::json!({ "text": text, "voice": voices[i % voices.len()] }).to_string())
        .collect()
}

/// A benchmark to run, its options resolved, and where its results go.
pub enum BenchRun {
    SweetSpot(sweetspot::SweetSpotOptions, PathBuf),
    Token2wav(token2wav::Token2WavBenchOptions, PathBuf),
    Llm(llm::LlmBenchOptions, PathBuf),
    /// The policy bench's corpus as JSONL (nothing written).
    Corpus { jobs: usize, seed: u64 },
    /// The policy bench, on the configured model.
    Policy { jobs: usize, seed: u64, policy_only: bool, out: PathBuf },
}

/// Runs `run`, passing each progress line to `progress`; returns the results table (Markdown for
/// the sweet spot, the corpus for `Corpus`) and the files written.
pub async fn bench(cfg: &Config, run: BenchRun, mut progress: impl FnMut(&str) + Send + 'static) -> Result<(String, Vec<PathBuf>), CommandError> {
    Ok(match run {
        BenchRun::SweetSpot(opts, out) => {
            let (report, paths) = bench_sweetspot(&opts, &out, progress).await?;
            (sweetspot::markdown(&report), paths)
        }
        BenchRun::Token2wav(opts, out) => {
            let (report, paths) = bench_token2wav(opts, &out, move |p| progress(&token2wav_point_text(p))).await?;
            (token2wav::table(&report), paths)
        }
        BenchRun::Llm(opts, out) => {
            let (report, paths) = bench_llm(opts, &out, move |p| progress(&llm_point_text(p))).await?;
            (llm::table(&report), paths)
        }
        BenchRun::Corpus { jobs, seed } => (bench_corpus(jobs, seed).join("\n"), Vec::new()),
        BenchRun::Policy { jobs, seed, policy_only, out } => {
            let (report, paths) = bench_policy(cfg, jobs, seed, policy_only, &out, |r| progress(&policy_run_text(r))).await?;
            (policy::table(&report), paths)
        }
    })
}

/// A token2wav bench point as it is measured.
fn token2wav_point_text(p: &token2wav::Point) -> String {
    let error = p.error.as_deref().map(|e| format!(" ({e})")).unwrap_or_default();
    format!("flow {} HiFT {} batch {}: {:.1} audio-s/s{error}", p.precision, p.vocoder, p.batch, p.audio_seconds_per_second)
}

/// An LLM bench point as it is measured.
fn llm_point_text(p: &llm::Point) -> String {
    let error = p.error.as_deref().map(|e| format!(" ({e})")).unwrap_or_default();
    format!("{} slots: {:.0} tokens/s, {:.1} audio-s/s{error}", p.slots, p.tokens_per_second, p.audio_seconds_per_second)
}

/// A policy bench run as it ends.
fn policy_run_text(r: &policy::RunResult) -> String {
    format!("{}: {:.1} audio-s/s, {} OOM, peak {:.2} GiB", r.config, r.audio_seconds_per_second, r.ooms, r.peak_memory_bytes as f64 / (1u64 << 30) as f64)
}

/// The files a bench wrote, a line each.
pub fn written_text(paths: &[PathBuf]) -> String {
    paths.iter().map(|p| format!("wrote {}\n", p.display())).collect()
}
