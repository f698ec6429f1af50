//! Text jobs of a `cosyvoice2` model through the real RabbitMQ, Postgres and SeaweedFS: the tiny
//! random model (`models/cosyvoice2-tiny`, made by bootstrap) turns short lines, a mixed-language
//! line, each mode, a chapter of many segments and a speech-token job riding along into WAVs;
//! text that says nothing is refused at the intake, a job its voice cannot serve and one whose LLM
//! runs into `max_len` fail alone with their reasons. Every batch records its two stages, and the
//! cost report splits by stage. Random weights do not speak: the WAVs are noise of the right length.

use crate::common;

use common::{dead_letters, tiny_cosyvoice2_with_max_ratio, TestEnv};
use voxbatch::audio::parse_wav_header;
use voxbatch::frontend::segment::SegmentLimits;
use voxbatch::frontend::Frontend;
use voxbatch::job::{Job, Mode};
use voxbatch::report::{self, Dimension};

fn text_job(text: &str, voice: &str, mode: Option<Mode>, instruction: Option<&str>) -> Job {
    let mut job = Job::new(text);
    job.voice = voice.to_string();
    job.campaign = "cv2".to_string();
    job.mode = mode;
    job.instruction = instruction.map(str::to_string);
    job
}

#[tokio::test]
async fn text_jobs_become_speech_through_the_queue_and_bad_ones_are_refused_or_fail_alone() {
    // Random weights end speech at random: a longer max_len (200× the text instead of 20×) keeps
    // every segment from running into it, which the last part of this test does on purpose.
    let patient = tiny_cosyvoice2_with_max_ratio("200.0");
    let mut env = TestEnv::new_with("cv2text", |cfg| {
        // Short segments, so that the chapter makes many.
        common::short_segments(cfg);
    })
    .await;
    env.cfg.model.dir = patient.path().to_path_buf();
    let chapter = "第一章。".to_string() + &"今天天气很好，我们去公园散步。The price was $1,299.50, paid on 2024-01-15. ".repeat(5);
    let mut speech = Job::new("");
    speech.speech_tokens = Some((0..30).map(|t| t % 64).collect());
    speech.voice = "voice0".into();
    speech.campaign = "cv2".into();
    let mut good = vec![
        // voice1 has a whole prompt (text and speech tokens): zero-shot.
        text_job("你好，世界！今天是2024年1月15日。", "voice1", Some(Mode::ZeroShot), None),
        text_job("It costs $0.99. Call me at 10:30 am!", "voice0", Some(Mode::Instruct), Some("Speak slowly")),
        text_job("Hello 世界, this is a mixed line with 3 apples.", "voice0", Some(Mode::CrossLingual), None),
        text_job(&chapter, "voice1", Some(Mode::CrossLingual), None),
        speech,
    ];
    // Fixed job ids: each segment's sampling is seeded by its job id and index, and with random job
    // ids about one run in twelve had a short chapter segment run the random LLM into max_len
    // ("segment 19: … 532 speech tokens"). These ids end every segment (checked over repeated runs).
    for (i, job) in good.iter_mut().enumerate() {
        job.job_id = uuid::Uuid::from_u128(0x7e57_0000 + i as u128);
    }
    let nothing = text_job("。。。！！ ……", "voice0", None, None);
    let no_prompt = text_job("你好。", "voice0", Some(Mode::ZeroShot), None);
    env.publish(&good).await;
    env.publish(&[nothing, no_prompt]).await;

    let summary = env.drain().await;
    // Every job refused or failed is a dead letter: read them all, so that a failure says why.
    let mut letters = dead_letters(&env, (summary.rejected + summary.jobs_failed) as usize).await;
    assert_eq!((summary.jobs_done, summary.rejected, summary.jobs_failed), (good.len() as u64, 1, 1), "{summary:?}: {letters:?}");
    letters.sort();
    assert_eq!(letters[0].0, "nothing_to_say", "{letters:?}");
    assert_eq!(letters[1].0, "synthesis_failed", "{letters:?}");
    assert!(letters[1].1.contains("zero_shot") && letters[1].1.contains("voice0"), "says what is wrong and what to do: {}", letters[1].1);

    // Each done job: a 24 kHz WAV of whole speech tokens (2 frames × 480 samples), its segments counted.
    let frontend = Frontend::load(patient.path(), SegmentLimits::from_config(&env.cfg)).unwrap();
    let mut text_segments = 0;
    for job in &good {
        let key = format!("{}cv2/{}.wav", env.key_prefix(), job.job_id);
        let (wav, _) = env.storage.get(&key).await.unwrap_or_else(|e| panic!("{key}: {e}"));
        let info = parse_wav_header(&wav).expect("a PCM WAV");
        assert_eq!(info.sample_rate, 24000);
        assert!(info.samples > 0 && info.samples % 960 == 0, "job {}: {} samples", job.job_id, info.samples);
        let segments: Option<i32> = sqlx::query_scalar("SELECT segments FROM jobs WHERE job_id = $1").bind(job.job_id).fetch_one(env.db.pool()).await.unwrap();
        let expected = job.speech_tokens.is_none().then(|| frontend.prepare(&job.text).unwrap().segments.len() as i32);
        assert_eq!(segments, expected, "job {}", job.job_id);
        text_segments += expected.unwrap_or(0);
    }
    assert!(text_segments >= 8, "the chapter is many segments: {text_segments} in all");

    // Both stages of every batch recorded: all text segments through the LLM, those and the
    // speech-token job through token2wav; the stage shares of a batch add up to it.
    let (llm_items, t2w_items): (i64, i64) = sqlx::query_as(
        "SELECT coalesce(sum(items) FILTER (WHERE stage = 'llm'), 0), coalesce(sum(items) FILTER (WHERE stage = 'token2wav'), 0) FROM batch_stages",
    )
    .fetch_one(env.db.pool())
    .await
    .unwrap();
    assert_eq!((llm_items, t2w_items), (i64::from(text_segments), i64::from(text_segments) + 1));
    let off: i64 = env.count("SELECT count(*) FROM (SELECT batch_id FROM batch_stages GROUP BY batch_id HAVING abs(sum(share) - 1) > 1e-9) s").await;
    assert_eq!(off, 0, "stage shares add up to their batch");
    let by_stage = report::report(&env.db, Dimension::Stage, None, Some("cv2")).await.unwrap();
    let keys: Vec<&str> = by_stage.rows.iter().map(|r| r.key.as_str()).collect();
    assert_eq!(keys, ["llm", "token2wav"]);
    let total = by_stage.total.as_ref().unwrap();
    let stage_hours: f64 = by_stage.rows.iter().map(|r| r.gpu_hours).sum();
    assert!((stage_hours - total.gpu_hours).abs() < 1e-9, "the stages' GPU time is the jobs' GPU time: {stage_hours} vs {}", total.gpu_hours);
    assert!(total.usd_per_million_chars.is_some());
    // What users buy by: the jobs' costs add up to their batches' costs, and the chapter pays its
    // batch's price per audio-second like every other job (the sum of its segments' shares).
    let (jobs_cost, batches_cost): (f64, f64) = sqlx::query_as(
        "SELECT (SELECT sum(cost_usd) FROM job_costs WHERE campaign = 'cv2'),
                (SELECT sum(cost_usd) FROM batches WHERE batch_id IN (SELECT batch_id FROM jobs WHERE campaign = 'cv2' AND status = 'done'))",
    )
    .fetch_one(env.db.pool())
    .await
    .unwrap();
    assert!(batches_cost > 0.0 && (jobs_cost - batches_cost).abs() < 1e-9 * batches_cost.max(1.0), "{jobs_cost} vs {batches_cost}");
    let (chapter_rate, batch_rate): (f64, f64) = sqlx::query_as(
        "SELECT jc.cost_usd / jc.audio_seconds, b.cost_usd / b.audio_seconds FROM job_costs jc JOIN batches b USING (batch_id) WHERE jc.job_id = $1",
    )
    .bind(good[3].job_id)
    .fetch_one(env.db.pool())
    .await
    .unwrap();
    assert!((chapter_rate - batch_rate).abs() < 1e-9 * batch_rate, "{chapter_rate} vs {batch_rate}");

    // The same ids again: with another mode or instruction, a conflict saying which (not a
    // silent "already done"); unchanged, done already, synthesized once.
    let mut other_mode = good[0].clone();
    other_mode.mode = Some(Mode::CrossLingual);
    let mut other_instruction = good[1].clone();
    other_instruction.instruction = Some("Speak fast".into());
    env.publish(&[other_mode, other_instruction, good[2].clone()]).await;
    let summary = env.drain().await;
    assert_eq!((summary.jobs_done, summary.rejected, summary.already_done), (0, 2, 1), "{summary:?}");
    let conflicts: Vec<(String, String)> = dead_letters(&env, 2).await;
    assert!(conflicts.iter().all(|(code, _)| code == "conflict"), "{conflicts:?}");
    let mut fields: Vec<&str> = conflicts.iter().filter_map(|(_, reason)| reason.rsplit(' ').next()).collect();
    fields.sort();
    assert_eq!(fields, ["instruction", "mode"], "{conflicts:?}");

    // An LLM that runs into max_len (here 0.2× the text's tokens) fails that job, saying so.
    let impatient = tiny_cosyvoice2_with_max_ratio("0.2");
    env.cfg.model.dir = impatient.path().to_path_buf();
    let long_winded = text_job("今天天气很好，我们去公园散步，然后一起吃午饭。", "voice0", Some(Mode::CrossLingual), None);
    env.publish(std::slice::from_ref(&long_winded)).await;
    let summary = env.drain().await;
    assert_eq!((summary.jobs_done, summary.jobs_failed), (0, 1), "{summary:?}");
    let (code, reason) = dead_letters(&env, 1).await.remove(0);
    assert_eq!(code, "synthesis_failed");
    assert!(reason.contains("max_len"), "{reason}");
    let status: String = sqlx::query_scalar("SELECT status FROM jobs WHERE job_id = $1").bind(long_winded.job_id).fetch_one(env.db.pool()).await.unwrap();
    assert_eq!(status, "failed");
    env.cleanup().await;
}

