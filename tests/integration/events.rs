//! Completion events against the real RabbitMQ and Postgres (issue 17), read with a plain AMQP
//! client: every done job's `job.done.<campaign>` event with its audio URL, length and batch, the
//! campaign's `campaign.drained.<campaign>` once, and an event a crash left unpublished (rows
//! committed, no confirm recorded) published by the next sweep — at least once, never missing.

use crate::common;

use std::collections::HashSet;
use std::time::Duration;

use common::TestEnv;
use futures::StreamExt;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use voxbatch::job::Job;

/// A listener's queue bound to every event, and what it has received (routing key, body).
async fn listen(env: &TestEnv) -> (lapin::Connection, lapin::Consumer) {
    let conn = lapin::Connection::connect(env.cfg.amqp.url().expose(), lapin::ConnectionProperties::default()).await.unwrap();
    let ch = conn.create_channel().await.unwrap();
    let q = format!("{}.listener", env.cfg.amqp.events_exchange);
    ch.queue_declare(q.as_str().into(), QueueDeclareOptions { exclusive: true, auto_delete: true, ..Default::default() }, FieldTable::default()).await.unwrap();
    for key in ["job.#", "campaign.#"] {
        ch.queue_bind(q.as_str().into(), env.cfg.amqp.events_exchange.as_str().into(), key.into(), QueueBindOptions::default(), FieldTable::default())
            .await
            .unwrap();
    }
    let consumer = ch.basic_consume(q.as_str().into(), "test".into(), BasicConsumeOptions::default(), FieldTable::default()).await.unwrap();
    (conn, consumer)
}

async fn receive(consumer: &mut lapin::Consumer, n: usize) -> Vec<(String, serde_json::Value)> {
    let mut got = Vec::new();
    while got.len() < n {
        let Ok(Some(Ok(d))) = tokio::time::timeout(Duration::from_secs(20), consumer.next()).await else { break };
        d.acker.ack(BasicAckOptions::default()).await.unwrap();
        got.push((d.routing_key.to_string(), serde_json::from_slice(&d.data).unwrap()));
    }
    got
}

#[tokio::test]
async fn every_done_job_announces_itself_once_committed_the_campaign_its_drain_and_a_crash_loses_no_event() {
    let env = TestEnv::new("events").await;
    // Declares the topology (the events exchange) before the listener binds to it.
    let (_conn, mut consumer) = listen(&env).await;
    let jobs: Vec<Job> = (0..3)
        .map(|i| {
            let mut j = Job::new(format!("announce {i}"));
            j.campaign = "news".into();
            j
        })
        .collect();
    env.publish(&jobs).await;
    env.drain().await;
    let events = receive(&mut consumer, 4).await;
    let done: Vec<&serde_json::Value> = events.iter().filter(|(k, _)| k == "job.done.news").map(|(_, v)| v).collect();
    let ids: HashSet<String> = done.iter().map(|v| v["job_id"].as_str().unwrap().to_string()).collect();
    assert_eq!(ids, jobs.iter().map(|j| j.job_id.to_string()).collect::<HashSet<_>>(), "one job.done per job: {events:?}");
    for v in &done {
        assert_eq!(v["event"], "job.done");
        assert!(v["audio_url"].as_str().unwrap().ends_with(&format!("{}.wav", v["job_id"].as_str().unwrap())));
        assert!(v["audio_seconds"].as_f64().unwrap() > 0.0 && v["characters"].as_i64() == Some(10));
        assert!(v["batch_id"].as_str().is_some() && v["at"].as_str().is_some());
    }
    let drained: Vec<_> = events.iter().filter(|(k, _)| k == "campaign.drained.news").collect();
    assert_eq!(drained.len(), 1, "{events:?}");
    assert_eq!(env.count("SELECT count(*) FROM jobs WHERE event_published_at IS NULL").await, 0, "every event confirmed");

    // A sweep that crashed while publishing (its claim now expired): the next sweep (any
    // worker's) publishes the event again.
    sqlx::query("UPDATE jobs SET event_published_at = NULL, event_claimed_at = now() - interval '2 minutes' WHERE job_id = $1").bind(jobs[0].job_id).execute(env.db.pool()).await.unwrap();
    let wake = std::sync::Arc::new(tokio::sync::Notify::new());
    let mut sweep = voxbatch::worker::events::EventSweep::new(env.db.clone(), env.cfg.amqp.clone(), std::sync::Arc::new(|k: &str| k.to_string()), Duration::from_secs(60), wake);
    sweep.sweep().await;
    let again = receive(&mut consumer, 1).await;
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].1["job_id"].as_str(), Some(jobs[0].job_id.to_string().as_str()));
    sweep.sweep().await;
    assert!(receive_none(&mut consumer).await, "nothing more: the drain was announced once, the job's event is confirmed");
    env.cleanup().await;
}

async fn receive_none(consumer: &mut lapin::Consumer) -> bool {
    tokio::time::timeout(Duration::from_millis(800), consumer.next()).await.is_err()
}

/// Issue 39: every settled job announces itself — cancelled and rejected jobs too, so a campaign's
/// job events add up to its jobs — and a campaign whose jobs settle after its drain (a resumed
/// campaign, a requeued dead letter) drains again.
#[tokio::test]
async fn cancelled_and_rejected_jobs_announce_themselves_and_a_campaign_settling_after_its_drain_drains_again() {
    let env = TestEnv::new("events_more").await;
    let (_conn, mut consumer) = listen(&env).await;
    let job = |text: &str| {
        let mut j = Job::new(text);
        j.campaign = "tale".into();
        j
    };
    let bad = format!(r#"{{"job_id":"{}","campaign":"tale","text":"hi","voice":"nobody"}}"#, uuid::Uuid::new_v4());
    env.publish(&[job("the first line")]).await;
    env.publish_raw(&[bad.as_bytes()]).await;
    env.drain().await;
    let first = receive(&mut consumer, 3).await;
    let keys: HashSet<&str> = first.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, HashSet::from(["job.done.tale", "job.rejected.tale", "campaign.drained.tale"]), "{first:?}");
    let rejected = first.iter().find(|(k, _)| k == "job.rejected.tale").unwrap();
    assert!(rejected.1["error"].as_str().unwrap().contains("nobody"), "{rejected:?}");

    // Cancelled: its job says so; resumed later, the campaign drains again.
    assert!(voxbatch::commands::cancel(&env.cfg, "tale", false).await.unwrap());
    env.publish(&[job("a line cancelled")]).await;
    env.drain().await;
    let cancelled = receive(&mut consumer, 2).await;
    let keys: HashSet<&str> = cancelled.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, HashSet::from(["job.cancelled.tale", "campaign.drained.tale"]), "{cancelled:?}");
    assert!(voxbatch::commands::cancel(&env.cfg, "tale", true).await.unwrap(), "resumed");
    env.publish(&[job("a line after the resume")]).await;
    env.drain().await;
    let resumed = receive(&mut consumer, 2).await;
    let keys: HashSet<&str> = resumed.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, HashSet::from(["job.done.tale", "campaign.drained.tale"]), "{resumed:?}");
    env.cleanup().await;
}
