//! The memory-aware batch policy in a real worker on CPU (host memory is the budget).

use crate::common;

use common::TestEnv;
use voxbatch::job::Job;

#[tokio::test]
async fn a_worker_with_a_tight_memory_budget_finishes_a_mixed_corpus_with_no_job_lost() {
    let env = TestEnv::new("tightmem").await;
    let mut cfg = env.cfg.clone();
    // The built-in model charges 4 × 512 × 240 bytes per output frame (6 frames per token):
    // a 600 MB budget admits about 200 tokens of padded batch, so long texts run alone and short
    // ones in small batches.
    let budget: u64 = 600 << 20;
    cfg.memory.budget_bytes = Some(budget);
    cfg.batching.max_batch = 16;
    let texts = voxbatch::bench::corpus::mixed_lengths(40, 11);
    let jobs: Vec<Job> = texts.iter().map(|t| Job::new(t.clone())).collect();
    env.publish(&jobs).await;

    let summary = env.drain_with(&cfg).await;
    assert_eq!(summary.jobs_done, jobs.len() as u64, "no job lost");
    assert_eq!(summary.jobs_failed + summary.rejected, 0);
    assert_eq!(env.count("SELECT count(*) FROM jobs WHERE status = 'done'").await, jobs.len() as i64);
    assert_eq!(env.objects().await.len(), jobs.len());

    // Every multi-job batch was predicted to fit; single jobs run even when they do not.
    let rows: Vec<(i32, Option<i64>, Option<i64>, Option<f32>, String)> = sqlx::query_as(
        "SELECT batch_size, predicted_peak_bytes, measured_peak_bytes, padding_waste, flush_reason FROM batches",
    )
    .fetch_all(env.db.pool())
    .await
    .unwrap();
    assert!(rows.len() > 3, "the budget forced several batches: {}", rows.len());
    for (size, predicted, measured, waste, reason) in &rows {
        let predicted = predicted.expect("predicted peak recorded");
        assert!(measured.is_some(), "measured peak recorded");
        assert!(waste.is_some());
        if *size > 1 {
            assert!(predicted as f64 <= budget as f64, "batch of {size} predicted {predicted} > budget {budget} ({reason})");
        }
    }
    assert!(rows.iter().any(|r| r.0 == 1 && r.1.unwrap() as u64 > budget), "a long text over the budget ran alone");
    assert!(rows.iter().any(|r| r.0 > 1), "short texts were still batched");
    env.cleanup().await;
}

#[tokio::test]
async fn a_recorded_calibration_carries_the_error_calibration_judges_it_by() {
    let env = TestEnv::new("calibrationrow").await;
    // The H200 profile of 2026-12-02, written before the largest-peak error existed: it is
    // measured again from the points on load, and that is what the table holds.
    let profile = voxbatch::sizing::profile::load_matching(&common::repo_path("calibration"), "reference-large", "NVIDIA H200", "bf16")
        .expect("readable")
        .expect("committed profile");
    env.db.record_calibration(&profile).await.unwrap();
    let (rel, of_max, points): (f64, Option<f64>, i32) =
        sqlx::query_as("SELECT worst_rel_error, worst_error_of_max_peak, points FROM calibrations WHERE model = 'reference-large'")
            .fetch_one(env.db.pool())
            .await
            .unwrap();
    assert_eq!(points as usize, profile.points.len());
    assert_eq!(rel, profile.fit.worst_rel_error);
    let of_max = of_max.expect("worst_error_of_max_peak recorded");
    assert_eq!(of_max, profile.fit.worst_error_of_max_peak);
    assert!(of_max > 0.0 && of_max <= rel, "{of_max} vs {rel}");
    env.cleanup().await;
}