#[tokio::test]
async fn a_worker_killed_mid_chapter_loses_nothing_and_the_chapter_is_synthesized_again_whole() {
    let patient = tiny_cosyvoice2_with_max_ratio("200.0");
    let mut env = TestEnv::new("cv2kill").await;
    env.cfg.model.dir = patient.path().to_path_buf();
    // 23 segments (25 repeats made about twice as many, for no more checked).
    let chapter = text_job(&"今天天气很好，我们去公园散步。The price was $1,299.50, paid on 2024-01-15. ".repeat(12), "voice1", Some(Mode::CrossLingual), None);
    let lines: Vec<Job> = (0..3).map(|i| text_job(&format!("第{i}行。Line {i} of the book."), "voice0", Some(Mode::CrossLingual), None)).collect();
    env.publish(std::slice::from_ref(&chapter)).await;
    env.publish(&lines).await;
    // A worker process, as in production; killed while the chapter is being synthesized.
    let mut child = common::spawn_worker_process(&env, &[]);
    let chapter_running = || async {
        let status: Option<String> = sqlx::query_scalar("SELECT status FROM jobs WHERE job_id = $1").bind(chapter.job_id).fetch_optional(env.db.pool()).await.unwrap();
        status.as_deref() == Some("running")
    };
    assert!(common::eventually(std::time::Duration::from_secs(120), chapter_running).await, "the worker claimed the chapter");
    child.start_kill().unwrap(); // SIGKILL
    child.wait().await.unwrap();
    let chapter_done: i64 = sqlx::query_scalar("SELECT count(*) FROM jobs WHERE job_id = $1 AND status = 'done'").bind(chapter.job_id).fetch_one(env.db.pool()).await.unwrap();
    assert_eq!(chapter_done, 0, "killed before the chapter was done");

    let summary = env.drain().await;
    let done = env.count("SELECT count(*) FROM jobs WHERE status = 'done'").await;
    assert_eq!(done, 4, "every job done once ({summary:?})");
    assert_eq!(env.objects().await.len(), 4, "one object a job");
    let segments: Option<i32> = sqlx::query_scalar("SELECT segments FROM jobs WHERE job_id = $1").bind(chapter.job_id).fetch_one(env.db.pool()).await.unwrap();
    assert!(segments.unwrap_or(0) >= 10, "the chapter is many segments: {segments:?}");
    assert_eq!(env.depths().await, (0, 0));
    env.cleanup().await;
}

