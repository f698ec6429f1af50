//! Reliability: bad input, duplicates and conflicts, worker crashes. Every job ends either done
//! (exactly one audio object, one `done` row) or dead-lettered with a reason.

use crate::common;

use std::time::Duration;

use common::{dead_letters, eventually, TestEnv};
use voxbatch::job::Job;

#[tokio::test]
async fn every_kind_of_poison_is_dead_lettered_at_once_with_its_reason_and_the_worker_is_unharmed() {
    let env = TestEnv::new("poisonall").await;
    let mut cfg = env.cfg.clone();
    cfg.limits.max_text_chars = 100;
    cfg.limits.max_message_bytes = 4096;
    let id = || uuid::Uuid::new_v4();
    let bodies: Vec<(Vec<u8>, &str)> = vec![
        (b"{not json".to_vec(), "not_json"),
        (b"[\"an\", \"array\"]".to_vec(), "not_object"),
        (format!(r#"{{"job_id":"{}"}}"#, id()).into_bytes(), "missing_text"),
        (format!(r#"{{"job_id":"{}","text":""}}"#, id()).into_bytes(), "empty_text"),
        (format!(r#"{{"job_id":"{}","text":"  \t\n "}}"#, id()).into_bytes(), "empty_text"),
        (format!(r#"{{"job_id":"{}","text":["a"]}}"#, id()).into_bytes(), "text_not_string"),
        ([br#"{"job_id":"6f1c1b5e-2f7a-4b8e-9a43-0c1d2e3f4a5b","text":"bad "#.as_slice(), b"\xc3\x28", b"\"}"].concat(), "not_utf8"),
        (format!(r#"{{"job_id":"{}","text":"nul \u0000 inside"}}"#, id()).into_bytes(), "nul_in_text"),
        (format!(r#"{{"job_id":"{}","text":"{}"}}"#, id(), "x".repeat(101)).into_bytes(), "text_too_long"),
        (br#"{"job_id":"not-a-uuid","text":"hello"}"#.to_vec(), "invalid_job_id"),
        (format!(r#"{{"job_id":"{}","text":"hello","voice":"robot"}}"#, id()).into_bytes(), "unknown_voice"),
        // A TorchScript model speaks at one speed.
        (format!(r#"{{"job_id":"{}","text":"hello","speed":1.5}}"#, id()).into_bytes(), "invalid_field"),
        (format!(r#"{{"job_id":"{}","text":"{}"}}"#, id(), "y".repeat(5000)).into_bytes(), "too_large"),
    ];
    let refs: Vec<&[u8]> = bodies.iter().map(|(b, _)| b.as_slice()).collect();
    env.publish_raw(&refs).await;
    let good = Job::new("Still working.");
    env.publish(std::slice::from_ref(&good)).await;

    let summary = env.drain_with(&cfg).await;
    assert_eq!(summary.rejected, bodies.len() as u64);
    assert_eq!(summary.jobs_done, 1, "the worker is unharmed");
    assert_eq!(env.depths().await, (0, bodies.len() as u32));
    let mut got: Vec<String> = dead_letters(&env, bodies.len()).await.into_iter().map(|(code, reason)| {
        assert!(!reason.is_empty(), "every dead letter carries a reason");
        code
    }).collect();
    let mut want: Vec<String> = bodies.iter().map(|(_, c)| c.to_string()).collect();
    got.sort();
    want.sort();
    assert_eq!(got, want);
    assert_eq!(env.count("SELECT count(*) FROM rejections").await, bodies.len() as i64);
    // Rejected rows exist where an id was readable; none of them holds a NUL.
    assert_eq!(env.count("SELECT count(*) FROM jobs WHERE status = 'rejected'").await, 8, "every rejection whose job_id was readable");
    // The messages were not redelivered: each was seen once.
    assert_eq!(env.count("SELECT count(*) FROM rejections GROUP BY code ORDER BY 1 DESC LIMIT 1").await, 2, "empty_text twice, the rest once");
    env.cleanup().await;
}

#[tokio::test]
async fn the_same_job_twice_gives_one_object_and_a_conflicting_text_is_rejected_with_a_reason() {
    let env = TestEnv::new("dupconf").await;
    let job = Job::new("Once, and only once.");
    env.publish(&[job.clone(), job.clone()]).await; // the same job twice, before any worker runs
    let mut conflicting = job.clone();
    conflicting.text = "Different words under the same id.".into();
    let first = env.drain().await;
    assert_eq!(first.jobs_done, 1);
    env.publish(std::slice::from_ref(&conflicting)).await;
    let second = env.drain().await;
    assert_eq!((second.jobs_done, second.rejected), (0, 1));
    assert_eq!(env.objects().await.len(), 1, "one object");
    assert_eq!(env.count("SELECT count(*) FROM jobs WHERE status = 'done'").await, 1, "one done row");
    let (text, status): (String, String) = sqlx::query_as("SELECT text, status FROM jobs").fetch_one(env.db.pool()).await.unwrap();
    assert_eq!((text.as_str(), status.as_str()), (job.text.as_str(), "done"), "the original is untouched");
    let dl = dead_letters(&env, 1).await;
    assert_eq!(dl[0].0, "conflict");
    assert!(dl[0].1.contains("different text"), "{}", dl[0].1);
    env.cleanup().await;
}

#[tokio::test]
async fn a_worker_killed_mid_batch_loses_nothing_and_another_worker_completes_its_jobs() {
    let env = TestEnv::new("sigkill").await;
    let paragraph = "A paragraph long enough to keep a CPU busy for a moment. ".repeat(12);
    let jobs: Vec<Job> = (0..8).map(|i| Job::new(format!("{i} {paragraph}"))).collect();
    env.publish(&jobs).await;
    // A worker process, as in production, with the test's queues, database and prefix.
    let mut child = common::spawn_worker_process(&env, &["--max-batch", "2"]);
    // Kill it while a batch is running (jobs claimed, not all done).
    assert!(eventually(Duration::from_secs(60), || async { env.count("SELECT count(*) FROM jobs WHERE status = 'running'").await > 0 }).await);
    child.start_kill().unwrap(); // SIGKILL
    child.wait().await.unwrap();
    let done_before = env.count("SELECT count(*) FROM jobs WHERE status = 'done'").await;
    assert!(done_before < jobs.len() as i64, "killed before the end");

    let summary = env.drain().await;
    assert_eq!(summary.jobs_done as i64 + done_before, jobs.len() as i64);
    assert_eq!(env.count("SELECT count(*) FROM jobs WHERE status = 'done'").await, jobs.len() as i64, "each job one done row");
    assert_eq!(env.objects().await.len(), jobs.len(), "each job one object");
    assert_eq!(env.depths().await, (0, 0));
    env.cleanup().await;
}

#[tokio::test]
async fn claims_of_one_job_by_two_live_workers_let_exactly_one_synthesize() {
    use voxbatch::db::{Claim, ClaimLease, WorkerRow};
    let env = TestEnv::new("claimrace").await;
    for id in ["w-a", "w-b"] {
        let row = WorkerRow { worker_id: id, device: "cpu", model: "m", precision: "fp32", gpu_name: None, hourly_usd: 0.0 };
        env.db.register_worker(&row).await.unwrap();
    }
    let lease = ClaimLease::for_worker(&env.cfg.worker);
    let job = Job::new("Claimed twice at once.");
    let jobs = std::slice::from_ref(&job);
    // Both claim at the same moment: the transaction lets one proceed, the other waits.
    let (a, b) = tokio::join!(env.db.claim(jobs, "w-a", &lease), env.db.claim(jobs, "w-b", &lease));
    let mut decisions = vec![a.unwrap().remove(0), b.unwrap().remove(0)];
    decisions.sort_by_key(|d| matches!(d, Claim::Proceed { .. }));
    assert!(matches!(&decisions[0], Claim::Busy { .. }), "{decisions:?}");
    assert!(matches!(decisions[1], Claim::Proceed { .. }));
    let winner: String = sqlx::query_scalar("SELECT worker_id FROM jobs").fetch_one(env.db.pool()).await.unwrap();
    let loser = if winner == "w-a" { "w-b" } else { "w-a" };
    // Still busy while the winner lives; once it has stopped, the claim is free.
    assert!(matches!(env.db.claim(jobs, loser, &lease).await.unwrap()[0], Claim::Busy { .. }));
    env.db.worker_stopped(&winner, 0.0, 1.0).await.unwrap();
    assert!(matches!(env.db.claim(jobs, loser, &lease).await.unwrap()[0], Claim::Proceed { .. }));
    // Released claims are free at once, too.
    env.db.release(&[job.job_id], loser).await.unwrap();
    assert!(matches!(env.db.claim(jobs, &winner, &lease).await.unwrap()[0], Claim::Proceed { .. }));
    env.cleanup().await;
}

#[tokio::test]
async fn two_workers_receiving_the_same_job_at_once_synthesize_it_once() {
    let env = TestEnv::new("samejob").await;
    let mut cfg = env.cfg.clone();
    cfg.batching.max_batch = 1;
    cfg.amqp.prefetch = 1;
    let paragraph = "A paragraph that keeps a CPU busy for a moment, ".repeat(30);
    let job = Job::new(paragraph);
    // Two copies of one job in the queue, two workers taking one message each.
    env.publish(&[job.clone(), job.clone()]).await;
    let summaries = voxbatch::commands::work(&cfg, &[voxbatch::model::Device::Cpu], 2, voxbatch::worker::WorkerOptions { drain: true, worker_id: None }, std::future::pending())
        .await
        .unwrap();
    assert_eq!(summaries.iter().map(|s| s.jobs_done).sum::<u64>(), 1, "{summaries:?}");
    assert_eq!(env.count("SELECT coalesce(sum(batch_size), 0)::bigint FROM batches").await, 1, "one synthesis");
    assert_eq!(env.count("SELECT count(*) FROM jobs WHERE status = 'done'").await, 1);
    assert_eq!(env.objects().await.len(), 1);
    assert_eq!(env.depths().await, (0, 0), "both copies settled");
    env.cleanup().await;
}

#[tokio::test]
async fn a_job_that_kills_its_worker_every_time_is_dead_lettered_at_the_limit_with_a_reason_and_a_row() {
    let env = TestEnv::new_with("killer", |c| c.amqp.delivery_limit = 2).await;
    let job = Job::new("A job that takes its worker down with it, every time. ".repeat(12));
    env.publish(std::slice::from_ref(&job)).await;
    // Each worker claims it and dies holding it (SIGKILL: as a segfault in libtorch would).
    for attempt in 1..=2i64 {
        let mut child = common::spawn_worker_process(&env, &["--max-batch", "1"]);
        let claimed = eventually(Duration::from_secs(60), || async {
            env.count("SELECT coalesce(max(attempts), 0)::bigint FROM jobs").await >= attempt
        })
        .await;
        assert!(claimed, "worker {attempt} claimed the job");
        child.start_kill().unwrap();
        child.wait().await.unwrap();
    }
    // The next delivery is the last the broker allows: the worker gives up on it visibly.
    let summary = env.drain().await;
    assert_eq!((summary.jobs_done, summary.jobs_failed), (0, 1));
    assert_eq!(env.depths().await, (0, 1));
    let dead = dead_letters(&env, 1).await;
    assert_eq!(dead[0].0, "delivery_limit");
    assert!(dead[0].1.contains("delivered 2 times"), "{}", dead[0].1);
    let (status, error): (String, Option<String>) =
        sqlx::query_as("SELECT status, error FROM jobs WHERE job_id = $1").bind(job.job_id).fetch_one(env.db.pool()).await.unwrap();
    assert_eq!(status, "failed");
    assert!(error.unwrap_or_default().contains("worker crashed"));
    assert_eq!(env.count("SELECT count(*) FROM rejections WHERE code = 'delivery_limit'").await, 1);
    env.cleanup().await;
}

#[tokio::test]
async fn a_resubmission_accepted_after_a_rejection_stores_its_own_fields() {
    let env = TestEnv::new("resubmit").await;
    let id = uuid::Uuid::new_v4();
    let bad = format!(r#"{{"job_id":"{id}","text":"Hello.","voice":"nobody"}}"#);
    env.publish_raw(&[bad.as_bytes()]).await;
    env.drain().await;
    assert_eq!(env.count("SELECT count(*) FROM jobs WHERE status = 'rejected'").await, 1);
    let good = format!(r#"{{"job_id":"{id}","text":"Hello.","priority":7,"metadata":{{"chapter":3}}}}"#);
    env.publish_raw(&[good.as_bytes()]).await;
    assert_eq!(env.drain().await.jobs_done, 1);
    let (priority, metadata): (i16, Option<serde_json::Value>) =
        sqlx::query_as("SELECT priority, metadata FROM jobs WHERE job_id = $1").bind(id).fetch_one(env.db.pool()).await.unwrap();
    assert_eq!(priority, 7);
    assert_eq!(metadata, Some(serde_json::json!({"chapter": 3})));
    env.cleanup().await;
}

#[tokio::test]
async fn status_shows_jobs_stuck_in_running_with_no_live_worker_and_a_storage_outage() {
    use voxbatch::db::{ClaimLease, WorkerRow};
    let env = TestEnv::new("status").await;
    let row = WorkerRow { worker_id: "w-gone", device: "cpu", model: "m", precision: "fp32", gpu_name: None, hourly_usd: 0.0 };
    env.db.register_worker(&row).await.unwrap();
    let job = Job::new("Claimed by a worker that then went away.");
    env.db.claim(std::slice::from_ref(&job), "w-gone", &ClaimLease::for_worker(&env.cfg.worker)).await.unwrap();
    let s = voxbatch::commands::status(&env.cfg).await.unwrap();
    assert_eq!(s.orphaned_running, 0, "its worker is live");
    assert!(s.storage.is_ok());
    env.db.worker_stopped("w-gone", 0.0, 1.0).await.unwrap();
    let mut cfg = env.cfg.clone();
    cfg.storage.endpoint = Some("http://127.0.0.1:1".into());
    let s = voxbatch::commands::status(&cfg).await.unwrap();
    assert_eq!(s.orphaned_running, 1);
    assert!(s.workers.iter().any(|w| w.worker_id == "w-gone" && w.state == "stopped"));
    assert!(s.storage.is_err(), "the outage is visible");
    assert_eq!(s.depths, Ok((0, 0)));
    env.cleanup().await;
}

/// Issue 39, items 1 and 12: a job refused for any reason is filed under the campaign its message
/// names, so `status --campaign` counts it and no `campaign.drained.default` is announced.
#[tokio::test]
async fn a_rejected_job_is_filed_under_the_campaign_its_message_names() {
    let env = TestEnv::new("rejcampaign").await;
    let id = uuid::Uuid::new_v4();
    let body = format!(r#"{{"job_id":"{id}","campaign":"book-7","text":"hi","voice":"nobody"}}"#);
    env.publish_raw(&[body.as_bytes()]).await;
    let summary = env.drain().await;
    assert_eq!(summary.rejected, 1);
    let (campaign, status): (String, String) =
        sqlx::query_as("SELECT campaign, status FROM jobs WHERE job_id = $1").bind(id).fetch_one(env.db.pool()).await.unwrap();
    assert_eq!((campaign.as_str(), status.as_str()), ("book-7", "rejected"));
    let filed: Option<String> = sqlx::query_scalar("SELECT campaign FROM rejections WHERE job_id = $1").bind(id).fetch_one(env.db.pool()).await.unwrap();
    assert_eq!(filed.as_deref(), Some("book-7"));
    env.cleanup().await;
}

/// Issue 39, item 16: JSON leaves a key named twice open; the job is refused as ambiguous rather
/// than filed under whichever value came last.
#[tokio::test]
async fn a_message_naming_a_key_twice_is_refused_as_ambiguous() {
    let env = TestEnv::new("dupkey").await;
    let id = uuid::Uuid::new_v4();
    let body = format!(r#"{{"job_id":"{id}","text":"Twice named.","campaign":"a","campaign":"b"}}"#);
    env.publish_raw(&[body.as_bytes()]).await;
    assert_eq!(env.drain().await.rejected, 1);
    let dead = dead_letters(&env, 1).await;
    assert_eq!(dead[0].0, "not_json");
    assert!(dead[0].1.contains("`campaign` appears twice"), "{}", dead[0].1);
    assert_eq!(env.objects().await.len(), 0);
    env.cleanup().await;
}

/// Issue 39, item 14: `x-delivery-count` on a first delivery can only be the publisher's; it must
/// not fail a job that never ran.
#[tokio::test]
async fn a_publisher_set_delivery_count_does_not_fail_a_job_on_its_first_delivery() {
    use lapin::options::BasicPublishOptions;
    use lapin::types::{AMQPValue, FieldTable};
    let env = TestEnv::new("spoofcount").await;
    let job = Job::new("A header that lies about the past.");
    let conn = lapin::Connection::connect(env.cfg.amqp.url().expose(), Default::default()).await.unwrap();
    let ch = conn.create_channel().await.unwrap();
    let mut headers = FieldTable::default();
    headers.insert("x-delivery-count".into(), AMQPValue::LongLongInt(99));
    ch.basic_publish(
        env.cfg.amqp.exchange.as_str().into(),
        env.cfg.amqp.routing_key.as_str().into(),
        BasicPublishOptions::default(),
        &job.to_json(),
        lapin::BasicProperties::default().with_headers(headers),
    )
    .await
    .unwrap();
    let _ = conn.close(200, "done".into()).await;
    let summary = env.drain().await;
    assert_eq!((summary.jobs_done, summary.jobs_failed), (1, 0));
    env.cleanup().await;
}

/// Issue 39, item 13: deliveries lost with workers that only prefetched a job (it was never
/// claimed) do not count against it: at the limit it goes back with its count reset, and is done.
#[tokio::test]
async fn a_job_only_prefetched_by_lost_workers_is_given_back_at_the_limit_not_failed() {
    use futures::StreamExt;
    let env = TestEnv::new_with("unclaimed", |c| c.amqp.delivery_limit = 2).await;
    let job = Job::new("Prefetched twice, never started.");
    env.publish(std::slice::from_ref(&job)).await;
    // Two consumers take it and vanish without acking (as workers killed while it sat in their prefetch).
    for _ in 0..2 {
        let conn = lapin::Connection::connect(env.cfg.amqp.url().expose(), Default::default()).await.unwrap();
        let ch = conn.create_channel().await.unwrap();
        let mut consumer = ch
            .basic_consume(env.cfg.amqp.queue.as_str().into(), "lost".into(), Default::default(), Default::default())
            .await
            .unwrap();
        let _held = tokio::time::timeout(Duration::from_secs(10), consumer.next()).await.expect("a delivery").unwrap().unwrap();
        let _ = conn.close(200, "vanish".into()).await;
    }
    let summary = env.drain().await;
    assert_eq!((summary.jobs_done, summary.jobs_failed), (1, 0), "given back and done, not failed");
    assert_eq!(env.depths_settled((0, 0)).await, (0, 0));
    assert_eq!(env.count("SELECT count(*) FROM rejections").await, 0);
    env.cleanup().await;
}

/// A GPU failure is no job's fault (`ModelError::is_device_fault`, `worker::infer`): the batch is
/// given back whole and the worker stops with "the GPU", so that its supervisor starts a fresh
/// CUDA context; no job is failed, split out or dead-lettered for it. The model here is the
/// reference model wrapped to raise CUDA's own message when a job holds `§` (token 168), as
/// libtorch does when a kernel faults (an H100 run on 2026-12-07 failed a job this way before).
#[tokio::test]
async fn a_gpu_failure_gives_the_batch_back_and_stops_the_worker_without_failing_a_job() {
    let env = TestEnv::new("gpufault").await;
    let faulty = tempfile::tempdir().unwrap();
    let script = r#"
import sys, torch
from torch import Tensor
from typing import Tuple
class Faulty(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner
    def forward(self, tokens: Tensor, lengths: Tensor, speakers: Tensor) -> Tuple[Tensor, Tensor]:
        if bool((tokens == 168).any()):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return self.inner(tokens, lengths, speakers)
torch.jit.script(Faulty(torch.jit.load(sys.argv[1]))).save(sys.argv[2])
"#;
    // TorchScript reads the class's source: a file, not `-c`.
    let script_file = faulty.path().join("faulty.py");
    std::fs::write(&script_file, script).unwrap();
    let made = std::process::Command::new(common::repo_path(".venv/bin/python"))
        .arg(&script_file)
        .arg(common::model_dir().join("model.pt"))
        .arg(faulty.path().join("model.pt"))
        .output()
        .expect("the project venv's python (scripts/bootstrap.sh)");
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    std::fs::copy(common::model_dir().join("model.toml"), faulty.path().join("model.toml")).unwrap();

    let mut batch = common::jobs(3, 4);
    batch.push(Job::new("a section sign § brings the GPU down".to_string()));
    env.publish(&batch).await;
    let mut cfg = env.cfg.clone();
    cfg.model.dir = faulty.path().to_path_buf();
    cfg.batching.max_wait = Duration::from_millis(500);
    let storage = voxbatch::storage::Storage::open(&cfg.storage).await.unwrap();
    let opts = voxbatch::worker::WorkerOptions { drain: true, worker_id: None };
    let run = voxbatch::worker::run(cfg, env.model_at(faulty.path()), env.db.clone(), storage, opts, std::future::pending());
    let stopped = tokio::time::timeout(Duration::from_secs(120), run).await.expect("the worker stops on its own");
    let error = voxbatch::worker::error_chain(&stopped.expect_err("a GPU failure stops the worker"));
    assert!(error.contains("the GPU") && error.contains("CUDA error"), "says the GPU failed: {error}");
    assert_eq!(env.count("SELECT count(*) FROM jobs WHERE status = 'failed'").await, 0, "no job failed for the GPU's fault");
    let done = env.count("SELECT count(*) FROM jobs WHERE status = 'done'").await;
    assert!(done < 4, "the job that faults was not done");
    assert_eq!(env.depths_settled((4 - done as u32, 0)).await, (4 - done as u32, 0), "the rest back in the queue, nothing dead-lettered");

    // A sound GPU (the plain reference model) finishes them: each done once.
    let summary = env.drain().await;
    assert_eq!((summary.jobs_done as i64 + done, summary.jobs_failed), (4, 0), "{summary:?}");
    common::assert_each_done_once(&env, 4).await;
    env.cleanup().await;
}
