//! Shared set-up for integration tests: each test gets its own queue names, database and S3 key
//! prefix (so tests run concurrently against the real RabbitMQ, Postgres and SeaweedFS), and
//! removes them at the end. `scripts/test.sh` sweeps leftovers of crashed runs (`vbt` names).
#![allow(dead_code)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use voxbatch::commands;
use voxbatch::config::{Config, StorageTarget};
use voxbatch::db::Db;
use voxbatch::job::Job;
use voxbatch::model::{Device, ModelHandle, Precision};
use voxbatch::queue::{self, Publisher};
use voxbatch::storage::Storage;
use voxbatch::worker::{self, WorkerOptions, WorkerSummary};

pub struct TestEnv {
    pub id: String,
    pub cfg: Config,
    pub db: Db,
    pub storage: Storage,
}

/// The reference model tests run (bootstrap exports it).
pub fn model_dir() -> PathBuf {
    std::env::var_os("VOXBATCH_TEST_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/reference-tiny"))
}

pub fn repo_path(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// Test configuration with unique names for `id`: queues `vbt-<id>…`, database `vbt_<id>`,
/// S3 keys under `vbt-<id>/` in the default bucket, a spool directory of its own; short timeouts.
pub fn test_config(id: &str) -> Config {
    // scripts/test.sh runs the modules that need no service beside the fault tests, which stop
    // and restart the services, with VOXBATCH_TEST_SERVICES=none: a test there that reaches for
    // them fails here, every time, instead of now and then.
    assert!(
        std::env::var_os("VOXBATCH_TEST_SERVICES").is_none_or(|v| v != "none"),
        "test `{id}` uses RabbitMQ, Postgres and SeaweedFS, but scripts/test.sh runs its module beside the fault tests (BESIDE_FAULTS there)"
    );
    let mut cfg = Config::defaults().expect("default config is valid");
    cfg.amqp.exchange = format!("vbt-{id}");
    cfg.amqp.queue = format!("vbt-{id}.jobs");
    cfg.amqp.dead_letter_exchange = format!("vbt-{id}.dlx");
    cfg.amqp.dead_letter_queue = format!("vbt-{id}.jobs.dead");
    cfg.amqp.events_exchange = format!("vbt-{id}.events");
    cfg.amqp.reconnect_min = Duration::from_millis(100);
    cfg.amqp.reconnect_max = Duration::from_secs(2);
    cfg.database.url = voxbatch::config::SecretUrl::new(format!("postgres://postgres@127.0.0.1:5432/vbt_{id}"));
    cfg.database.max_connections = 4;
    cfg.storage.key_prefix = format!("vbt-{id}/");
    cfg.model.dir = model_dir();
    cfg.model.cpu_threads = 1;
    cfg.batching.max_wait = Duration::from_millis(50);
    cfg.worker.retry_min = Duration::from_millis(50);
    cfg.worker.retry_max = Duration::from_millis(500);
    cfg.worker.drain_poll = Duration::from_millis(100);
    cfg.worker.heartbeat = Duration::from_secs(1);
    // No calibration profile: the conservative built-in memory model (deterministic across machines).
    cfg.memory.calibration_dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("no-calibration");
    cfg.worker.spool_dir = Some(spool_dir(id));
    cfg
}

/// The spool directory of test `id` (removed by [`TestEnv::cleanup`]).
pub fn spool_dir(id: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("spool").join(id)
}

impl TestEnv {
    /// Creates and migrates the test's database, queues and bucket.
    pub async fn new(name: &str) -> TestEnv {
        TestEnv::new_with(name, |_| {}).await
    }

    /// [`TestEnv::new`] with the configuration changed before the topology is declared (e.g. the
    /// queue's delivery limit).
    pub async fn new_with(name: &str, change: impl FnOnce(&mut Config)) -> TestEnv {
        let id = format!("{}_{}", name.chars().take(24).collect::<String>(), &uuid::Uuid::new_v4().simple().to_string()[..8]).replace('-', "_");
        let mut cfg = test_config(&id);
        change(&mut cfg);
        commands::migrate(&cfg).await.expect("migrate (are RabbitMQ, Postgres and SeaweedFS up? run scripts/bootstrap.sh)");
        let db = Db::connect(&cfg.database).await.expect("connect");
        let storage = Storage::open(&cfg.storage).await.expect("storage");
        TestEnv { id, cfg, db, storage }
    }

    pub fn key_prefix(&self) -> String {
        self.cfg.storage.key_prefix.clone()
    }

    pub async fn publish(&self, jobs: &[Job]) {
        let conn = queue::connect(&self.cfg.amqp, "test publisher").await.expect("connect");
        let p = Publisher::new(&conn, &self.cfg.amqp).await.expect("publisher");
        p.publish(jobs, |_| {}).await.expect("publish");
        let _ = conn.close(200, "done".into()).await;
    }

    pub async fn publish_raw(&self, bodies: &[&[u8]]) {
        let conn = queue::connect(&self.cfg.amqp, "test publisher").await.expect("connect");
        let p = Publisher::new(&conn, &self.cfg.amqp).await.expect("publisher");
        for b in bodies {
            p.publish_raw(b).await.expect("publish");
        }
        let _ = conn.close(200, "done".into()).await;
    }

    /// (ready in the job queue, messages in the dead-letter queue)
    pub async fn depths(&self) -> (u32, u32) {
        let conn = queue::connect(&self.cfg.amqp, "test depths").await.expect("connect");
        let ch = conn.create_channel().await.expect("channel");
        let d = queue::queue_depths(&ch, &self.cfg.amqp).await.expect("depths");
        let _ = conn.close(200, "done".into()).await;
        d
    }

    /// The depths once they equal `expected`, or the last ones read after 10 s. Messages that a
    /// nack or a closed channel returns reach a quorum queue through its log, a moment after the
    /// close is confirmed: read at once, they can still count as held.
    pub async fn depths_settled(&self, expected: (u32, u32)) -> (u32, u32) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let d = self.depths().await;
            if d == expected || std::time::Instant::now() > deadline {
                return d;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub fn model(&self) -> ModelHandle {
        self.model_at(&self.cfg.model.dir)
    }

    /// The model in `dir`, loaded as the tests load models (CPU, fp32, one thread) and as
    /// `voxbatch work` does: returned while its thread still loads it (`ModelHandle::start`).
    pub fn model_at(&self, dir: &std::path::Path) -> ModelHandle {
        ModelHandle::start(dir, Device::Cpu, Precision::Fp32, voxbatch::model::LoadOptions { cpu_threads: 1, ..Default::default() }).expect("start loading the model")
    }

    /// Runs a worker with `cfg` until the queue is drained.
    pub async fn drain_with(&self, cfg: &Config) -> WorkerSummary {
        let opts = WorkerOptions { drain: true, worker_id: None };
        tokio::time::timeout(
            Duration::from_secs(300),
            worker::run(cfg.clone(), self.model(), self.db.clone(), Storage::open(&cfg.storage).await.unwrap(), opts, std::future::pending()),
        )
        .await
        .expect("worker drained within 5 minutes")
        .expect("worker ran")
    }

    pub async fn drain(&self) -> WorkerSummary {
        self.drain_with(&self.cfg).await
    }

    pub async fn count(&self, sql: &'static str) -> i64 {
        sqlx::query_scalar(sql).fetch_one(self.db.pool()).await.expect(sql)
    }

    pub async fn objects(&self) -> Vec<String> {
        self.storage.list(&self.key_prefix()).await.expect("list objects")
    }

    /// Removes the test's queues, database and objects.
    pub async fn cleanup(self) {
        if let Ok(conn) = queue::connect(&self.cfg.amqp, "test cleanup").await {
            if let Ok(ch) = conn.create_channel().await {
                let _ = queue::delete_topology(&ch, &self.cfg.amqp).await;
            }
            let _ = conn.close(200, "done".into()).await;
        }
        if matches!(self.cfg.storage.target, StorageTarget::S3 { .. }) {
            if let Ok(keys) = self.storage.list(&self.key_prefix()).await {
                for k in keys {
                    let _ = self.storage.delete(&k).await;
                }
            }
        }
        self.db.pool().close().await;
        drop_database(&self.id).await;
        let _ = tokio::fs::remove_dir_all(spool_dir(&self.id)).await;
    }
}

/// Drops the test's database `vbt_<id>`.
pub async fn drop_database(id: &str) {
    use sqlx::Connection;
    if let Ok(mut conn) = sqlx::PgConnection::connect("postgres://postgres@127.0.0.1:5432/postgres").await {
        let drop = format!("DROP DATABASE IF EXISTS \"vbt_{id}\" WITH (FORCE)");
        let _ = sqlx::raw_sql(&drop).execute(&mut conn).await;
    }
}

/// A `voxbatch work` process (as in production) on the test's queues, database and prefix,
/// heartbeating every second so that its claims expire soon after it is killed.
pub fn spawn_worker_process(env: &TestEnv, args: &[&str]) -> tokio::process::Child {
    spawn_worker_process_with(env, args, &[])
}

/// [`spawn_worker_process`] with more environment variables (they win over the defaults here).
pub fn spawn_worker_process_with(env: &TestEnv, args: &[&str], vars: &[(&str, &str)]) -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_voxbatch"))
        .arg("work")
        .args(args)
        .env("VOXBATCH_AMQP__EXCHANGE", &env.cfg.amqp.exchange)
        .env("VOXBATCH_AMQP__QUEUE", &env.cfg.amqp.queue)
        .env("VOXBATCH_AMQP__DEAD_LETTER_EXCHANGE", &env.cfg.amqp.dead_letter_exchange)
        .env("VOXBATCH_AMQP__DEAD_LETTER_QUEUE", &env.cfg.amqp.dead_letter_queue)
        .env("VOXBATCH_AMQP__EVENTS_EXCHANGE", &env.cfg.amqp.events_exchange)
        .env("VOXBATCH_AMQP__DELIVERY_LIMIT", env.cfg.amqp.delivery_limit.to_string())
        .env("VOXBATCH_AMQP__PREFETCH", env.cfg.amqp.prefetch.to_string())
        .env("DATABASE_URL", env.cfg.database.url.expose())
        .env("VOXBATCH_STORAGE__KEY_PREFIX", env.key_prefix())
        .env("VOXBATCH_MODEL__DIR", &env.cfg.model.dir)
        .env("VOXBATCH_MEMORY__CALIBRATION_DIR", &env.cfg.memory.calibration_dir)
        .env("VOXBATCH_WORKER__SPOOL_DIR", env.cfg.worker.spool_dir())
        .env("VOXBATCH_WORKER__HEARTBEAT", "1s")
        .env("VOXBATCH_METRICS__LISTEN", "off")
        .env("RUST_LOG", "warn")
        .envs(vars.iter().copied())
        .kill_on_drop(true)
        .spawn()
        .expect("start voxbatch work")
}

/// Polls `f` until it returns true or `timeout` passes.
pub async fn eventually<F, Fut>(timeout: Duration, mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while start.elapsed() < timeout {
        if f().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// Reads every message of the dead-letter queue: (x-voxbatch-code, reason).
pub async fn dead_letters(env: &TestEnv, n: usize) -> Vec<(String, String)> {
    let conn = lapin::Connection::connect(env.cfg.amqp.url().expose(), Default::default()).await.unwrap();
    let ch = conn.create_channel().await.unwrap();
    let mut consumer = ch
        .basic_consume(env.cfg.amqp.dead_letter_queue.as_str().into(), "t".into(), lapin::options::BasicConsumeOptions { no_ack: true, ..Default::default() }, lapin::types::FieldTable::default())
        .await
        .unwrap();
    let mut out = Vec::new();
    for _ in 0..n {
        let d = tokio::time::timeout(Duration::from_secs(10), futures::StreamExt::next(&mut consumer)).await.expect("a dead letter").unwrap().unwrap();
        let headers = d.properties.headers().clone().unwrap_or_default();
        let code = match headers.inner().get(voxbatch::queue::CODE_HEADER) {
            Some(lapin::types::AMQPValue::LongString(s)) => String::from_utf8_lossy(s.as_bytes()).to_string(),
            _ => String::new(),
        };
        out.push((code, voxbatch::queue::reason_of(&d.properties).unwrap_or_default()));
    }
    let _ = conn.close(200, "done".into()).await;
    out
}


/// `models/cosyvoice2-tiny` with `max_len` at `ratio`× the text's tokens (20× in the fixture): its
/// random LLM ends speech at random, so tests that want every segment to end give it 200×, and one
/// that wants `max_len` hit gives it a fraction.
pub fn tiny_cosyvoice2_with_max_ratio(ratio: &str) -> tempfile::TempDir {
    model_variant("models/cosyvoice2-tiny", &[("max_token_text_ratio = 20.0", &format!("max_token_text_ratio = {ratio}"))])
}

/// Short text segments (max 20, min 10, merge 5, cap 24 tokens), so that a test's texts make
/// several and a chapter many.
pub fn short_segments(cfg: &mut voxbatch::config::Config) {
    (cfg.frontend.segment_max_tokens, cfg.frontend.segment_min_tokens, cfg.frontend.segment_merge_tokens, cfg.llm.max_text_tokens) = (20, 10, 5, 24);
}

/// The tiny CosyVoice3 with its LM's `max_len` at `ratio` × the text's tokens: its random LM
/// ends on eos after tens of tokens, past 20 × a short segment's few.
pub fn tiny_cosyvoice3_with_max_ratio(ratio: &str) -> tempfile::TempDir {
    model_variant("models/cosyvoice3-tiny", &[("max_token_text_ratio = 20.0", &format!("max_token_text_ratio = {ratio}"))])
}

/// A variant of the model directory `rel`: its files linked, its model.toml with each `(from, to)`
/// replaced (each `from` must be there). For models that differ from a fixture in one setting.
pub fn model_variant(rel: &str, replace: &[(&str, &str)]) -> tempfile::TempDir {
    let src = repo_path(rel);
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(&src).unwrap_or_else(|e| panic!("{} (run scripts/bootstrap.sh): {e}", src.display())) {
        let entry = entry.unwrap();
        if entry.file_name() != "model.toml" {
            std::os::unix::fs::symlink(entry.path(), dir.path().join(entry.file_name())).unwrap();
        }
    }
    let mut toml = std::fs::read_to_string(src.join("model.toml")).unwrap();
    for (from, to) in replace {
        assert!(toml.contains(from), "{} has no `{from}`", src.display());
        toml = toml.replace(from, to);
    }
    std::fs::write(dir.path().join("model.toml"), toml).unwrap();
    dir
}

// ---- Shared by the fault and cluster suites. ----

/// Runs `cmd` with bash; panics unless it succeeds.
pub fn sh(cmd: &str) {
    let status = std::process::Command::new("bash").arg("-c").arg(cmd).status().expect("run shell");
    assert!(status.success(), "`{cmd}` failed");
}

pub fn jobs(n: usize, words: usize) -> Vec<Job> {
    (0..n).map(|i| Job::new(format!("{i} {}", "fault tolerant speech ".repeat(words)))).collect()
}

pub async fn assert_each_done_once(env: &TestEnv, n: usize) {
    assert_eq!(env.count("SELECT count(*) FROM jobs WHERE status = 'done'").await, n as i64, "one done row per job");
    assert_eq!(env.count("SELECT count(*) FROM jobs").await, n as i64);
    assert_eq!(env.objects().await.len(), n, "one object per job");
    assert_eq!(env.depths().await, (0, 0), "nothing left, nothing dead-lettered");
}

/// Runs a worker in the background with the test's config; returns a stop handle.
pub fn spawn_worker(env: &TestEnv, cfg: voxbatch::config::Config) -> (tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<worker::WorkerSummary>) {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let (model, db) = (env.model(), env.db.clone());
    let handle = tokio::spawn(async move {
        let storage = voxbatch::storage::Storage::open(&cfg.storage).await.unwrap();
        worker::run(cfg, model, db, storage, WorkerOptions::default(), async {
            let _ = rx.await;
        })
        .await
        .expect("worker survives the fault")
    });
    (tx, handle)
}

pub async fn wait_done(env: &TestEnv, n: i64, secs: u64) -> bool {
    eventually(Duration::from_secs(secs), || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM jobs WHERE status = 'done'").fetch_one(env.db.pool()).await.map(|c| c >= n).unwrap_or(false)
    })
    .await
}


/// A TCP proxy in front of a service that the test can pause or cut off: while paused, bytes
/// already sent wait in it (a stalled network, a slow upload) and flow again on resume; while
/// refusing, it closes every connection, open or new, at once (a store that is down: requests fail
/// fast instead of hanging). For a worker whose store answers late or not at all.
pub struct PausableProxy {
    pub port: u16,
    mode: tokio::sync::watch::Sender<ProxyMode>,
    accept: tokio::task::JoinHandle<()>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ProxyMode {
    Forward,
    Pause,
    Refuse,
}

impl PausableProxy {
    /// Listens on a free port of 127.0.0.1 and forwards each connection to `upstream`.
    pub async fn start(upstream: &str) -> PausableProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let (mode, rx) = tokio::sync::watch::channel(ProxyMode::Forward);
        let upstream = upstream.to_string();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if *rx.borrow() == ProxyMode::Refuse {
                    drop(client);
                    continue;
                }
                let (rx, upstream) = (rx.clone(), upstream.clone());
                tokio::spawn(async move {
                    let Ok(server) = tokio::net::TcpStream::connect(&upstream).await else { return };
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    tokio::join!(pipe(cr, sw, rx.clone()), pipe(sr, cw, rx));
                });
            }
        });
        PausableProxy { port, mode, accept }
    }

    /// Holds the bytes of every connection until [`PausableProxy::resume`].
    pub fn pause(&self) {
        self.mode.send_replace(ProxyMode::Pause);
    }

    /// Closes every open connection and each new one until [`PausableProxy::resume`].
    pub fn refuse(&self) {
        self.mode.send_replace(ProxyMode::Refuse);
    }

    /// Forwards again.
    pub fn resume(&self) {
        self.mode.send_replace(ProxyMode::Forward);
    }
}