#[tokio::test]
async fn a_model_that_fails_to_load_stops_its_worker_with_the_reason_and_loses_no_job() {
    // The worker starts consuming while its model loads (`ModelHandle::start`). A model whose LLM
    // weights are not a safetensors file fails late in its load (after the intake took the jobs);
    // one whose token2wav weights are not fails at once (before the voices reach it).
    let patient = tiny_cosyvoice2_with_max_ratio("200.0");
    let mut env = TestEnv::new("cv2noload").await;
    let lines: Vec<Job> = (0..4).map(|i| text_job(&format!("第{i}行。Line {i} of the book."), "voice0", Some(Mode::CrossLingual), None)).collect();
    env.publish(&lines).await;
    for file in ["llm.safetensors", "token2wav.safetensors"] {
        let broken = tempfile::tempdir().unwrap();
        for entry in std::fs::read_dir(patient.path()).unwrap() {
            let entry = entry.unwrap();
            let to = broken.path().join(entry.file_name());
            if entry.file_name() == file {
                std::fs::write(&to, b"not a safetensors file").unwrap();
            } else {
                std::os::unix::fs::symlink(entry.path(), &to).unwrap();
            }
        }
        let mut cfg = env.cfg.clone();
        cfg.model.dir = broken.path().to_path_buf();
        let model = env.model_at(broken.path());
        let storage = voxbatch::storage::Storage::open(&cfg.storage).await.unwrap();
        let opts = voxbatch::worker::WorkerOptions { drain: true, worker_id: None };
        let run = voxbatch::worker::run(cfg, model, env.db.clone(), storage, opts, std::future::pending());
        let stopped = tokio::time::timeout(std::time::Duration::from_secs(120), run).await.expect("the worker stops on its own");
        let error = voxbatch::worker::error_chain(&stopped.expect_err("a model that cannot load stops its worker"));
        assert!(error.contains("did not load") && error.contains(file), "says which file: {error}");
        assert_eq!(env.depths_settled((4, 0)).await, (4, 0), "{file}: every job back in the queue, none dead-lettered");
        assert_eq!(env.count("SELECT count(*) FROM jobs WHERE status <> 'queued'").await, 0, "{file}: no job claimed, failed or rejected");
    }

    // The same jobs, with the model that loads: each done once.
    env.cfg.model.dir = patient.path().to_path_buf();
    let summary = env.drain().await;
    assert_eq!((summary.jobs_done, summary.jobs_failed, summary.rejected), (4, 0, 0), "{summary:?}");
    assert_eq!(env.depths().await, (0, 0));
    env.cleanup().await;
}

