//! The worker's Prometheus endpoint (issue 17): a `voxbatch work` process serves `/metrics` on
//! `metrics.listen`, and its counters move with the work — jobs by outcome, batches, audio
//! seconds, stage-time histograms, the queue-depth gauge.

use crate::common;

use std::io::{Read, Write};
use std::time::Duration;

use common::{eventually, spawn_worker_process_with, TestEnv};
use voxbatch::job::Job;

fn scrape(port: u16) -> Option<String> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    Some(body)
}

/// The value of the sample `line_prefix` (name and labels as printed), if present.
fn value(text: &str, line_prefix: &str) -> Option<f64> {
    text.lines().find(|l| l.starts_with(line_prefix)).and_then(|l| l.rsplit(' ').next()).and_then(|v| v.parse().ok())
}

#[tokio::test]
async fn the_metrics_endpoint_counts_jobs_batches_audio_and_stage_times_as_they_happen() {
    let env = TestEnv::new("metrics").await;
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listen = format!("127.0.0.1:{port}");
    let mut worker = spawn_worker_process_with(&env, &[], &[("VOXBATCH_METRICS__LISTEN", listen.as_str())]);
    assert!(eventually(Duration::from_secs(60), || async { scrape(port).is_some_and(|t| t.contains("200 OK")) }).await, "the endpoint answers");

    let jobs: Vec<Job> = (0..5).map(|i| Job::new(format!("metric line {i}"))).collect();
    env.publish(&jobs).await;
    env.publish_raw(&[b"not json"]).await;
    let done = || async { scrape(port).and_then(|t| value(&t, "voxbatch_jobs_total{outcome=\"done\"}")) == Some(5.0) };
    assert!(eventually(Duration::from_secs(60), done).await, "five done jobs counted: {:?}", scrape(port));
    let text = scrape(port).unwrap();
    assert_eq!(value(&text, "voxbatch_jobs_total{outcome=\"rejected\"}"), Some(1.0), "{text}");
    assert!(value(&text, "voxbatch_batches_total{device=\"cpu\"}").is_some_and(|n| n >= 1.0));
    // Audio seconds carry their fraction: the sum of the done rows' seconds, to the millisecond.
    let rows: f64 = sqlx::query_scalar("SELECT sum(audio_seconds) FROM jobs WHERE status = 'done'").fetch_one(env.db.pool()).await.unwrap();
    let exported = value(&text, "voxbatch_audio_seconds_total").expect("audio seconds exported");
    assert!((exported - rows).abs() < 0.01 && exported.fract() != 0.0, "exported {exported}, rows {rows}: {text}");
    assert!(value(&text, "voxbatch_stage_seconds_count{device=\"cpu\",stage=\"infer\"}").is_some_and(|n| n >= 1.0), "{text}");
    assert!(text.contains("voxbatch_batch_size_bucket") && text.contains("# TYPE voxbatch_jobs_total counter"));
    assert!(
        eventually(Duration::from_secs(20), || async { scrape(port).is_some_and(|t| t.contains("voxbatch_queue_depth{queue=\"jobs\"} 0")) }).await,
        "the queue-depth gauge follows the broker"
    );
    worker.kill().await.unwrap();
    env.cleanup().await;
}

/// Issue 39: a drained worker keeps `/metrics` up for `metrics.linger`, so the last batch is
/// scraped, then exits.
#[tokio::test]
async fn a_drained_worker_serves_its_last_counts_for_the_linger_then_exits() {
    let env = TestEnv::new("metricslinger").await;
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listen = format!("127.0.0.1:{port}");
    let jobs: Vec<Job> = (0..3).map(|i| Job::new(format!("last scrape {i}"))).collect();
    env.publish(&jobs).await;
    let mut worker =
        spawn_worker_process_with(&env, &["--drain"], &[("VOXBATCH_METRICS__LISTEN", listen.as_str()), ("VOXBATCH_METRICS__LINGER", "6s")]);
    assert!(
        eventually(Duration::from_secs(60), || async { env.count("SELECT count(*) FROM jobs WHERE status = 'done'").await == 3 }).await,
        "the worker drained the queue"
    );
    // Drained and its worker stopped (the process would exit here without the linger): the
    // endpoint still answers with the final counts.
    assert!(
        eventually(Duration::from_secs(60), || async { env.count("SELECT count(*) FROM workers WHERE stopped_at IS NOT NULL").await == 1 }).await,
        "the worker stopped after draining"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let text = scrape(port).expect("the endpoint still answers after the drain");
    assert_eq!(value(&text, "voxbatch_jobs_total{outcome=\"done\"}"), Some(3.0), "{text}");
    let exited = tokio::time::timeout(Duration::from_secs(30), worker.wait()).await.expect("exits once the linger is over").unwrap();
    assert!(exited.success());
    env.cleanup().await;
}
