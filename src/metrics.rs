//! Prometheus metrics of a worker process, served as text on `http://<metrics.listen>/metrics`
//! (the `metrics` facade and `metrics-exporter-prometheus`'s listener). Names and units follow
//! Prometheus conventions (`_total` counters, `_seconds`, `_bytes`, `_ratio`); labels: `device`,
//! and `outcome` / `stage` / `queue` where they say which.
//!
//! Where nothing is installed (tests running a worker in-process, `metrics.listen = "off"`) the
//! recording calls below cost nothing.
//!
//! Neighbours: the binary's `work` installs the exporter; the worker's `Counters` (job outcomes,
//! committed batches), `worker::infer` (OOM splits) and `worker::events` (queue depths) record.

use std::net::SocketAddr;

use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram, Unit};

use crate::db::BatchRecord;

/// Why the exporter could not start.
#[derive(Debug, thiserror::Error)]
#[error("cannot serve metrics on {addr}")]
pub struct MetricsError {
    addr: SocketAddr,
    #[source]
    source: metrics_exporter_prometheus::BuildError,
}

/// Audio committed by this process, in milliseconds.
static AUDIO_MS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Batch-size buckets (jobs).
const BATCH_SIZES: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0];
/// Duration buckets (seconds), 5 ms to 10 min.
const SECONDS: &[f64] = &[0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0];
/// Ratio buckets (padding waste).
const RATIOS: &[f64] = &[0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0];

/// Installs the process-wide recorder and serves `/metrics` on `addr` (from the current tokio
/// runtime). Call once per process.
pub fn serve(addr: SocketAddr) -> Result<(), MetricsError> {
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
    let builder = PrometheusBuilder::new()
        .with_http_listener(addr)
        .set_buckets_for_metric(Matcher::Full("voxbatch_batch_size".into()), BATCH_SIZES)
        .and_then(|b| b.set_buckets_for_metric(Matcher::Full("voxbatch_batch_padding_ratio".into()), RATIOS))
        .and_then(|b| b.set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS))
        .map_err(|source| MetricsError { addr, source })?;
    builder.install().map_err(|source| MetricsError { addr, source })?;
    describe();
    Ok(())
}

fn describe() {
    describe_counter!("voxbatch_jobs_total", "Jobs settled by this worker process, by outcome (done, failed, rejected, already_done, cancelled).");
    describe_counter!("voxbatch_segments_total", Unit::Count, "Text segments synthesized (CosyVoice2 text jobs).");
    describe_counter!("voxbatch_batches_total", Unit::Count, "Batches committed.");
    describe_histogram!("voxbatch_batch_size", Unit::Count, "Jobs per committed batch.");
    describe_histogram!("voxbatch_batch_padding_ratio", "Share of a batch's padded input that is padding.");
    describe_histogram!("voxbatch_queue_wait_seconds", Unit::Seconds, "From a batch's first job received to its inference start.");
    describe_histogram!("voxbatch_stage_seconds", Unit::Seconds, "Time per batch in each stage (infer, encode, upload, record).");
    // A gauge only because the `metrics` crate's counters are integers: it only grows within a
    // process, like a counter, and carries the fraction (1666.42, not 1666).
    describe_gauge!("voxbatch_audio_seconds_total", Unit::Seconds, "Audio synthesized and committed by this process (monotonic; fractional seconds).");
    describe_counter!("voxbatch_oom_splits_total", Unit::Count, "Batches split after an out-of-memory error.");
    describe_counter!("voxbatch_jobs_from_spool_total", Unit::Count, "Jobs whose audio came from the local spool (synthesized before an outage, not again).");
    describe_gauge!("voxbatch_gpu_utilization_ratio", "NVML GPU utilisation, mean over the last batch (0-1).");
    describe_gauge!("voxbatch_gpu_memory_used_bytes", Unit::Bytes, "NVML device memory used, peak over the last batch.");
    describe_gauge!("voxbatch_gpu_power_watts", "NVML power draw, mean over the last batch.");
    describe_counter!("voxbatch_gpu_energy_joules_total", "NVML energy of committed batches.");
    describe_gauge!("voxbatch_queue_depth", Unit::Count, "Ready messages in the job queue and the dead-letter queue (queue label).");
}

