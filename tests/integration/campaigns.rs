//! Campaign control against the real services (issue 17): `cancel` makes workers ack a campaign's
//! queued jobs without synthesis (status `cancelled`) while other campaigns run, and `--resume`
//! lets its jobs not yet consumed run again.

use crate::common;

use common::TestEnv;
use voxbatch::commands;
use voxbatch::job::Job;

fn jobs(n: usize, campaign: &str) -> Vec<Job> {
    (0..n)
        .map(|i| {
            let mut j = Job::new(format!("line {i} of {campaign}"));
            j.campaign = campaign.to_string();
            j
        })
        .collect()
}

#[tokio::test]
async fn a_cancelled_campaigns_jobs_are_acked_without_synthesis_and_resume_runs_the_rest() {
    let env = TestEnv::new("campaign_cancel").await;
    env.publish(&[jobs(3, "stop-me"), jobs(2, "keep")].concat()).await;
    assert!(commands::cancel(&env.cfg, "stop-me", false).await.unwrap());
    assert!(!commands::cancel(&env.cfg, "stop-me", false).await.unwrap(), "a second cancel changes nothing");
    assert!(commands::cancel(&env.cfg, "no/such", false).await.is_err(), "a malformed campaign name is refused");
    let summary = env.drain().await;
    assert_eq!((summary.cancelled, summary.jobs_done), (3, 2));
    assert_eq!(env.depths().await, (0, 0), "cancelled jobs are acked, not dead-lettered");
    assert_eq!(env.count("SELECT count(*) FROM jobs WHERE campaign = 'stop-me' AND status = 'cancelled'").await, 3);
    assert_eq!(env.objects().await.len(), 2, "no audio for the cancelled campaign");
    let by_status = env.db.jobs_by_status(Some("stop-me")).await.unwrap();
    assert_eq!(by_status, vec![("cancelled".to_string(), 3)], "status counts them");

    // Resumed: jobs published (again) afterwards are synthesized, including the cancelled ones.
    assert!(commands::cancel(&env.cfg, "stop-me", true).await.unwrap());
    let mut again = jobs(1, "stop-me");
    let cancelled_id: uuid::Uuid = sqlx::query_scalar("SELECT job_id FROM jobs WHERE campaign = 'stop-me' LIMIT 1").fetch_one(env.db.pool()).await.unwrap();
    let mut resent = Job::new("");
    resent.job_id = cancelled_id;
    resent.text = sqlx::query_scalar("SELECT text FROM jobs WHERE job_id = $1").bind(cancelled_id).fetch_one(env.db.pool()).await.unwrap();
    resent.campaign = "stop-me".into();
    again.push(resent);
    env.publish(&again).await;
    let summary = env.drain().await;
    assert_eq!((summary.cancelled, summary.jobs_done), (0, 2));
    assert_eq!(env.count("SELECT count(*) FROM jobs WHERE campaign = 'stop-me' AND status = 'done'").await, 2);
    env.cleanup().await;
}

#[tokio::test]
async fn status_of_a_campaign_counts_what_enqueue_published_before_any_claim_then_shows_it_drained() {
    let env = TestEnv::new("campaign_status").await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("lines.txt");
    std::fs::write(&file, (0..6).map(|i| format!("sentence number {i} of the catalogue\n")).collect::<String>()).unwrap();
    let defaults = voxbatch::enqueue::LineDefaults { campaign: Some("catalogue".into()), ..Default::default() };
    let window = std::time::Duration::from_secs(300);
    commands::enqueue(&env.cfg, &file, &defaults, 0, std::future::pending(), |_, _| {}).await.unwrap();
    // Enqueued twice (the same file): counted once.
    commands::enqueue(&env.cfg, &file, &defaults, 0, std::future::pending(), |_, _| {}).await.unwrap();

    let before = commands::campaign_progress(&env.cfg, "catalogue", window).await.unwrap();
    assert_eq!((before.total_jobs, before.remaining_jobs, before.figures.known_jobs), (6, 6, 0), "known from enqueue alone");
    assert_eq!(before.remaining_chars, 6 * "sentence number 0 of the catalogue".len() as i64);
    assert!(before.eta_seconds.is_none() && !before.finished(), "no rate yet, so no ETA");

    env.drain().await;
    let after = commands::campaign_progress(&env.cfg, "catalogue", window).await.unwrap();
    assert_eq!((after.total_jobs, after.remaining_jobs, after.figures.done_jobs), (6, 0, 6));
    assert!(after.finished() && after.eta_seconds == Some(0.0));
    assert!(after.figures.done_audio_seconds > 0.0 && after.jobs_per_minute > 0.0 && after.chars_per_second > 0.0);
    let text = after.text();
    assert!(text.contains("6 of 6 settled") && text.contains("ETA: 0 s"), "{text}");
    env.cleanup().await;
}
