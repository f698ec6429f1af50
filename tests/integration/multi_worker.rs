//! Several workers in one process (one per device; here two sharing the CPU) against one queue.

use crate::common;

use common::TestEnv;
use voxbatch::job::Job;
use voxbatch::model::Device;
use voxbatch::worker::WorkerOptions;

#[tokio::test]
async fn workers_sharing_a_device_split_the_queue_and_lose_nothing() {
    let env = TestEnv::new("multi").await;
    let mut cfg = env.cfg.clone();
    cfg.batching.max_batch = 2;
    cfg.amqp.prefetch = 4;
    let jobs: Vec<Job> = (0..40).map(|i| Job::new(format!("job {i}: shared between workers"))).collect();
    env.publish(&jobs).await;
    let opts = WorkerOptions { drain: true, worker_id: Some(format!("{}-w", env.id)) };
    let summaries = voxbatch::commands::work(&cfg, &[Device::Cpu], 2, opts, std::future::pending()).await.unwrap();
    assert_eq!(summaries.len(), 2);
    assert_ne!(summaries[0].worker_id, summaries[1].worker_id);
    assert_eq!(summaries.iter().map(|s| s.jobs_done).sum::<u64>(), 40);
    assert!(summaries.iter().all(|s| s.jobs_done > 0), "both took work: {summaries:?}");
    assert_eq!(env.count("SELECT count(*) FROM workers").await, 2, "one workers row each");
    assert_eq!(env.count("SELECT count(DISTINCT worker_id) FROM batches").await, 2, "metrics rows per worker");
    assert_eq!(env.count("SELECT count(*) FROM jobs WHERE status = 'done'").await, 40);
    assert_eq!(env.objects().await.len(), 40);
    assert!(voxbatch::commands::parse_devices("0,1").unwrap() == vec![Device::Cuda(0), Device::Cuda(1)]);
    assert!(voxbatch::commands::parse_devices("x").is_err());
    env.cleanup().await;
}

#[tokio::test]
async fn one_shutdown_stops_every_worker() {
    let env = TestEnv::new("multistop").await;
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let run = voxbatch::commands::work(&env.cfg, &[Device::Cpu], 2, WorkerOptions::default(), async {
        let _ = rx.await;
    });
    let stopper = async {
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
        let _ = tx.send(());
    };
    let (summaries, ()) = tokio::time::timeout(std::time::Duration::from_secs(60), async { tokio::join!(run, stopper) })
        .await
        .expect("all stop");
    let summaries = summaries.unwrap();
    assert_eq!(summaries.len(), 2);
    assert_eq!(env.count("SELECT count(*) FROM workers WHERE stopped_at IS NOT NULL").await, 2);
    env.cleanup().await;
}
