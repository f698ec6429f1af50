//! End-to-end tests of the spine against the real RabbitMQ, Postgres and SeaweedFS.

use crate::common;

use std::time::Duration;

use common::{eventually, repo_path, TestEnv};
use lapin::options::BasicPublishOptions;
use lapin::BasicProperties;
use voxbatch::audio::parse_wav_header;
use voxbatch::enqueue::{read_jobs, LineDefaults};
use voxbatch::job::Job;
use voxbatch::worker::{self, WorkerOptions};

#[tokio::test]
async fn sample_corpus_becomes_one_valid_wav_and_one_done_row_per_job() {
    let env = TestEnv::new("corpus").await;
    let defaults = LineDefaults { campaign: Some("demo".into()), ..LineDefaults::default() };
    let jobs = read_jobs(&repo_path("corpus/sample.jsonl"), &defaults, &env.cfg.limits).unwrap();
    assert!(jobs.len() >= 50);
    assert!(jobs.iter().any(|j| j.text.chars().any(|c| ('\u{4e00}'..='\u{9fff}').contains(&c))), "has Chinese");
    env.publish(&jobs).await;

    let summary = env.drain().await;
    assert_eq!(summary.jobs_done, jobs.len() as u64);
    assert_eq!(summary.rejected + summary.jobs_failed, 0);
    assert!(summary.batches < jobs.len() as u64, "jobs were batched");
    assert_eq!(env.count("SELECT count(*) FROM jobs WHERE status = 'done'").await, jobs.len() as i64);
    assert_eq!(env.depths().await, (0, 0));

    let objects = env.objects().await;
    assert_eq!(objects.len(), jobs.len(), "one object per job");
    let manifest = voxbatch::model::Manifest::load(&common::model_dir()).unwrap();
    for job in jobs.iter().take(8) {
        let key = format!("{}demo/{}.wav", env.key_prefix(), job.job_id);
        let (wav, meta) = env.storage.get(&key).await.unwrap();
        let info = parse_wav_header(&wav).expect("a PCM WAV");
        assert_eq!((info.sample_rate, info.channels, info.bits_per_sample), (manifest.sample_rate, 1, 16));
        assert_eq!(u64::from(info.samples), manifest.predicted_samples(job.chars()));
        assert_eq!(meta.get("job-id").map(String::as_str), Some(job.job_id.to_string().as_str()));
        assert_eq!(meta.get("voice"), Some(&job.voice));
        assert_eq!(meta.get("model"), Some(&manifest.name));
        let sha = voxbatch::audio::encode_wav(&[], 1).sha256.len();
        assert_eq!(meta.get("sha256").map(String::len), Some(sha));
        let row: (String, f64, String) =
            sqlx::query_as("SELECT s3_key, audio_seconds, audio_sha256 FROM jobs WHERE job_id = $1")
                .bind(job.job_id)
                .fetch_one(env.db.pool())
                .await
                .unwrap();
        assert_eq!(row.0, key);
        assert_eq!(Some(&row.2), meta.get("sha256"));
        assert!((row.1 - info.samples as f64 / info.sample_rate as f64).abs() < 1e-9);
    }

    let audit = voxbatch::commands::audit(&env.cfg, "demo", true).await.unwrap();
    assert_eq!((audit.done_rows, audit.objects), (jobs.len(), jobs.len()));
    assert!(audit.problems() == 0 && audit.orphan_objects.is_empty(), "{audit}");
    let report = voxbatch::report::report(&env.db, voxbatch::report::Dimension::Campaign, None, Some("demo")).await.unwrap();
    assert_eq!(report.rows.len(), 1);
    assert_eq!(report.rows[0].key, "demo");
    assert_eq!(report.rows[0].jobs, jobs.len() as i64);
    assert!(report.rows[0].real_time_factor.is_some());
    assert!(report.rows[0].cost_usd.unwrap() > 0.0, "CPU time is priced");
    let infer_hours: f64 = sqlx::query_scalar("SELECT sum(infer_ms) / 3.6e6 FROM batches").fetch_one(env.db.pool()).await.unwrap();
    assert!((report.rows[0].gpu_hours - infer_hours).abs() < 1e-9, "every batch's time is attributed");
    assert_eq!(report.workers.workers, 1);
    env.cleanup().await;
}

