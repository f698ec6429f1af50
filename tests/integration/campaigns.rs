//! Campaign control against the real services (issue 17): `cancel` makes workers ack a campaign's
//! queued jobs without synthesis (status `cancelled`) while other campaigns run, and `--resume`
//! lets its jobs not yet consumed run again. `status --campaign C --watch` (issue 39): one line per
//! refresh without a terminal, and a campaign of another publisher's jobs is waited for until
//! they are settled.

use crate::common;

use std::time::Duration;

use common::TestEnv;
use voxbatch::commands;
use voxbatch::job::Job;
use voxbatch::report::Render;

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

/// `voxbatch status --campaign C --watch` as a process whose standard output is a pipe, not a
/// terminal.
fn spawn_watch(env: &TestEnv, campaign: &str) -> tokio::process::Child {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_voxbatch"));
    cmd.args(["status", "--campaign", campaign, "--watch", "--window", "1m"])
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    for (k, v) in crate::cli::test_env_vars(env) {
        cmd.env(k, v);
    }
    cmd.spawn().expect("start voxbatch status --watch")
}

/// The watch's lines once it has ended by itself.
async fn watch_lines(child: tokio::process::Child) -> Vec<String> {
    let o = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output()).await.expect("the watch ended once the campaign was settled").unwrap();
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(o.status.success(), "{out}{}", String::from_utf8_lossy(&o.stderr));
    out.lines().map(str::to_string).collect()
}

#[tokio::test]
async fn watch_without_a_terminal_prints_one_line_per_refresh_until_the_campaign_is_settled() {
    let env = TestEnv::new("watch_lines").await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("two.txt");
    std::fs::write(&file, "The first line.\nThe second line.\n").unwrap();
    let defaults = voxbatch::enqueue::LineDefaults { campaign: Some("piped".into()), ..Default::default() };
    commands::enqueue(&env.cfg, &file, &defaults, 0, std::future::pending(), |_, _| {}).await.unwrap();
    let mut watch = spawn_watch(&env, "piped");
    // Two refreshes (every 2 s) before any worker runs.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(watch.try_wait().unwrap().is_none(), "nothing is settled yet: the watch goes on");
    env.drain().await;
    let lines = watch_lines(watch).await;
    assert!(lines.len() >= 3, "a line per refresh: {lines:#?}");
    for line in &lines {
        assert!(line.contains("campaign piped: ") && line.starts_with("20") && !line.contains('\u{1b}') && !line.contains('\r'), "{line:?}");
    }
    assert!(lines[0].contains("0 of 2 settled") && lines[0].contains("2 message(s) ready"), "{}", lines[0]);
    assert!(lines.last().unwrap().contains("2 of 2 settled"), "{lines:#?}");
    env.cleanup().await;
}

#[tokio::test]
async fn watch_started_before_any_claim_of_another_publishers_jobs_waits_for_them_and_never_says_0_of_0() {
    let env = TestEnv::new("watch_wait").await;
    // Published by another client (no `voxbatch enqueue`, so nothing says the campaign's size).
    env.publish(&jobs(5, "pika")).await;
    let mut watch = spawn_watch(&env, "pika");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(watch.try_wait().unwrap().is_none(), "5 jobs are queued: the watch waits for them");
    env.drain().await;
    let lines = watch_lines(watch).await;
    let first = &lines[0];
    assert!(!first.contains("0 of 0") && !first.contains("ETA 0 s"), "{first}");
    assert!(first.contains("total unknown") && first.contains("5 message(s) ready") && first.contains("ETA — (the campaign's size is unknown)"), "{first}");
    assert!(lines.iter().all(|l| !l.contains("projected")), "no projection from the jobs claimed so far: {lines:#?}");
    assert!(lines.last().unwrap().contains("5 settled of 5 claimed so far"), "{lines:#?}");
    // The same campaign in one look, as JSON: its size unknown, counted once claimed.
    let progress = commands::campaign_progress(&env.cfg, "pika", Duration::from_secs(60)).await.unwrap();
    assert_eq!((progress.total_known, progress.total_jobs, progress.queue_ready), (false, 5, Some(0)));
    assert!(progress.finished() && progress.cost_usd_projected.is_none());
    assert!(commands::campaign_progress(&env.cfg, "", Duration::from_secs(60)).await.is_err(), "an empty campaign is refused");
    env.cleanup().await;
}