/// A committed batch: its size, padding, stage times, audio and the GPU's figures.
pub fn batch_committed(b: &BatchRecord, segments: u64) {
    let device = b.device.clone();
    counter!("voxbatch_batches_total", "device" => device.clone()).increment(1);
    // One label set for every outcome (a rejected job has no device): per device, see batches and audio.
    counter!("voxbatch_jobs_total", "outcome" => "done").increment(b.batch_size.max(0) as u64);
    if segments > 0 {
        counter!("voxbatch_segments_total", "device" => device.clone()).increment(segments);
    }
    histogram!("voxbatch_batch_size", "device" => device.clone()).record(f64::from(b.batch_size));
    if b.padded_tokens > 0 {
        let waste = (b.padded_tokens - b.tokens).max(0) as f64 / b.padded_tokens as f64;
        histogram!("voxbatch_batch_padding_ratio", "device" => device.clone()).record(waste);
    }
    histogram!("voxbatch_queue_wait_seconds", "device" => device.clone()).record(b.queue_ms / 1000.0);
    for (stage, ms) in [("infer", b.infer_ms), ("encode", b.encode_ms), ("upload", b.upload_ms), ("record", b.db_ms)] {
        histogram!("voxbatch_stage_seconds", "device" => device.clone(), "stage" => stage).record(ms / 1000.0);
    }
    // The process's running total, kept in milliseconds, exported in seconds with its fraction.
    let ms = (b.audio_seconds * 1000.0).round().max(0.0) as u64;
    let total_ms = AUDIO_MS.fetch_add(ms, std::sync::atomic::Ordering::Relaxed) + ms;
    gauge!("voxbatch_audio_seconds_total").set(total_ms as f64 / 1000.0);
    if let Some(g) = &b.gpu {
        if let Some(u) = g.util_mean {
            gauge!("voxbatch_gpu_utilization_ratio", "device" => device.clone()).set(f64::from(u) / 100.0);
        }
        if let Some(m) = g.mem_used_max_bytes {
            gauge!("voxbatch_gpu_memory_used_bytes", "device" => device.clone()).set(m as f64);
        }
        if let Some(p) = g.power_mean_w {
            gauge!("voxbatch_gpu_power_watts", "device" => device.clone()).set(f64::from(p));
        }
        if let Some(e) = g.energy_j {
            counter!("voxbatch_gpu_energy_joules_total", "device" => device).increment(e.round().max(0.0) as u64);
        }
    }
}

/// Jobs settled without a batch commit: `failed`, `rejected`, `already_done`, `cancelled`.
pub fn jobs_settled(outcome: &'static str, n: u64) {
    counter!("voxbatch_jobs_total", "outcome" => outcome).increment(n);
}

/// `n` jobs whose audio came from the local spool instead of the model.
pub fn jobs_from_spool(n: u64) {
    if n > 0 {
        counter!("voxbatch_jobs_from_spool_total").increment(n);
    }
}

/// `n` batch splits after out-of-memory errors.
pub fn oom_splits(n: u64) {
    if n > 0 {
        counter!("voxbatch_oom_splits_total").increment(n);
    }
}

/// The broker's ready counts.
pub fn queue_depths(jobs: u32, dead: u32) {
    gauge!("voxbatch_queue_depth", "queue" => "jobs").set(f64::from(jobs));
    gauge!("voxbatch_queue_depth", "queue" => "dead").set(f64::from(dead));
}

#[cfg(test)]
mod tests {
    /// Every series the Grafana dashboard (deploy/grafana) queries is one this module describes
    /// (histograms through their `_bucket`, `_sum` and `_count` series).
    #[test]
    fn the_dashboard_queries_only_metrics_the_worker_exports() {
        let source = include_str!("metrics.rs");
        let described: Vec<&str> = source
            .lines()
            .filter(|l| l.trim_start().starts_with("describe_"))
            .filter_map(|l| l.split('"').nth(1))
            .collect();
        let dashboard: serde_json::Value = serde_json::from_str(include_str!("../deploy/grafana/voxbatch-dashboard.json")).unwrap();
        let mut queried = 0;
        for panel in dashboard["panels"].as_array().unwrap() {
            for target in panel["targets"].as_array().unwrap() {
                let expr = target["expr"].as_str().unwrap();
                for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).filter(|w| w.starts_with("voxbatch_")) {
                    let base = ["_bucket", "_sum", "_count"].iter().fold(word, |w, s| w.strip_suffix(s).unwrap_or(w));
                    assert!(described.contains(&base), "the dashboard queries {word}, which the worker does not export");
                    queried += 1;
                }
            }
        }
        assert!(queried >= 14 && described.len() >= 14, "{queried} series queried, {} described", described.len());
    }
}
