//! Many workers, one Postgres (issue 18): worker processes each keep within their pool
//! (`database.max_connections`), so sixteen of them share one server with no connection errors;
//! a worker that stops heartbeating is flagged stale by `status`, and the jobs it was running are
//! shown as orphaned until the broker gives them to another worker.

use crate::common;

use std::time::Duration;

use common::{assert_each_done_once, eventually, jobs, spawn_worker_process_with, TestEnv};

/// Connections Postgres holds to the test's database now.
async fn connections(env: &TestEnv) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()").fetch_one(env.db.pool()).await.unwrap()
}

#[tokio::test]
async fn sixteen_worker_processes_share_one_postgres_within_their_pools_without_connection_errors() {
    const WORKERS: usize = 16;
    const POOL: usize = 2;
    let env = TestEnv::new("fleet16").await;
    let batch = jobs(400, 3);
    env.publish(&batch).await;
    let pool = POOL.to_string();
    let mut children: Vec<_> = (0..WORKERS)
        .map(|i| {
            let id = format!("{}-w{i}", env.id);
            let vars = [("VOXBATCH_DATABASE__MAX_CONNECTIONS", pool.as_str()), ("VOXBATCH_MODEL__CPU_THREADS", "1"), ("RUST_LOG", "warn")];
            let mut cmd = spawn_worker_process_with(&env, &["--drain", "--worker-id", &id], &vars);
            cmd.stderr.take();
            cmd
        })
        .collect();
    // The server's view while they run: never more than the fleet's budget (+ this test's pool).
    let peak = std::sync::atomic::AtomicI64::new(0);
    let all_done = eventually(Duration::from_secs(240), || async {
        peak.fetch_max(connections(&env).await, std::sync::atomic::Ordering::SeqCst);
        env.count("SELECT count(*) FROM jobs WHERE status = 'done'").await == 400
    })
    .await;
    let peak = peak.into_inner();
    assert!(all_done, "400 jobs done by 16 workers within 4 minutes");
    let mut exits = Vec::new();
    for c in &mut children {
        exits.push(tokio::time::timeout(Duration::from_secs(60), c.wait()).await.expect("each worker drains and exits").unwrap());
    }
    assert!(exits.iter().all(|s| s.success()), "every worker exited 0 (no connection error stopped one): {exits:?}");
    assert!(peak <= (WORKERS * POOL + env.cfg.database.max_connections as usize) as i64, "peak {peak} connections");
    assert_eq!(env.count("SELECT count(DISTINCT worker_id) FROM workers").await, WORKERS as i64, "all sixteen registered");
    assert_each_done_once(&env, 400).await;
    // No batch gave its jobs back for a database error: every job was recorded at its first try.
    assert_eq!(env.count("SELECT count(*) FROM jobs WHERE attempts > 1").await, 0, "no retries for connection errors");
    env.cleanup().await;
}

#[tokio::test]
async fn a_worker_that_stops_heartbeating_is_stale_in_status_and_its_running_jobs_orphaned_until_redelivered() {
    let env = TestEnv::new("stale").await;
    // Short jobs (each batch of the built-in memory profile holds two): the drain after the kill
    // is most of this test's time.
    let batch = jobs(12, 30);
    env.publish(&batch).await;
    let mut frozen = spawn_worker_process_with(&env, &["--worker-id", &format!("{}-frozen", env.id)], &[("VOXBATCH_BATCHING__MAX_BATCH", "4")]);
    let pid = frozen.id().expect("pid") as i32;
    // Freeze it while it holds a running batch (SIGSTOP: no heartbeats, the connection stays open).
    let mut caught = false;
    for _ in 0..3000 {
        if env.count("SELECT count(*) FROM jobs WHERE status = 'running'").await > 0 {
            unsafe { libc::kill(pid, libc::SIGSTOP) };
            if env.count("SELECT count(*) FROM jobs WHERE status = 'running'").await > 0 {
                caught = true;
                break;
            }
            unsafe { libc::kill(pid, libc::SIGCONT) };
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(caught, "the worker was frozen holding a running batch");
    let running = env.count("SELECT count(*) FROM jobs WHERE status = 'running'").await;
    // Three heartbeat intervals (1 s here) later: stale, and its running jobs orphaned.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let status = voxbatch::commands::status(&env.cfg).await.unwrap();
    let me = status.workers.iter().find(|w| w.worker_id.ends_with("-frozen")).expect("the frozen worker is listed");
    assert_eq!(me.state, "stale", "{me:?}");
    assert!(me.seconds_since_heartbeat >= 3.0);
    assert_eq!(status.orphaned_running, running, "its running jobs are shown as orphaned");
    // The host dies: the broker redelivers, another worker finishes everything once.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let _ = frozen.wait().await;
    let summary = env.drain().await;
    assert!(summary.jobs_done > 0);
    assert_each_done_once(&env, 12).await;
    let after = voxbatch::commands::status(&env.cfg).await.unwrap();
    assert_eq!(after.orphaned_running, 0, "nothing orphaned once the broker redelivered");
    env.cleanup().await;
}

#[tokio::test]
async fn a_broker_address_that_never_answers_is_skipped_for_the_next_after_the_connect_timeout() {
    // A "node" that accepts TCP connections and never speaks AMQP (a hung host, a half-open
    // load balancer): connecting must move on to the next address, not wait for ever.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = silent.local_addr().unwrap().port();
    let held = tokio::spawn(async move {
        let mut sockets = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            sockets.push(s);
        }
    });
    let env = TestEnv::new("silent_node").await;
    let mut cfg = env.cfg.amqp.clone();
    let real = cfg.urls[0].clone();
    cfg.urls = vec![voxbatch::config::SecretUrl::new(format!("amqp://guest:guest@127.0.0.1:{port}/%2f")), real];
    let started = std::time::Instant::now();
    let conn = tokio::time::timeout(Duration::from_secs(60), voxbatch::queue::connect(&cfg, "test silent node"))
        .await
        .expect("connect gives up on the silent address")
        .expect("and reaches the real broker");
    let waited = started.elapsed();
    assert!(waited >= voxbatch::queue::CONNECT_TIMEOUT, "the silent address was tried first ({waited:?})");
    let _ = conn.close(200, "done".into()).await;
    held.abort();
    env.cleanup().await;
}
