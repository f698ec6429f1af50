//! `voxbatch dead list | requeue | purge` against the real RabbitMQ and Postgres (issue 17): the
//! dead-letter queue can be read without being consumed, jobs go back after a fix exactly once —
//! also when a requeue was interrupted between the broker's confirm and the ack of the dead copy —
//! a job still bad returns to the dead-letter queue once, and purging needs consent.

use crate::common;

use common::TestEnv;
use voxbatch::commands::{self, DeadAction, DeadFilter};
use voxbatch::job::Job;
use voxbatch::queue::{self, dead::DeadLetters};

fn job(text: &str, campaign: &str) -> Job {
    let mut j = Job::new(text);
    j.campaign = campaign.to_string();
    j
}

fn filter(campaign: Option<&str>, code: Option<&str>) -> DeadFilter {
    DeadFilter { campaign: campaign.map(str::to_string), code: code.map(str::to_string), limit: None }
}

#[tokio::test]
async fn dead_letters_are_listed_without_being_consumed_requeued_once_after_a_fix_and_purged_only_with_consent() {
    // Texts over 20 characters are refused: the "bug" the operator fixes later.
    let env = TestEnv::new_with("dead_letters", |c| c.limits.max_text_chars = 20).await;
    let long = "a sentence that is clearly longer than twenty characters";
    let (a_long, b_long): (Vec<Job>, Vec<Job>) = ((0..3).map(|i| job(&format!("{long} {i}"), "a")).collect(), vec![job(long, "b")]);
    let mut jobs = vec![job("short one", "a"), job("short two", "a")];
    jobs.extend(a_long.iter().cloned());
    jobs.extend(b_long.iter().cloned());
    env.publish(&jobs).await;
    env.publish_raw(&[b"not json at all"]).await;
    env.drain().await;
    assert_eq!(env.depths_settled((0, 5)).await, (0, 5), "four long jobs and the unparseable body are dead-lettered");

    // list: everything, with codes and campaigns; nothing consumed.
    let all = commands::dead(&env.cfg, &filter(None, None), DeadAction::List).await.unwrap();
    assert_eq!((all.seen, all.rows.len()), (5, 5));
    assert_eq!(all.rows.iter().filter(|r| r.code == "text_too_long").count(), 4);
    assert!(all.rows.iter().any(|r| r.code == "not_json" && r.job_id.is_none()));
    let first_a = all.rows.iter().find(|r| r.job_id == Some(a_long[0].job_id)).unwrap();
    assert_eq!((first_a.campaign.as_deref(), first_a.rejections), (Some("a"), Some(1)));
    assert!(first_a.reason.contains("20"), "the reason says the limit: {}", first_a.reason);
    assert_eq!(env.depths_settled((0, 5)).await, (0, 5), "listing consumes nothing");
    let only_b = commands::dead(&env.cfg, &filter(Some("b"), None), DeadAction::List).await.unwrap();
    assert_eq!(only_b.rows.iter().map(|r| r.job_id).collect::<Vec<_>>(), vec![Some(b_long[0].job_id)]);
    let limited = DeadFilter { limit: Some(2), ..filter(None, Some("text_too_long")) };
    assert_eq!(commands::dead(&env.cfg, &limited, DeadAction::List).await.unwrap().rows.len(), 2);
    let dry = commands::dead(&env.cfg, &filter(Some("a"), None), DeadAction::Requeue { dry_run: true }).await.unwrap();
    assert!(dry.rows.len() == 3 && dry.rows.iter().all(|r| r.outcome == "would-requeue"));
    assert_eq!(env.depths_settled((0, 5)).await, (0, 5), "a dry run changes nothing");

    // An interrupted requeue: the copy published and recorded, the dead copy never acked.
    {
        let db = env.db.clone();
        let conn = queue::connect(&env.cfg.amqp, "test interrupted requeue").await.unwrap();
        let mut walk = DeadLetters::open(&conn, &env.cfg.amqp).await.unwrap();
        let letter = loop {
            let l = walk.next().await.unwrap().expect("a dead letter");
            if l.job_id == Some(a_long[0].job_id) {
                break l;
            }
        };
        walk.republish(&letter).await.unwrap();
        db.record_requeue(&letter.identity(), letter.job_id, letter.campaign.as_deref(), &letter.code).await.unwrap();
        drop(walk); // the process dies here: the connection goes, unacked messages return
        let _ = conn.close(200, "gone".into()).await;
    }
    assert_eq!(env.depths_settled((1, 5)).await, (1, 5), "the copy is in both queues");

    // The run after it acks that copy instead of publishing it again, and requeues the rest.
    let requeued = commands::dead(&env.cfg, &filter(Some("a"), None), DeadAction::Requeue { dry_run: false }).await.unwrap();
    let outcome = |id| requeued.rows.iter().find(|r| r.job_id == Some(id)).map(|r| r.outcome);
    assert_eq!(outcome(a_long[0].job_id), Some("already-requeued"));
    assert_eq!((outcome(a_long[1].job_id), outcome(a_long[2].job_id)), (Some("requeued"), Some("requeued")));
    assert_eq!(env.depths_settled((3, 2)).await, (3, 2), "each of campaign a's jobs once in the job queue; b and the bad body stay dead");

    // The fix: the limit raised. The requeued jobs are synthesized, once each.
    let mut fixed = env.cfg.clone();
    fixed.limits.max_text_chars = 20_000;
    env.drain_with(&fixed).await;
    assert_eq!(env.count("SELECT count(*) FROM jobs WHERE campaign = 'a' AND status = 'done'").await, 5);
    assert_eq!(env.count("SELECT count(*) FROM jobs WHERE campaign = 'a' AND requeues = 1").await, 3);
    assert_eq!(env.count("SELECT count(*) FROM dead_requeues").await, 3);
    assert_eq!(env.objects().await.len(), 5, "one object per job of campaign a, none twice");

    // A message still bad goes back to the dead-letter queue once.
    let again = commands::dead(&env.cfg, &filter(None, Some("not_json")), DeadAction::Requeue { dry_run: false }).await.unwrap();
    assert_eq!(again.rows.len(), 1);
    env.drain_with(&fixed).await;
    assert_eq!(env.depths_settled((0, 2)).await, (0, 2));
    assert_eq!(env.count("SELECT count(*) FROM rejections WHERE code = 'not_json'").await, 2);

    // Purging needs --yes; with it the messages are gone and Postgres keeps their history.
    let purge = |yes: bool| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_voxbatch"));
        cmd.args(["dead", "purge", "--campaign", "b"])
            .env("VOXBATCH_AMQP__EXCHANGE", &env.cfg.amqp.exchange)
            .env("VOXBATCH_AMQP__QUEUE", &env.cfg.amqp.queue)
            .env("VOXBATCH_AMQP__DEAD_LETTER_EXCHANGE", &env.cfg.amqp.dead_letter_exchange)
            .env("VOXBATCH_AMQP__DEAD_LETTER_QUEUE", &env.cfg.amqp.dead_letter_queue)
            .env("VOXBATCH_AMQP__DELIVERY_LIMIT", env.cfg.amqp.delivery_limit.to_string())
            .env("DATABASE_URL", env.cfg.database.url.expose());
        if yes {
            cmd.arg("--yes");
        }
        cmd.output().expect("run voxbatch dead purge")
    };
    let refused = purge(false);
    assert!(!refused.status.success() && String::from_utf8_lossy(&refused.stderr).contains("--yes"));
    assert_eq!(env.depths_settled((0, 2)).await, (0, 2));
    let purged = purge(true);
    assert!(purged.status.success(), "{}", String::from_utf8_lossy(&purged.stderr));
    assert!(String::from_utf8_lossy(&purged.stdout).contains("purged"));
    assert_eq!(env.depths_settled((0, 1)).await, (0, 1), "only campaign b's job was purged");
    let kept = env.db.job_histories(&[b_long[0].job_id]).await.unwrap();
    assert_eq!(kept.get(&b_long[0].job_id).map(|h| h.rejections), Some(1), "Postgres keeps a purged job's history");
    env.cleanup().await;
}
