//! Fault injection against the real services: RabbitMQ, Postgres and SeaweedFS are stopped or
//! restarted while work is in flight. These disturb every other test, so they are `#[ignore]`d in
//! the parallel run and run one at a time by `scripts/test.sh` (and `make test-faults`):
//! `cargo nextest run --test faults --run-ignored only --test-threads 1`.
//! Each ends with every job done exactly once (one `done` row, one object), nothing dead-lettered.

use crate::common;

use std::time::Duration;

use common::{assert_each_done_once, eventually, jobs, sh, spawn_worker, wait_done, TestEnv};

#[tokio::test]
#[ignore = "restarts RabbitMQ: run alone (scripts/test.sh does)"]
async fn faults_rabbitmq_restart_while_workers_run_and_enqueue_publishes() {
    let env = TestEnv::new("mqrestart").await;
    let batch = jobs(40, 10);
    env.publish(&batch[..20]).await;
    let (stop, handle) = spawn_worker(&env, env.cfg.clone());
    assert!(wait_done(&env, 1, 60).await);
    // Restart the broker while the worker runs; publish the rest while it is coming back.
    let restart = tokio::task::spawn_blocking(|| sh("rabbitmqctl -q stop_app && sleep 2 && rabbitmqctl -q start_app && rabbitmqctl -q await_startup"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let never = std::future::pending::<()>();
    tokio::pin!(never);
    let published = voxbatch::commands::publish_with_retry(&env.cfg, &batch[20..], &mut false, &mut never, |_| {}).await.expect("enqueue rides out the restart");
    assert_eq!(published, 20);
    restart.await.unwrap();
    assert!(wait_done(&env, 40, 120).await, "the worker reconnected and finished");
    let _ = stop.send(());
    handle.await.unwrap();
    // Messages whose confirm was lost in the restart were published again: those copies are acked
    // as already done, never synthesized twice.
    let rest = env.drain().await;
    assert_eq!((rest.jobs_done, rest.jobs_failed, rest.rejected), (0, 0, 0));
    assert_each_done_once(&env, 40).await;
    env.cleanup().await;
}

#[tokio::test]
#[ignore = "restarts Postgres: run alone (scripts/test.sh does)"]
async fn faults_postgres_restart_during_work_loses_nothing() {
    let env = TestEnv::new("pgrestart").await;
    let batch = jobs(40, 10);
    env.publish(&batch).await;
    let mut cfg = env.cfg.clone();
    cfg.batching.max_batch = 4;
    let (stop, handle) = spawn_worker(&env, cfg);
    assert!(wait_done(&env, 1, 60).await);
    tokio::task::spawn_blocking(|| sh("pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql | head -n1) main restart"))
        .await
        .unwrap();
    assert!(wait_done(&env, 40, 120).await, "the worker retried through the restart");
    let _ = stop.send(());
    handle.await.unwrap();
    assert_each_done_once(&env, 40).await;
    env.cleanup().await;
}

#[tokio::test]
#[ignore = "stops SeaweedFS: run alone (scripts/test.sh does)"]
async fn faults_seaweedfs_stopped_during_uploads_then_started() {
    let env = TestEnv::new("s3outage").await;
    let batch = jobs(30, 10);
    env.publish(&batch).await;
    let mut cfg = env.cfg.clone();
    cfg.batching.max_batch = 4;
    let root = env!("CARGO_MANIFEST_DIR");
    let (stop, handle) = spawn_worker(&env, cfg);
    assert!(wait_done(&env, 1, 60).await);
    sh(&format!("{root}/scripts/stop-seaweedfs.sh >/dev/null"));
    // While S3 is down: jobs may be synthesized but none is marked done without its object.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let done_while_down = env.count("SELECT count(*) FROM jobs WHERE status = 'done'").await;
    sh(&format!("{root}/scripts/start-seaweedfs.sh 2>/dev/null"));
    assert!(wait_done(&env, 30, 180).await, "uploads resumed");
    let _ = stop.send(());
    handle.await.unwrap();
    assert!(done_while_down < 30);
    assert_each_done_once(&env, 30).await;
    env.cleanup().await;
}

#[tokio::test]
#[ignore = "a long outage and repeated restarts: run alone (scripts/test.sh does)"]
async fn faults_an_outage_past_the_hold_limit_never_spends_the_delivery_limit() {
    // The reproduction: delivery_limit 2, max_hold 2 s, S3 unreachable for many hold periods.
    let env = TestEnv::new_with("outage", |c| c.amqp.delivery_limit = 2).await;
    let batch = jobs(3, 4);
    env.publish(&batch).await;
    let mut broken = env.cfg.clone();
    broken.storage.endpoint = Some("http://127.0.0.1:1".into());
    broken.worker.max_hold = Duration::from_secs(2);
    let (stop, handle) = spawn_worker(&env, broken);
    let cycled = eventually(Duration::from_secs(60), || async {
        env.count("SELECT coalesce(min(attempts), 0)::bigint FROM jobs").await >= 4
    })
    .await;
    assert!(cycled, "each job was given back and claimed again more often than the delivery limit");
    assert_eq!(env.depths().await.1, 0, "nothing dead-lettered by the broker");
    let _ = stop.send(());
    handle.await.unwrap();
    assert_eq!(env.count("SELECT count(*) FROM jobs WHERE status = 'running'").await, 0, "claims released, none stuck in running");
    // The store is back: everything completes.
    assert_eq!(env.drain().await.jobs_done, 3);
    assert_each_done_once(&env, 3).await;
    env.cleanup().await;
}

#[tokio::test]
#[ignore = "a long outage and repeated restarts: run alone (scripts/test.sh does)"]
async fn faults_seven_graceful_restarts_dead_letter_nothing() {
    // The reproduction: default delivery limit, prefetch 100, max_batch 1, 400 jobs, SIGTERM soon
    // after each start, seven times.
    let env = TestEnv::new_with("restarts", |c| c.amqp.prefetch = 100).await;
    let batch = jobs(400, 2);
    env.publish(&batch).await;
    for round in 0..7 {
        let mut child = common::spawn_worker_process(&env, &["--max-batch", "1"]);
        let before = env.count("SELECT coalesce(sum(attempts), 0)::bigint FROM jobs").await;
        let started = eventually(Duration::from_secs(60), || async {
            env.count("SELECT coalesce(sum(attempts), 0)::bigint FROM jobs").await > before
        })
        .await;
        assert!(started, "round {round}: the worker started consuming");
        tokio::time::sleep(Duration::from_millis(500)).await;
        let pid = child.id().expect("running") as i32;
        // SAFETY: sends SIGTERM to our own child process.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
        let status = tokio::time::timeout(Duration::from_secs(60), child.wait()).await.expect("stops promptly").unwrap();
        assert!(status.success(), "round {round}: a graceful stop exits 0 ({status})");
        assert_eq!(env.depths().await.1, 0, "round {round}: nothing dead-lettered");
    }
    let rest = env.drain().await;
    assert_eq!((rest.jobs_failed, rest.rejected), (0, 0));
    assert_each_done_once(&env, 400).await;
    env.cleanup().await;
}