impl Drop for PausableProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Copies `from` to `to` while the proxy forwards; waits while it is paused; ends (closing both)
/// when it refuses.
async fn pipe(mut from: tokio::net::tcp::OwnedReadHalf, mut to: tokio::net::tcp::OwnedWriteHalf, mut mode: tokio::sync::watch::Receiver<ProxyMode>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let read = tokio::select! {
            read = from.read(&mut buf) => Some(read),
            () = refused(&mut mode) => None,
        };
        let n = match read {
            None => return,
            Some(Ok(0) | Err(_)) => {
                let _ = to.shutdown().await;
                return;
            }
            Some(Ok(n)) => n,
        };
        let forward = match mode.wait_for(|m| *m != ProxyMode::Pause).await {
            Ok(m) => *m == ProxyMode::Forward,
            Err(_) => false,
        };
        if !forward || to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// Resolves once the proxy refuses (or is gone).
async fn refused(mode: &mut tokio::sync::watch::Receiver<ProxyMode>) {
    let _ = mode.wait_for(|m| *m == ProxyMode::Refuse).await.map(|_| ());
}

// ---- The compile tool (tools/compile_token2wav.py), shared by the compiled-stage suites. ----

/// `tools/compile_token2wav.py` run by the project venv's Python with `args`; panics unless it
/// succeeds. Its JSON reports, one per stage (lines that are not JSON, e.g. warnings, skipped).
pub fn compile_tool_reports(args: &[&str]) -> Vec<serde_json::Value> {
    let out = std::process::Command::new(repo_path(".venv/bin/python"))
        .arg(repo_path("tools/compile_token2wav.py"))
        .args(args)
        .output()
        .expect("the project venv's python (scripts/bootstrap.sh)");
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).lines().filter(|l| l.starts_with('{')).map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// How many times the kernels of a `--cuda-kernels` report whose name satisfies `matches` are launched.
pub fn kernel_launches(report: &serde_json::Value, matches: impl Fn(&str) -> bool) -> u64 {
    report["kernels"].as_object().unwrap().iter().filter(|(name, _)| matches(name)).map(|(_, n)| n.as_u64().unwrap()).sum()
}

/// Launches of plain weight casts in a `--cuda-kernels` report: kernels fusing nothing but
/// `_to_copy` (`triton_poi_fused__to_copy_<n>`), what a package whose weights are not folded runs
/// on each call.
pub fn weight_casts(report: &serde_json::Value) -> u64 {
    kernel_launches(report, |k| k.strip_prefix("triton_poi_fused__to_copy_").is_some_and(|n| n.chars().all(|c| c.is_ascii_digit())))
}
