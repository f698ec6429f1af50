//! Voices from recordings (issue 15) through the real Postgres (and, for the worker, RabbitMQ and
//! SeaweedFS): `voice add|list|show|rm` on the tiny CosyVoice2 model, whose ONNX models are random
//! stand-ins with the official inputs and outputs; every bad input refused with its reason and
//! nothing stored; and a voice added while a worker runs, used by that worker without a restart,
//! then forgotten once removed. Random weights do not speak: the WAVs are noise of the right length.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{dead_letters, eventually, model_variant, repo_path, TestEnv};
use voxbatch::commands::{self, CommandError, VoiceAdd};
use voxbatch::report::{render, Format};
use voxbatch::job::{Job, Mode};
use voxbatch::storage::Storage;
use voxbatch::worker::{self, WorkerOptions};

/// A 16-bit mono WAV of a voice-like signal (a gliding tone with harmonics and some noise).
fn wav(dir: &Path, name: &str, rate: u32, seconds: f64, amplitude: f32) -> PathBuf {
    let n = (f64::from(rate) * seconds) as usize;
    let mut seed = 7u32;
    let samples: Vec<f32> = (0..n)
        .map(|i| {
            let t = i as f32 / rate as f32;
            seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            let noise = (seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5;
            let f0 = 140.0 + 40.0 * (t * 1.3).sin();
            let voiced = (2.0 * std::f32::consts::PI * f0 * t).sin() + 0.5 * (4.0 * std::f32::consts::PI * f0 * t).sin();
            amplitude * (0.6 * voiced + 0.1 * noise)
        })
        .collect();
    let path = dir.join(name);
    std::fs::write(&path, voxbatch::audio::encode_wav(&samples, rate).bytes).unwrap();
    path
}

fn add(name: &str, audio: &Path, text: &str, model: &Path, replace: bool) -> VoiceAdd {
    VoiceAdd { name: name.into(), audio: audio.to_path_buf(), text: text.into(), model_dir: model.to_path_buf(), replace }
}

fn usage(e: CommandError) -> String {
    match e {
        CommandError::Usage(s) => s,
        other => voxbatch::worker::error_chain(&other),
    }
}

#[tokio::test]
async fn voices_are_added_listed_shown_replaced_and_removed_and_bad_input_stores_nothing() {
    let env = TestEnv::new("voices").await;
    let tiny = repo_path("models/cosyvoice2-tiny");
    let tmp = tempfile::tempdir().unwrap();
    let good = wav(tmp.path(), "narrator.wav", 22050, 3.2, 0.3);

    let added = commands::voice_add(&env.cfg, &add("narrator", &good, "今天天气很好，我们去公园散步。", &tiny, false)).await.unwrap();
    assert_eq!((added.model.as_str(), added.name.as_str(), added.replaced), ("cosyvoice2-tiny", "narrator", false));
    // 3.2 s at 25 tokens a second, trimmed to whole mel-frame pairs.
    assert!((75..=80).contains(&added.prompt_speech_tokens), "{added:?}");
    assert!(added.prompt_text_tokens > 5, "{added:?}");
    assert_eq!(added.sha256.len(), 64);
    let row: (Vec<i32>, Vec<f32>, Vec<f32>, String) =
        sqlx::query_as("SELECT prompt_speech_tokens, prompt_mel, embedding, source FROM voices WHERE model = 'cosyvoice2-tiny' AND name = 'narrator'")
            .fetch_one(env.db.pool())
            .await
            .unwrap();
    assert_eq!(row.0.len(), added.prompt_speech_tokens);
    assert_eq!(row.1.len(), row.0.len() * 2 * 80, "two mel frames of 80 bins per token");
    assert_eq!((row.2.len(), row.3.as_str()), (192, "recording"));
    assert!(row.0.iter().all(|t| (0..64).contains(t)));

    let listed = commands::voice_list(&env.cfg, Some(&tiny)).await.unwrap();
    // The one added, and the model directory's own (not imported: no worker has started).
    assert_eq!(listed.iter().map(|v| v.name.as_str()).collect::<Vec<_>>(), ["narrator", "voice0", "voice1"]);
    assert!(listed[0].zero_shot && listed[0].created_at.is_some());
    assert!(voxbatch::report::render(listed.as_slice(), voxbatch::report::Format::Table).unwrap().contains("narrator"));
    let shown = commands::voice_show(&env.cfg, &tiny, "narrator").await.unwrap();
    assert_eq!(shown.prompt_text.as_deref(), Some("今天天气很好，我们去公园散步。"));
    assert_eq!(shown.source_sha256.as_deref(), Some(added.sha256.as_str()));

    // The name is taken: refused, saying how to overwrite; --replace overwrites (a new version).
    let other = wav(tmp.path(), "other.wav", 48000, 2.0, 0.2);
    let e = usage(commands::voice_add(&env.cfg, &add("narrator", &other, "Hello there.", &tiny, false)).await.unwrap_err());
    assert!(e.contains("already exists") && e.contains("--replace"), "{e}");
    let version = |db: voxbatch::db::Db| async move {
        sqlx::query_scalar::<_, uuid::Uuid>("SELECT version FROM voices WHERE name = 'narrator'").fetch_one(db.pool()).await.unwrap()
    };
    let before = version(env.db.clone()).await;
    let replaced = commands::voice_add(&env.cfg, &add("narrator", &other, "Hello there.", &tiny, true)).await.unwrap();
    assert!(replaced.replaced && replaced.prompt_speech_tokens <= 50, "{replaced:?}");
    assert_ne!(version(env.db.clone()).await, before);

    // Bad input: each refused with its reason, nothing stored.
    let not_audio = tmp.path().join("notes.wav");
    std::fs::write(&not_audio, "these are not samples").unwrap();
    let mut broken = std::fs::read(&good).unwrap();
    broken.truncate(60);
    broken[20] = 0x55; // an unknown format code in the fmt chunk
    let unreadable = tmp.path().join("broken.wav");
    std::fs::write(&unreadable, broken).unwrap();
    let short = wav(tmp.path(), "short.wav", 16000, 0.6, 0.3);
    let long = wav(tmp.path(), "long.wav", 16000, 31.0, 0.3);
    let silence = wav(tmp.path(), "silence.wav", 16000, 3.0, 0.0);
    let no_onnx = model_variant("models/cosyvoice2-tiny", &[]);
    std::fs::remove_file(no_onnx.path().join("campplus.onnx")).unwrap();
    let cases: Vec<(&str, VoiceAdd, &str)> = vec![
        ("not audio", add("a", &not_audio, "Hello.", &tiny, false), "not an audio file"),
        ("unreadable", add("b", &unreadable, "Hello.", &tiny, false), "audio"),
        ("too short", add("c", &short, "Hello.", &tiny, false), "at least 1 s"),
        ("too long", add("d", &long, "Hello.", &tiny, false), "at most 30 s"),
        ("silence", add("e", &silence, "Hello.", &tiny, false), "is silence"),
        ("empty transcript", add("f", &good, "  ", &tiny, false), "transcript"),
        ("transcript of punctuation", add("g", &good, "。。！", &tiny, false), "transcript"),
        ("bad name", add("bad name!", &good, "Hello.", &tiny, false), "voice name"),
        ("missing file", add("h", &tmp.path().join("nowhere.wav"), "Hello.", &tiny, false), "read the recording"),
        ("no ONNX models", add("i", &good, "Hello.", no_onnx.path(), false), "campplus.onnx"),
        ("a model of fixed voices", add("j", &good, "Hello.", &repo_path("models/reference-tiny"), false), "fixed"),
    ];
    for (what, case, says) in cases {
        let e = usage(commands::voice_add(&env.cfg, &case).await.expect_err(what));
        assert!(e.to_lowercase().contains(says), "{what}: {e}");
    }
    assert_eq!(env.count("SELECT count(*) FROM voices").await, 1, "nothing stored by the refusals");

    commands::voice_rm(&env.cfg, &tiny, "narrator").await.unwrap();
    let left = commands::voice_list(&env.cfg, Some(&tiny)).await.unwrap();
    assert!(left.iter().all(|v| v.name != "narrator" && v.created_at.is_none()), "{left:?}");
    let e = usage(commands::voice_rm(&env.cfg, &tiny, "narrator").await.unwrap_err());
    assert!(e.contains("no voice narrator"), "{e}");
    env.cleanup().await;
}

#[tokio::test]
async fn a_voice_added_while_a_worker_runs_is_synthesized_by_it_and_forgotten_once_removed() {
    let patient = common::tiny_cosyvoice2_with_max_ratio("200.0");
    let env = TestEnv::new_with("voicelive", |cfg| cfg.voices.refresh = Duration::from_millis(300)).await;
    let mut cfg = env.cfg.clone();
    cfg.model.dir = patient.path().to_path_buf();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let worker = {
        let (cfg, model, db) = (cfg.clone(), env.model_at(patient.path()), env.db.clone());
        let storage = Storage::open(&cfg.storage).await.unwrap();
        tokio::spawn(worker::run(cfg, model, db, storage, WorkerOptions::default(), async move {
            let _ = stopped.await;
        }))
    };
    let done = |job: uuid::Uuid| {
        let db = env.db.clone();
        async move {
            sqlx::query_scalar::<_, String>("SELECT status FROM jobs WHERE job_id = $1").bind(job).fetch_optional(db.pool()).await.unwrap().as_deref() == Some("done")
        }
    };
    // The worker runs (a job in a voice of the model directory, imported at its start).
    let mut first = Job::new("Hello there.");
    first.voice = "voice0".into();
    env.publish(std::slice::from_ref(&first)).await;
    assert!(eventually(Duration::from_secs(60), || done(first.job_id)).await, "the worker serves the directory's voices");
    let imported = env.count("SELECT count(*) FROM voices WHERE source = 'checkpoint'").await;
    assert_eq!(imported, 2, "the directory's voice0 and voice1 imported");

    // A voice added now is used by the running worker: the job names it at once.
    let tmp = tempfile::tempdir().unwrap();
    let audio = wav(tmp.path(), "fresh.wav", 44100, 2.5, 0.3);
    commands::voice_add(&cfg, &add("fresh", &audio, "今天天气很好。", patient.path(), false)).await.unwrap();
    let mut job = Job::new("你好，世界！");
    job.voice = "fresh".into();
    job.mode = Some(Mode::ZeroShot);
    env.publish(std::slice::from_ref(&job)).await;
    assert!(eventually(Duration::from_secs(60), || done(job.job_id)).await, "the new voice's job is synthesized");
    let key = format!("{}default/{}.wav", env.key_prefix(), job.job_id);
    let (wav_bytes, _) = env.storage.get(&key).await.unwrap_or_else(|e| panic!("{key}: {e}"));
    assert!(voxbatch::audio::parse_wav_header(&wav_bytes).unwrap().samples > 0);

    // Removed: forgotten at the next refresh, then jobs naming it are refused as unknown.
    commands::voice_rm(&cfg, patient.path(), "fresh").await.unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let mut late = Job::new("你好。");
    late.voice = "fresh".into();
    env.publish(std::slice::from_ref(&late)).await;
    let (code, reason) = dead_letters(&env, 1).await.remove(0);
    assert_eq!(code, "unknown_voice");
    assert!(reason.contains("voice0") && reason.contains("voice1") && !reason.contains("fresh,"), "lists the voices there are: {reason}");

    let _ = stop.send(());
    let summary = tokio::time::timeout(Duration::from_secs(60), worker).await.unwrap().unwrap().unwrap();
    assert_eq!((summary.jobs_done, summary.rejected), (2, 1), "{summary:?}");
    env.cleanup().await;
}

#[tokio::test]
async fn a_models_own_voices_are_listed_and_shown_before_any_worker_started_each_saying_whether_it_has_a_zero_shot_prompt() {
    let env = TestEnv::new("voicedir").await;
    let tiny = repo_path("models/cosyvoice2-tiny");
    // Nothing in Postgres: no worker of the model has ever started.
    assert_eq!(env.count("SELECT count(*) FROM voices").await, 0);
    let listed = commands::voice_list(&env.cfg, Some(&tiny)).await.unwrap();
    let seen: Vec<(&str, bool, bool)> = listed.iter().map(|v| (v.name.as_str(), v.zero_shot, v.created_at.is_none())).collect();
    // voices.safetensors: voice0 has only a speaker embedding, voice1 a prompt (text and speech tokens).
    assert_eq!(seen, [("voice0", false, true), ("voice1", true, true)]);
    let shown = commands::voice_show(&env.cfg, &tiny, "voice1").await.unwrap();
    assert_eq!((shown.prompt_speech_tokens, shown.source.as_str()), (6, "checkpoint"));
    let table = render(listed.as_slice(), Format::Table).unwrap();
    let header = table.lines().next().unwrap();
    assert!(header.split_whitespace().eq(["model", "voice", "zero_shot", "prompt_s", "source", "added", "transcript"]), "{table}");
    assert!(table.contains("not imported yet") && table.contains("mode zero_shot is refused"), "{table}");
    // The same through the binary, and as JSON; every model's listing includes the configured model's own.
    let mut vars = crate::cli::test_env_vars(&env);
    vars.push(("VOXBATCH_MODEL__DIR", tiny.display().to_string()));
    let o = crate::cli::voxbatch(&vars, &["voice", "list", "--format", "json"]);
    let json: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", crate::cli::text(&o)));
    assert_eq!((json[0]["name"].as_str(), json[0]["zero_shot"].as_bool(), json[1]["zero_shot"].as_bool()), (Some("voice0"), Some(false), Some(true)));
    let o = crate::cli::voxbatch(&vars, &["voice", "list", "--all"]);
    assert!(o.status.success() && String::from_utf8_lossy(&o.stdout).contains("voice1"), "{}", crate::cli::text(&o));
    let o = crate::cli::voxbatch(&vars, &["voice", "show", "voice0"]);
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(o.status.success() && out.lines().any(|l| l.starts_with("zero_shot") && l.ends_with("no")), "{}", crate::cli::text(&o));

    // A file that is not audio: voice add's own message, no log line of the decoder before it.
    let tmp = tempfile::tempdir().unwrap();
    let notes = tmp.path().join("notes.wav");
    std::fs::write(&notes, "these are not samples").unwrap();
    let o = crate::cli::voxbatch(&vars, &["voice", "add", "n", "--audio", notes.to_str().unwrap(), "--text", "Hello."]);
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(!o.status.success() && err.contains("not an audio file"), "{err}");
    assert!(!err.contains("symphonia") && !err.contains("ERROR"), "a raw decoder log line: {err}");
    env.cleanup().await;
}
