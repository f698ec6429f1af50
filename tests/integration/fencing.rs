//! Fencing a claim (issue 39, item 8): a worker frozen while it holds a batch, whose jobs another
//! worker claimed, synthesized and committed meanwhile, must neither overwrite their audio nor
//! commit over them when it wakes — the object a `done` row names is exactly the one the row
//! describes (sha256, seconds, batch).

use std::time::Duration;

use sha2::{Digest, Sha256};
use sqlx::Row;

use crate::common::{self, eventually, PausableProxy, TestEnv};
use voxbatch::audio::OutputFormat;
use voxbatch::job::Job;

/// Worker A (a process) uploads through a proxy the test stalls, so its upload hangs in flight;
/// it is then frozen (SIGSTOP). The same jobs reach worker B through a second queue bound to the
/// same exchange (as jobs published twice would); B waits out A's live claims, claims them anew,
/// synthesizes and commits. Then A's stalled upload lands and A wakes. The two workers write MP3 at
/// different bitrates, so their audio differs: a late write over B's object would leave B's row
/// describing other bytes.
#[tokio::test]
async fn a_worker_frozen_mid_upload_neither_overwrites_nor_commits_over_the_claim_that_replaced_it() {
    let env = TestEnv::new("fence").await;
    let mut cfg_b = env.cfg.clone();
    cfg_b.amqp.queue = format!("{}-b", env.cfg.amqp.queue);
    cfg_b.output.format = OutputFormat::Mp3;
    cfg_b.output.bitrates.mp3_kbps = 32;
    {
        let conn = voxbatch::queue::connect(&cfg_b.amqp, "test topology").await.unwrap();
        let ch = conn.create_channel().await.unwrap();
        voxbatch::queue::declare_topology(&ch, &cfg_b.amqp).await.unwrap();
        let _ = conn.close(200, "done".into()).await;
    }
    let proxy = PausableProxy::start("127.0.0.1:8333").await;
    let endpoint = format!("http://127.0.0.1:{}", proxy.port);
    let mut a = common::spawn_worker_process_with(
        &env,
        &[],
        &[("VOXBATCH_STORAGE__ENDPOINT", &endpoint), ("VOXBATCH_OUTPUT__FORMAT", "mp3"), ("VOXBATCH_OUTPUT__MP3_KBPS", "64")],
    );
    let a_pid = a.id().expect("worker A's pid").to_string();
    assert!(
        eventually(Duration::from_secs(60), || async { env.count("SELECT count(*) FROM workers").await == 1 }).await,
        "worker A started"
    );
    let a_id: String = sqlx::query_scalar("SELECT worker_id FROM workers").fetch_one(env.db.pool()).await.unwrap();

    // A's store stalls; the jobs arrive; A claims them and its upload hangs.
    proxy.pause();
    let jobs: Vec<Job> = (0..4).map(|i| Job::new(format!("Fenced job {i}: a claim that lapses while its worker sleeps."))).collect();
    env.publish(&jobs).await;
    assert!(
        eventually(Duration::from_secs(60), || async { env.count("SELECT count(*) FROM jobs WHERE status = 'running'").await == 4 }).await,
        "worker A claimed the batch"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    common::sh(&format!("kill -STOP {a_pid}"));

    // B takes the jobs over once A's heartbeat is stale, and commits them.
    let summary = env.drain_with(&cfg_b).await;
    assert_eq!(summary.jobs_done, 4, "worker B synthesized every job");
    let by_b = env.count("SELECT count(*) FROM jobs WHERE status = 'done' AND attempts = 2").await;
    assert_eq!(by_b, 4, "B committed under the second claim");

    // A's stalled upload lands, then A wakes: its claims were taken over.
    proxy.resume();
    tokio::time::sleep(Duration::from_secs(2)).await;
    common::sh(&format!("kill -CONT {a_pid}"));
    let settled = eventually(Duration::from_secs(60), || async {
        env.objects().await.len() == 4 && env.count("SELECT count(*) FROM batches WHERE worker_id IS NOT NULL").await >= 2
    })
    .await;
    assert!(settled, "A's superseded audio deleted and its batch recorded: {:?}", env.objects().await);

    // Every done row describes the object at its key: bytes, size and batch.
    let rows = sqlx::query("SELECT s3_key, audio_sha256, audio_bytes, batch_id, worker_id FROM jobs WHERE status = 'done'")
        .fetch_all(env.db.pool())
        .await
        .unwrap();
    assert_eq!(rows.len(), 4);
    for r in rows {
        let (key, sha, bytes, batch, worker): (String, String, i64, uuid::Uuid, String) = (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4));
        let (object, meta) = env.storage.get(&key).await.unwrap();
        assert_eq!(hex::encode(Sha256::digest(&object)), sha, "{key}: the object is the row's audio");
        assert_eq!(object.len() as i64, bytes, "{key}: the object has the row's size");
        assert_eq!(meta.get("batch-id"), Some(&batch.to_string()), "{key}: the object was made by the row's batch");
        assert_ne!(worker, a_id, "{key}: the frozen worker did not commit");
    }
    let superseded = env.count("SELECT count(*) FROM batches b WHERE superseded = 4 AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.batch_id = b.batch_id)").await;
    assert_eq!(superseded, 1, "A's batch is recorded (its GPU time is billed), its 4 jobs superseded");
    let audit = voxbatch::commands::audit(&env.cfg, "default", true).await.unwrap();
    assert_eq!((audit.problems(), audit.orphan_objects.len()), (0, 0), "{audit}");

    common::sh(&format!("kill -TERM {a_pid}"));
    let _ = tokio::time::timeout(Duration::from_secs(30), a.wait()).await;
    let conn = voxbatch::queue::connect(&cfg_b.amqp, "test cleanup").await.unwrap();
    let ch = conn.create_channel().await.unwrap();
    let _ = ch.queue_delete(cfg_b.amqp.queue.as_str().into(), Default::default()).await;
    let _ = conn.close(200, "done".into()).await;
    env.cleanup().await;
}