#[tokio::test]
async fn a_worker_that_stops_while_its_model_loads_waits_for_the_load_to_end() {
    // A `--drain` worker with nothing to do stops at once, while its model (started just before)
    // may still load on the inference thread; a process that exits then crashes in libtorch's
    // teardown (a worker of the 16-process fleet test did, SIGSEGV). The load is held here: the
    // model's model.toml is a FIFO, which the inference thread reads (after `ModelHandle::start`
    // read it once) only when the test writes it again.
    let env = TestEnv::new("cv2stopload").await;
    let src = common::repo_path("models/cosyvoice2-tiny");
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(&src).unwrap() {
        let entry = entry.unwrap();
        if entry.file_name() != "model.toml" {
            std::os::unix::fs::symlink(entry.path(), dir.path().join(entry.file_name())).unwrap();
        }
    }
    let toml = dir.path().join("model.toml");
    assert!(std::process::Command::new("mkfifo").arg(&toml).status().unwrap().success());
    let content = std::fs::read(src.join("model.toml")).unwrap();
    let (release, released) = std::sync::mpsc::channel::<()>();
    let writer = std::thread::spawn(move || {
        std::fs::write(&toml, &content).unwrap(); // for ModelHandle::start
        let _ = released.recv();
        std::fs::write(&toml, &content).unwrap(); // for the load on the inference thread
    });
    let model = env.model_at(dir.path());
    let watch = model.clone();
    let mut cfg = env.cfg.clone();
    cfg.model.dir = dir.path().to_path_buf();
    let storage = voxbatch::storage::Storage::open(&cfg.storage).await.unwrap();
    let opts = voxbatch::worker::WorkerOptions { drain: true, worker_id: None };
    let mut run = tokio::spawn(voxbatch::worker::run(cfg, model, env.db.clone(), storage, opts, std::future::pending()));
    // An empty queue drains in well under a second; the load cannot end before the release.
    let early = tokio::time::timeout(std::time::Duration::from_secs(3), &mut run).await;
    let stopped_early = early.is_ok();
    assert!(!watch.is_settled());
    release.send(()).unwrap();
    let summary = match early {
        Ok(stopped) => stopped,
        Err(_) => tokio::time::timeout(std::time::Duration::from_secs(60), run).await.expect("the worker stops once its model loaded"),
    }
    .unwrap()
    .unwrap();
    writer.join().unwrap();
    assert!(!stopped_early, "the worker stopped while its model was still loading");
    watch.ready().await.expect("the model loaded");
    assert_eq!(summary.jobs_done, 0);
    env.cleanup().await;
}

