//! A RabbitMQ cluster that loses a node (issue 18): three local nodes (`scripts/cluster.sh`), the
//! job queue a quorum queue replicated on all three, workers and `enqueue` given every node's
//! address (`amqp.urls`). Killing the node that leads the queue, or stopping the one a publisher is
//! connected to, delays work but loses and duplicates nothing: every job `done` once, one object
//! each, nothing dead-lettered.
//!
//! Needs the cluster: `make test-cluster` starts it, runs these one at a time, and stops it. They
//! are `#[ignore]`d in the ordinary run (no cluster there).

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{assert_each_done_once, jobs, sh, spawn_worker, wait_done, TestEnv};

const JOBS: usize = 5000;

/// The cluster's addresses, from the script that started it.
fn cluster_urls() -> String {
    let out = std::process::Command::new("bash").arg(common::repo_path("scripts/cluster.sh")).arg("urls").output().expect("scripts/cluster.sh urls");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

fn cluster(args: &str) -> String {
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!("{} {args}", common::repo_path("scripts/cluster.sh").display()))
        .output()
        .expect("scripts/cluster.sh");
    assert!(out.status.success(), "cluster.sh {args}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// Takes node `node` down (`kill`: SIGKILL; `stop-node`: a clean stop), and 5 s later starts it
/// again (it rejoins with its data).
async fn lose_node(how: &'static str, node: String) {
    tokio::task::spawn_blocking(move || {
        let script = common::repo_path("scripts/cluster.sh");
        sh(&format!("{} {how} {node}", script.display()));
        std::thread::sleep(Duration::from_secs(5));
        sh(&format!("{} start-node {node}", script.display()));
    })
    .await
    .unwrap();
}

async fn cluster_env(name: &str) -> TestEnv {
    let urls = cluster_urls();
    assert!(urls.contains(":5681/"), "scripts/cluster.sh start first (make test-cluster does)");
    TestEnv::new_with(name, |cfg| {
        cfg.amqp.urls = urls.split(',').map(voxbatch::config::SecretUrl::new).collect();
    })
    .await
}

/// Publishes `batch` the way `voxbatch enqueue` does (confirms, reconnection, republishing what
/// was not confirmed), in the background.
/// `confirmed` follows the broker's confirms.
fn enqueue(env: &TestEnv, batch: Vec<voxbatch::job::Job>, confirmed: Arc<AtomicUsize>) -> tokio::task::JoinHandle<usize> {
    let cfg = env.cfg.clone();
    tokio::spawn(async move {
        let never = std::future::pending::<()>();
        tokio::pin!(never);
        let progress = |n| confirmed.store(n, Ordering::SeqCst);
        voxbatch::commands::publish_with_retry(&cfg, &batch, &mut false, &mut never, progress).await.expect("enqueue rides out the node loss")
    })
}

async fn finish(env: TestEnv, workers: Vec<(tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<voxbatch::worker::WorkerSummary>)>, started: Instant) {
    assert!(wait_done(&env, JOBS as i64, 900).await, "every job done within 15 minutes");
    for (stop, handle) in workers {
        let _ = stop.send(());
        handle.await.unwrap();
    }
    // Copies republished after a lost confirm or redelivered after the node loss: acked as
    // already done, never synthesized twice.
    let rest = env.drain().await;
    assert_eq!((rest.jobs_done, rest.jobs_failed, rest.rejected), (0, 0, 0));
    assert_each_done_once(&env, JOBS).await;
    eprintln!("cluster: {JOBS} jobs done once each in {:.0} s", started.elapsed().as_secs_f64());
    env.cleanup().await;
}

#[tokio::test]
#[ignore = "needs the 3-node cluster: make test-cluster"]
async fn cluster_killing_the_quorum_leader_mid_run_loses_and_duplicates_nothing() {
    let env = cluster_env("cluster_leader").await;
    let started = Instant::now();
    let workers = vec![spawn_worker(&env, env.cfg.clone()), spawn_worker(&env, env.cfg.clone())];
    let publishing = enqueue(&env, jobs(JOBS, 2), Arc::default());
    assert!(wait_done(&env, 300, 300).await, "work under way");
    let leader = cluster(&format!("leader {}", env.cfg.amqp.queue));
    eprintln!("cluster: SIGKILL node {leader}, the leader of {}", env.cfg.amqp.queue);
    lose_node("kill", leader).await;
    assert_eq!(publishing.await.unwrap(), JOBS);
    finish(env, workers, started).await;
}

#[tokio::test]
#[ignore = "needs the 3-node cluster: make test-cluster"]
async fn cluster_a_node_stopped_during_enqueue_loses_and_duplicates_nothing() {
    let env = cluster_env("cluster_enqueue").await;
    let started = Instant::now();
    let workers = vec![spawn_worker(&env, env.cfg.clone()), spawn_worker(&env, env.cfg.clone())];
    let confirmed = Arc::new(AtomicUsize::new(0));
    let publishing = enqueue(&env, jobs(JOBS, 2), confirmed.clone());
    // Publishers and workers connect to the first address that answers: node 1.
    assert!(common::eventually(Duration::from_secs(120), || async { confirmed.load(Ordering::SeqCst) >= 200 }).await, "publishing under way");
    let at = confirmed.load(Ordering::SeqCst);
    assert!(at < JOBS, "the node must stop while enqueue runs (it had finished: make the test's batch larger)");
    eprintln!("cluster: stopping node 1 during enqueue, {at} of {JOBS} jobs confirmed");
    lose_node("stop-node", "1".to_string()).await;
    assert_eq!(publishing.await.unwrap(), JOBS);
    finish(env, workers, started).await;
}
