//! `voxbatch dead list | requeue | purge` against the real RabbitMQ and Postgres (issue 17): the
//! dead-letter queue can be read without being consumed, jobs go back after a fix exactly once —
//! also when a requeue was interrupted between the broker's confirm and the ack of the dead copy —
//! a job still bad returns to the dead-letter queue once, and purging needs consent. And (issue 39)
//! what `dead list` and `status` print is escaped, `status` counts every code, and a requeue cut
//! off by the broker says how many messages it moved.

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

/// Puts `n` messages of `campaign` straight into the dead-letter queue, as a worker would have
/// dead-lettered them (code and reason headers), publisher-confirmed.
async fn dead_letter_directly(env: &TestEnv, n: usize, campaign: &str) -> Vec<uuid::Uuid> {
    use lapin::types::{AMQPValue, FieldTable, LongString};
    let conn = queue::connect(&env.cfg.amqp, "test dead letters").await.unwrap();
    let ch = conn.create_channel().await.unwrap();
    ch.confirm_select(Default::default()).await.unwrap();
    let mut ids = Vec::with_capacity(n);
    let mut confirms = Vec::with_capacity(n);
    for i in 0..n {
        let id = uuid::Uuid::new_v4();
        ids.push(id);
        let body = serde_json::json!({ "job_id": id.to_string(), "text": format!("line {i}"), "campaign": campaign, "voice": "gone" }).to_string();
        let mut headers = FieldTable::default();
        headers.insert(voxbatch::queue::CODE_HEADER.into(), AMQPValue::LongString(LongString::from("unknown_voice")));
        headers.insert(voxbatch::queue::REASON_HEADER.into(), AMQPValue::LongString(LongString::from("unknown voice gone")));
        let props = lapin::BasicProperties::default().with_delivery_mode(2).with_message_id(id.to_string().as_str().into()).with_headers(headers);
        let dlx = env.cfg.amqp.dead_letter_exchange.as_str();
        confirms.push(ch.basic_publish(dlx.into(), env.cfg.amqp.routing_key.as_str().into(), Default::default(), body.as_bytes(), props).await.unwrap());
    }
    for c in confirms {
        assert!(c.await.unwrap().is_ack());
    }
    let _ = conn.close(200, "done".into()).await;
    ids
}