/// Issue 39, item 6: a text model's batches of jobs stay within `batching.max_text_jobs`
/// (`--max-text-jobs`), the documented cap (`batching.max_batch` caps its token2wav buckets).
#[tokio::test]
async fn text_batches_hold_at_most_max_text_jobs() {
    let patient = tiny_cosyvoice2_with_max_ratio("200.0");
    let mut env = TestEnv::new("cv2maxjobs").await;
    env.cfg.model.dir = patient.path().to_path_buf();
    env.cfg.batching.max_text_jobs = Some(4);
    // Random weights end speech at random: forced lengths make every segment end.
    env.cfg.llm.force_lengths = true;
    env.cfg.batching.max_wait = std::time::Duration::from_secs(2);
    let mut jobs: Vec<Job> = (0..12).map(|i| text_job(&format!("Line number {i} of twelve."), "voice0", None, None)).collect();
    for (i, job) in jobs.iter_mut().enumerate() {
        job.job_id = uuid::Uuid::from_u128(0x6a0b_0000 + i as u128);
    }
    env.publish(&jobs).await;
    let summary = env.drain().await;
    assert_eq!(summary.jobs_done, 12, "{summary:?}");
    let largest: i32 = sqlx::query_scalar("SELECT max(batch_size) FROM batches").fetch_one(env.db.pool()).await.unwrap();
    assert!(largest <= 4, "a batch of {largest} jobs over max_text_jobs = 4");
    env.cleanup().await;
}

/// Issue 39, item 13: a text worker takes the work of its next batch and leaves the rest of the
/// backlog in the queue, so a second worker shares it (before, one worker prefetched three
/// batches' worth of messages and a second ran none).
#[tokio::test]
async fn a_text_worker_takes_its_next_batchs_work_and_leaves_the_rest_of_the_backlog_to_the_fleet() {
    let patient = tiny_cosyvoice2_with_max_ratio("200.0");
    let mut env = TestEnv::new("cv2share").await;
    env.cfg.model.dir = patient.path().to_path_buf();
    env.cfg.llm.force_lengths = true;
    // A small work budget: about two of these lines a batch (1 s of work at 4 audio-s/s = 100 tokens).
    env.cfg.worker.max_hold = std::time::Duration::from_secs(1);
    env.cfg.frontend.estimate_audio_seconds_per_gpu_second = 4.0;
    let mut jobs: Vec<Job> = (0..60).map(|i| text_job(&format!("Line {i} of a backlog a fleet shares."), "voice0", None, None)).collect();
    for (i, job) in jobs.iter_mut().enumerate() {
        job.job_id = uuid::Uuid::from_u128(0x5a4e_0000 + i as u128);
    }
    env.publish(&jobs).await;
    let (stop_a, a) = common::spawn_worker(&env, env.cfg.clone());
    assert!(
        common::eventually(std::time::Duration::from_secs(60), || async { env.count("SELECT count(*) FROM jobs").await > 0 }).await,
        "worker A took jobs"
    );
    let (ready, _) = env.depths().await;
    assert!(ready >= 30, "worker A holds its batch, the next batch's work and at most a window more: {ready} of 60 still ready");
    let b = env.drain().await;
    let _ = stop_a.send(());
    let a = a.await.unwrap();
    // B's drain ends when nothing is ready, which can be while A still holds its next batch's work
    // (once in a `make test` of 2026-12-07: A 29 jobs, B 30). A stopped worker gives back what it had
    // not started, and a last drain does it: every job is done once, none is lost.
    let c = env.drain().await;
    assert_eq!(a.jobs_done + b.jobs_done + c.jobs_done, 60, "{a:?} {b:?} {c:?}");
    assert_eq!(a.already_done + b.already_done + c.already_done, 0, "no job done twice: {a:?} {b:?} {c:?}");
    assert_eq!(env.count("SELECT count(*) FROM jobs WHERE status = 'done'").await, 60);
    assert_eq!(env.depths().await, (0, 0), "nothing left, nothing dead-lettered");
    assert!(b.batches >= 1 && a.batches >= 1, "both workers ran batches: {a:?} {b:?}");
    env.cleanup().await;
}