#[tokio::test]
async fn job_published_by_a_plain_amqp_client_in_the_documented_format_is_processed() {
    let env = TestEnv::new("plain").await;
    // A plain client: no voxbatch code, just the documented exchange, routing key and JSON body.
    let conn = lapin::Connection::connect("amqp://guest:guest@127.0.0.1:5672/%2f", Default::default()).await.unwrap();
    let ch = conn.create_channel().await.unwrap();
    let job_id = uuid::Uuid::new_v4();
    let body = format!(r#"{{"job_id":"{job_id}","text":"Published by hand.","campaign":"plain","priority":3,"metadata":{{"src":"test"}}}}"#);
    ch.basic_publish(
        env.cfg.amqp.exchange.as_str().into(),
        "jobs".into(),
        BasicPublishOptions::default(),
        body.as_bytes(),
        BasicProperties::default(),
    )
    .await
    .unwrap();
    let _ = conn.close(200, "done".into()).await;

    let summary = env.drain().await;
    assert_eq!(summary.jobs_done, 1);
    let (status, key, meta): (String, String, serde_json::Value) =
        sqlx::query_as("SELECT status, s3_key, metadata FROM jobs WHERE job_id = $1").bind(job_id).fetch_one(env.db.pool()).await.unwrap();
    assert_eq!(status, "done");
    assert_eq!(key, format!("{}plain/{job_id}.wav", env.key_prefix()));
    assert_eq!(meta["src"], "test");
    env.storage.get(&key).await.expect("object exists");
    env.cleanup().await;
}

#[tokio::test]
async fn redelivered_done_job_is_acked_without_resynthesis() {
    let env = TestEnv::new("redeliver").await;
    let job = Job::new("Say this once.");
    env.publish(std::slice::from_ref(&job)).await;
    let first = env.drain().await;
    assert_eq!((first.jobs_done, first.batches), (1, 1));

    env.publish(std::slice::from_ref(&job)).await; // the same job again (as after a lost ack)
    let second = env.drain().await;
    assert_eq!((second.jobs_done, second.batches, second.already_done), (0, 0, 1));
    assert_eq!(env.count("SELECT count(*) FROM batches").await, 1, "no second synthesis");
    assert_eq!(env.count("SELECT attempts::bigint FROM jobs").await, 1);
    assert_eq!(env.objects().await.len(), 1);
    assert_eq!(env.depths().await, (0, 0));
    env.cleanup().await;
}

#[tokio::test]
async fn malformed_messages_go_to_the_dead_letter_queue_with_their_reason() {
    let env = TestEnv::new("poison").await;
    let id = uuid::Uuid::new_v4();
    let empty_text = format!(r#"{{"job_id":"{id}","text":"   "}}"#);
    let good = Job::new("A good job among bad ones.");
    env.publish_raw(&[b"not json at all", empty_text.as_bytes(), br#"{"job_id":"x","text":"bad id"}"#]).await;
    env.publish(std::slice::from_ref(&good)).await;

    let summary = env.drain().await;
    assert_eq!((summary.rejected, summary.jobs_done), (3, 1), "the worker is unharmed by poison");
    assert_eq!(env.depths().await, (0, 3));
    assert_eq!(env.count("SELECT count(*) FROM rejections").await, 3);
    let (status, error): (String, String) =
        sqlx::query_as("SELECT status, error FROM jobs WHERE job_id = $1").bind(id).fetch_one(env.db.pool()).await.unwrap();
    assert_eq!(status, "rejected");
    assert!(error.contains("empty"), "{error}");

    // Each dead-lettered message carries its reason.
    let mut reasons: Vec<String> = common::dead_letters(&env, 3).await.into_iter().map(|(_, reason)| reason).collect();
    reasons.sort();
    assert!(reasons.iter().any(|r| r.contains("not JSON")), "{reasons:?}");
    assert!(reasons.iter().any(|r| r.contains("empty")), "{reasons:?}");
    assert!(reasons.iter().any(|r| r.contains("job_id")), "{reasons:?}");
    env.cleanup().await;
}

#[tokio::test]
async fn ack_only_after_the_s3_object_is_committed() {
    let env = TestEnv::new("acks3").await;
    let job = Job::new("Held until the store is back.");
    env.publish(std::slice::from_ref(&job)).await;

    // Storage that refuses every upload: nothing listens on this port.
    let mut broken = env.cfg.clone();
    broken.storage.endpoint = Some("http://127.0.0.1:1".into());
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let storage = voxbatch::storage::Storage::open(&broken.storage).await.unwrap();
    let handle = tokio::spawn(worker::run(broken.clone(), env.model(), env.db.clone(), storage, WorkerOptions::default(), async {
        let _ = stop_rx.await;
    }));
    // The job is taken and synthesized, but the upload keeps failing.
    assert!(eventually(Duration::from_secs(30), || async { env.count("SELECT count(*) FROM jobs WHERE status = 'running'").await == 1 }).await);
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(env.depths().await.0, 0, "held unacked by the worker while it retries");
    let _ = stop_tx.send(());
    let summary = handle.await.unwrap().unwrap();
    assert_eq!(summary.jobs_done, 0);
    assert_eq!(env.count("SELECT count(*) FROM jobs WHERE status = 'done'").await, 0, "never done without its object");
    assert_eq!(env.depths().await.0, 1, "not acked: back in the queue");

    // With the store back, the same message completes.
    let summary = env.drain().await;
    assert_eq!(summary.jobs_done, 1);
    assert_eq!(env.objects().await.len(), 1);
    env.cleanup().await;
}

#[tokio::test]
async fn messages_are_never_held_past_the_hold_limit_during_an_outage() {
    let env = TestEnv::new("hold").await;
    let job = Job::new("Back to the queue while the store is down.");
    env.publish(std::slice::from_ref(&job)).await;
    let mut broken = env.cfg.clone();
    broken.storage.endpoint = Some("http://127.0.0.1:1".into());
    broken.worker.max_hold = Duration::from_secs(2);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let storage = voxbatch::storage::Storage::open(&broken.storage).await.unwrap();
    let handle = tokio::spawn(worker::run(broken.clone(), env.model(), env.db.clone(), storage, WorkerOptions::default(), async {
        let _ = stop_rx.await;
    }));
    // Taken, then given back after ~2 s of failed uploads, then taken again (redelivered).
    assert!(eventually(Duration::from_secs(30), || async {
        env.count("SELECT coalesce(max(attempts), 0)::bigint FROM jobs").await >= 2
    })
    .await, "the job was requeued and claimed again");
    let _ = stop_tx.send(());
    handle.await.unwrap().unwrap();
    assert_eq!(env.count("SELECT count(*) FROM jobs WHERE status = 'done'").await, 0);
    let summary = env.drain().await;
    assert_eq!(summary.jobs_done, 1);
    env.cleanup().await;
}

#[tokio::test]
async fn ack_only_after_the_postgres_rows_are_committed() {
    let env = TestEnv::new("ackpg").await;
    // Make the commit fail: a trigger refuses to mark jobs done.
    sqlx::raw_sql(
        "CREATE FUNCTION refuse_done() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'refused by test'; END $$;
         CREATE TRIGGER refuse_done BEFORE UPDATE ON jobs FOR EACH ROW WHEN (NEW.status = 'done') EXECUTE FUNCTION refuse_done();",
    )
    .execute(env.db.pool())
    .await
    .unwrap();
    let job = Job::new("Held until the commit succeeds.");
    env.publish(std::slice::from_ref(&job)).await;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let storage = voxbatch::storage::Storage::open(&env.cfg.storage).await.unwrap();
    let handle = tokio::spawn(worker::run(env.cfg.clone(), env.model(), env.db.clone(), storage, WorkerOptions::default(), async {
        let _ = stop_rx.await;
    }));
    // The object is uploaded, but the rows cannot be committed.
    assert!(eventually(Duration::from_secs(30), || async { env.objects().await.len() == 1 }).await);
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(env.depths().await.0, 0, "held unacked while the commit is retried");
    let _ = stop_tx.send(());
    let summary = handle.await.unwrap().unwrap();
    assert_eq!(summary.jobs_done, 0);
    assert_eq!(env.depths().await.0, 1, "not acked: back in the queue");
    assert_eq!(env.count("SELECT count(*) FROM batches").await, 0, "the batch row rolled back with the jobs");

    sqlx::raw_sql("DROP TRIGGER refuse_done ON jobs").execute(env.db.pool()).await.unwrap();
    let summary = env.drain().await;
    assert_eq!(summary.jobs_done, 1);
    assert_eq!(env.count("SELECT count(*) FROM jobs WHERE status = 'done'").await, 1);
    assert_eq!(env.objects().await.len(), 1, "the re-upload overwrote the same key");
    env.cleanup().await;
}

#[tokio::test]
async fn graceful_shutdown_finishes_the_current_batch_and_requeues_the_rest() {
    let env = TestEnv::new("shutdown").await;
    let mut cfg = env.cfg.clone();
    cfg.batching.max_batch = 1;
    cfg.amqp.prefetch = 8;
    let paragraph = "A long paragraph that takes a while to synthesize on a CPU, repeated. ".repeat(20);
    let jobs: Vec<Job> = (0..12).map(|i| Job::new(format!("{i}: {paragraph}"))).collect();
    env.publish(&jobs).await;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let storage = voxbatch::storage::Storage::open(&cfg.storage).await.unwrap();
    let handle = tokio::spawn(worker::run(cfg.clone(), env.model(), env.db.clone(), storage, WorkerOptions::default(), async {
        let _ = stop_rx.await;
    }));
    assert!(eventually(Duration::from_secs(60), || async { env.count("SELECT count(*) FROM jobs WHERE status = 'done'").await >= 1 }).await);
    let _ = stop_tx.send(());
    let summary = tokio::time::timeout(Duration::from_secs(60), handle).await.expect("stops promptly").unwrap().unwrap();

    let done = env.count("SELECT count(*) FROM jobs WHERE status = 'done'").await;
    let (ready, dead) = env.depths().await;
    assert_eq!(summary.jobs_done as i64, done);
    assert!(done < jobs.len() as i64, "stopped before the end (done {done})");
    assert_eq!(done + i64::from(ready), jobs.len() as i64, "every job is either done or back in the queue");
    assert_eq!(dead, 0);
    assert_eq!(env.objects().await.len() as i64, done, "no object without a done row");
    env.cleanup().await;
}
