//! Campaign control against the real services (issue 17): `cancel` makes workers ack a campaign's
//! queued jobs without synthesis (status `cancelled`) while other campaigns run, and `--resume`
//! lets its jobs not yet consumed run again.

mod common;

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