/// 2026-12-06: a text worker working through a backlog batch after batch keeps its channel and
/// gets each message once. Its first intake took messages in windows of a consumer it cancelled
/// and renewed; on RabbitMQ 3.10's quorum queues a delivery in flight when the cancel landed met a
/// channel that no longer knew the consumer (`function_clause` in `rabbit_channel:handle_deliver0`),
/// the connection closed with INTERNAL_ERROR and every held message came back — on an H100 run,
/// 2,382 reconnections in four minutes, jobs done twice and jobs dead-lettered at the delivery
/// limit. Text workers now pull (`basic.get`) what their next batch needs.
#[tokio::test]
async fn a_text_worker_pulls_a_long_backlog_batch_after_batch_without_losing_its_channel() {
    let patient = tiny_cosyvoice2_with_max_ratio("200.0");
    let mut env = TestEnv::new("cv2pull").await;
    env.cfg.model.dir = patient.path().to_path_buf();
    env.cfg.llm.force_lengths = true;
    // A small work budget: a few of these lines a batch, so the intake fills many batches in turn.
    env.cfg.worker.max_hold = std::time::Duration::from_secs(1);
    env.cfg.frontend.estimate_audio_seconds_per_gpu_second = 4.0;
    let n = 90;
    let mut jobs: Vec<Job> = (0..n).map(|i| text_job(&format!("Line {i} of a long backlog."), "voice0", None, None)).collect();
    for (i, job) in jobs.iter_mut().enumerate() {
        job.job_id = uuid::Uuid::from_u128(0x9011_0000 + i as u128);
    }
    env.publish(&jobs).await;
    let summary = env.drain().await;
    assert_eq!((summary.jobs_done, summary.already_done, summary.jobs_failed), (n as u64, 0, 0), "every job once: {summary:?}");
    assert!(summary.batches >= 10, "the backlog went through many batches: {summary:?}");
    assert_eq!(env.count("SELECT count(*) FROM jobs WHERE attempts > 1").await, 0, "no job was claimed twice");
    assert_eq!(env.depths().await, (0, 0), "nothing left, nothing dead-lettered");
    env.cleanup().await;
}

/// `[model] profile_batch` (set as an operator would, by environment variable): the worker runs the
/// batch it names under libtorch's profiler and writes the kernel table, the streams' summary and the
/// timeline (on a CPU, its operators and an empty summary); the batch's jobs are done as any other's,
/// and a batch it does not name is not profiled.
#[tokio::test]
async fn a_worker_asked_to_profile_its_first_batch_writes_the_profile_and_does_the_jobs() {
    let patient = tiny_cosyvoice2_with_max_ratio("200.0");
    let profiles = tempfile::tempdir().unwrap();
    let dir = profiles.path().join("made-by-the-worker");
    let mut env = TestEnv::new("cv2profile").await;
    env.cfg.model.dir = patient.path().to_path_buf();
    // Two batches at least: a job each.
    let jobs: Vec<Job> = (0..3).map(|i| text_job(&format!("Profiled line {i}."), "voice0", None, None)).collect();
    env.publish(&jobs).await;
    let vars = [
        ("VOXBATCH_MODEL__PROFILE_BATCH", "1"),
        ("VOXBATCH_MODEL__PROFILE_DIR", dir.to_str().unwrap()),
        ("VOXBATCH_LLM__FORCE_LENGTHS", "true"),
        ("VOXBATCH_BATCHING__MAX_BATCH", "1"),
        ("VOXBATCH_MODEL__CPU_THREADS", "1"),
    ];
    let mut worker = common::spawn_worker_process_with(&env, &["--drain"], &vars);
    let pid = worker.id().unwrap();
    let status = tokio::time::timeout(std::time::Duration::from_secs(180), worker.wait()).await.expect("the worker drained").unwrap();
    assert!(status.success(), "{status}");
    assert_eq!(env.count("SELECT count(*) FROM jobs WHERE status = 'done'").await, 3);
    let mut files: Vec<String> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    files.sort();
    let table = format!("batch-1-cpu-{pid}.tsv");
    assert_eq!(files, [table.clone(), format!("{table}.streams"), format!("{table}.timeline")], "the first batch alone, profiled");
    let text = std::fs::read_to_string(dir.join(&table)).unwrap();
    assert!(text.lines().any(|l| l.ends_with("\taten::matmul") || l.ends_with("\taten::mm")), "the operators the batch ran: {text}");
    env.cleanup().await;
}