/// A TCP proxy to the broker whose connections the test can cut (as a network failure or a broker
/// crash would).
struct CutProxy {
    port: u16,
    conns: std::sync::Arc<std::sync::Mutex<Vec<tokio::task::AbortHandle>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl CutProxy {
    async fn start(upstream: &'static str) -> CutProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let conns: std::sync::Arc<std::sync::Mutex<Vec<tokio::task::AbortHandle>>> = Default::default();
        let held = conns.clone();
        let accept = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let task = tokio::spawn(async move {
                    if let Ok(mut server) = tokio::net::TcpStream::connect(upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
                held.lock().unwrap().push(task.abort_handle());
            }
        });
        CutProxy { port, conns, accept }
    }

    /// Drops every connection through the proxy.
    fn cut(&self) {
        for c in self.conns.lock().unwrap().drain(..) {
            c.abort();
        }
    }
}

impl Drop for CutProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

#[tokio::test]
async fn a_requeue_cut_off_by_the_broker_says_how_many_it_moved_and_running_it_again_moves_the_rest_once() {
    let env = TestEnv::new("dead_cut").await;
    let total = 1000;
    dead_letter_directly(&env, total, "cut").await;
    assert_eq!(env.depths_settled((0, total as u32)).await, (0, total as u32));
    let proxy = CutProxy::start("127.0.0.1:5672").await;
    let mut vars = crate::cli::test_env_vars(&env);
    vars.push(("AMQP_URL", format!("amqp://guest:guest@127.0.0.1:{}/%2f", proxy.port)));
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_voxbatch"));
    cmd.args(["dead", "requeue", "--campaign", "cut"]).env("RUST_LOG", "warn").kill_on_drop(true);
    for (k, v) in &vars {
        cmd.env(k, v);
    }
    let child = cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().unwrap();
    // Cut the connection once the requeue is under way.
    assert!(common::eventually(std::time::Duration::from_secs(60), || async { env.depths().await.0 >= 20 }).await, "the requeue started");
    proxy.cut();
    let o = tokio::time::timeout(std::time::Duration::from_secs(60), child.wait_with_output()).await.expect("the requeue ended").unwrap();
    let out = crate::cli::text(&o);
    assert!(!o.status.success(), "{out}");
    let moved: usize = out
        .split("dead requeue stopped part-way: ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("says how many it moved: {out}"));
    assert!(moved >= 20 && moved < total, "{out}");
    assert!(out.contains("run the same command again"), "{out}");
    // What it said it moved is in the job queue, the rest back in the dead-letter queue — give or
    // take the message in hand when the cut came: a copy the broker took whose confirm the cut
    // swallowed (one more in the job queue), or one moved whose dead copy was not acked yet (one
    // more in the dead-letter queue, which the next run acks instead of publishing it again).
    let (ready, dead) = env.depths_settled((moved as u32, (total - moved) as u32)).await;
    let (ready, dead) = (ready as usize, dead as usize);
    assert!(ready == moved || ready == moved + 1, "{ready} in the job queue after {moved} moved: {out}");
    assert!(dead == total - moved || dead == total - moved + 1, "{dead} dead after {moved} moved");
    assert!(ready + dead == total || ready + dead == total + 1, "{ready} + {dead}");
    // Again, straight to the broker: the rest moves, none of what moved is published twice.
    let again = commands::dead(&env.cfg, &filter(Some("cut"), None), DeadAction::Requeue { dry_run: false }).await.unwrap();
    assert_eq!(again.requeued, total - moved, "requeued again after {moved} had moved");
    let (ready, dead) = env.depths_settled((total as u32, 0)).await;
    assert_eq!(dead, 0);
    assert!(ready as usize == total || ready as usize == total + 1, "each job in the job queue once (the one whose confirm was lost at most twice, harmless): {ready}");
    env.cleanup().await;
}

#[tokio::test]
async fn dead_list_and_status_escape_what_a_publisher_wrote_and_status_counts_every_code() {
    let env = TestEnv::new("dead_escape").await;
    // A campaign that would forge a log line and clear the operator's screen.
    let evil = "x\n2026-12-03T00:00:00Z  INFO forged line\u{1b}[2J";
    let body = serde_json::json!({ "job_id": uuid::Uuid::new_v4().to_string(), "text": "hi", "campaign": evil }).to_string();
    env.publish_raw(&[body.as_bytes()]).await;
    env.drain().await;
    assert_eq!(env.depths_settled((0, 1)).await, (0, 1));
    let vars = crate::cli::test_env_vars(&env);
    for format in ["table", "csv", "json"] {
        let o = crate::cli::voxbatch(&vars, &["dead", "list", "--format", format]);
        let out = String::from_utf8_lossy(&o.stdout).to_string();
        assert!(o.status.success(), "{}", crate::cli::text(&o));
        assert!(!out.contains('\u{1b}'), "{format}: an escape sequence reached the terminal: {out:?}");
        assert!(!out.lines().any(|l| l.starts_with("2026-12-03T00:00:00Z")), "{format}: a forged line: {out}");
        assert!(out.contains("forged line"), "{format}: the campaign is shown, escaped: {out}");
    }
    // Jobs that failed synthesis are dead-lettered with a `failed` row and no `rejections` row;
    // one at the delivery limit has both: each counted once, under its code.
    sqlx::raw_sql(
        "INSERT INTO jobs (job_id, campaign, voice, text, status, chars, error) VALUES
           ('00000000-0000-0000-0000-0000000000f1', 'c', 'v', 'a', 'failed', 1, 'LLM ran to max_len'),
           ('00000000-0000-0000-0000-0000000000f2', 'c', 'v', 'b', 'failed', 1, 'delivered 5 times without finishing');
         INSERT INTO rejections (job_id, code, reason, payload_bytes, payload_excerpt, worker_id, campaign)
           VALUES ('00000000-0000-0000-0000-0000000000f2', 'delivery_limit', 'delivered 5 times', 1, '', 'w', 'c');",
    )
    .execute(env.db.pool())
    .await
    .unwrap();
    let status = commands::status(&env.cfg).await.unwrap();
    let count = |code: &str| status.rejections_by_code.iter().find(|(c, _)| c == code).map(|(_, n)| *n);
    assert_eq!((count("synthesis_failed"), count("delivery_limit"), count("invalid_field")), (Some(1), Some(1), Some(1)), "{:?}", status.rejections_by_code);
    let o = crate::cli::voxbatch(&vars, &["status"]);
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(out.contains("synthesis_failed") && !out.contains('\u{1b}'), "{out}");
    let o = crate::cli::voxbatch(&vars, &["status", "--format", "json"]);
    let json: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", crate::cli::text(&o)));
    assert_eq!(json["rejections_by_code"]["synthesis_failed"], 1);
    env.cleanup().await;
}
