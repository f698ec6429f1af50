//! Outages must not waste GPU work (issue 39, item 15): a batch given back because its upload
//! kept failing past the hold limit keeps its finished audio in the worker's spool, and each
//! later claim of its jobs commits that audio instead of synthesizing it again.

use std::time::Duration;

use crate::common::{self, assert_each_done_once, eventually, spawn_worker, wait_done, PausableProxy, TestEnv};

/// The worker's store is down (a proxy that closes every connection) and `worker.max_hold` is 2 s:
/// the batch is synthesized, its uploads fail, it is given back, and its jobs come back and are
/// claimed again and again. Then the store returns. Every job is done once with one object, and
/// the model made each job's audio exactly once: every later claim took it from the spool (the
/// worker's counters add up to the claims in Postgres). The batches that commit spooled audio bill
/// the device time that made it, and the spool is empty once the jobs are committed.
#[tokio::test]
async fn an_outage_past_the_hold_limit_synthesizes_each_job_once_and_commits_it_from_the_spool() {
    let env = TestEnv::new("spool").await;
    let n = 6;
    env.publish(&common::jobs(n, 3)).await;
    let proxy = PausableProxy::start("127.0.0.1:8333").await;
    proxy.refuse();
    let mut cfg = env.cfg.clone();
    cfg.storage.endpoint = Some(format!("http://127.0.0.1:{}", proxy.port));
    cfg.worker.max_hold = Duration::from_secs(2);
    let spool_dir = cfg.worker.spool_dir();
    let (stop, handle) = spawn_worker(&env, cfg);

    // Several give-backs: each job claimed at least four times while the store is down.
    let cycled = eventually(Duration::from_secs(90), || async {
        env.count("SELECT coalesce(min(attempts), 0)::bigint FROM jobs").await >= 4 && env.count("SELECT count(*) FROM jobs").await == n as i64
    })
    .await;
    assert!(cycled, "every job was given back and claimed again at least three times");
    assert_eq!(env.count("SELECT count(*) FROM jobs WHERE status = 'done'").await, 0, "nothing done while the store is down");
    assert_eq!(entries(&spool_dir).await, n, "one spool entry per job");

    // The store is back.
    proxy.resume();
    assert!(wait_done(&env, n as i64, 60).await, "every job done once the store is back");
    let _ = stop.send(());
    let summary = handle.await.unwrap();

    let claims = env.count("SELECT sum(attempts)::bigint FROM jobs").await as u64;
    assert!(claims >= 4 * n as u64, "{claims} claims");
    assert_eq!(summary.jobs_done, n as u64);
    assert_eq!(summary.jobs_synthesized, n as u64, "each job synthesized exactly once: {summary:?}");
    assert_eq!(summary.jobs_from_spool, claims - n as u64, "every later claim took the job's audio from the spool: {summary:?}");
    assert_each_done_once(&env, n).await;
    let audit = voxbatch::commands::audit(&env.cfg, "default", true).await.unwrap();
    assert_eq!((audit.problems(), audit.orphan_objects.len()), (0, 0), "{audit}");

    // Billed honestly: no committed batch ran the model, yet each bills the device time its
    // spooled jobs carried from the batch that made them.
    let unbilled = env.count("SELECT count(*) FROM batches WHERE NOT (infer_ms > 0 AND cost_usd > 0)").await;
    assert_eq!(unbilled, 0, "every committing batch bills its jobs' device time");
    assert_eq!(entries(&spool_dir).await, 0, "committed jobs' entries are deleted");
    env.cleanup().await;
}

/// The spool's entries (files named `*.spool`).
async fn entries(dir: &std::path::Path) -> usize {
    let Ok(mut read) = tokio::fs::read_dir(dir).await else { return 0 };
    let mut n = 0;
    while let Ok(Some(e)) = read.next_entry().await {
        n += usize::from(e.file_name().to_string_lossy().ends_with(".spool"));
    }
    n
}