/// `audit` finds a done row whose object is not the one it describes: by size from the listing,
/// by content only with `--deep`.
#[tokio::test]
async fn audit_compares_each_objects_size_and_with_deep_its_sha256_against_its_row() {
    let env = TestEnv::new("auditdeep").await;
    let jobs: Vec<Job> = (0..3).map(|i| Job::new(format!("Audited job number {i}."))).collect();
    env.publish(&jobs).await;
    env.drain().await;
    let clean = voxbatch::commands::audit(&env.cfg, "default", true).await.unwrap();
    assert_eq!((clean.done_rows, clean.problems(), clean.orphan_objects.len()), (3, 0, 0), "{clean}");

    let keys: Vec<String> = sqlx::query_scalar("SELECT s3_key FROM jobs ORDER BY s3_key").fetch_all(env.db.pool()).await.unwrap();
    // Same size, other bytes: only a deep audit can tell.
    let (mut bytes, _) = env.storage.get(&keys[0]).await.unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x55;
    let meta = voxbatch::storage::AudioMeta {
        content_type: "audio/wav",
        job_id: jobs[0].job_id,
        claim: 1,
        batch_id: uuid::Uuid::nil(),
        model: "m".into(),
        voice: "v".into(),
        sha256: String::new(),
    };
    env.storage.put(&keys[0], bytes, &meta).await.unwrap();
    // Another size.
    env.storage.put(&keys[1], b"RIFF short".to_vec(), &meta).await.unwrap();
    let shallow = voxbatch::commands::audit(&env.cfg, "default", false).await.unwrap();
    assert_eq!(shallow.size_mismatches, vec![keys[1].clone()], "{shallow}");
    assert!(shallow.content_mismatches.is_empty());
    let deep = voxbatch::commands::audit(&env.cfg, "default", true).await.unwrap();
    assert_eq!(deep.content_mismatches, vec![keys[0].clone()], "{deep}");
    assert_eq!(deep.problems(), 2);
    env.cleanup().await;
}
