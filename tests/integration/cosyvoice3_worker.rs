//! A worker serving the tiny CosyVoice3 (`models/cosyvoice3-tiny`, kind `cosyvoice3`, random
//! weights) through the real RabbitMQ, Postgres and SeaweedFS: text jobs in each mode (a chapter
//! of many segments among them), one in a voice added from a recording (`voice add`: CosyVoice3's
//! speech tokenizer file and mel), and speech-token jobs riding along become WAVs of whole speech
//! tokens; text that says nothing, a mode its voice cannot serve and speech tokens outside the
//! vocabulary are refused or fail alone with their reasons. Every batch records both stages.
//! Random weights do not speak: the WAVs are noise of the right length.

use crate::common;

use common::{dead_letters, TestEnv};
use voxbatch::audio::parse_wav_header;
use voxbatch::commands::{self, VoiceAdd};
use voxbatch::job::{Job, Mode};

fn speech_job(tokens: Vec<i64>, voice: &str) -> Job {
    let mut job = Job::new("");
    job.speech_tokens = Some(tokens);
    job.voice = voice.to_string();
    job.campaign = "cv3".to_string();
    job
}

fn text_job(text: &str, voice: &str, mode: Option<Mode>, instruction: Option<&str>) -> Job {
    let mut job = Job::new(text);
    job.voice = voice.to_string();
    job.campaign = "cv3".to_string();
    job.mode = mode;
    job.instruction = instruction.map(str::to_string);
    job
}

/// 2.5 s of a gliding tone with a harmonic, as a 16-bit WAV at 22.05 kHz.
fn recording(dir: &std::path::Path) -> std::path::PathBuf {
    let rate = 22050u32;
    let samples: Vec<f32> = (0..(rate as usize * 5 / 2))
        .map(|i| {
            let t = i as f32 / rate as f32;
            let f0 = 150.0 + 30.0 * (t * 1.7).sin();
            0.3 * ((2.0 * std::f32::consts::PI * f0 * t).sin() + 0.4 * (4.0 * std::f32::consts::PI * f0 * t).sin())
        })
        .collect();
    let path = dir.join("narrator.wav");
    std::fs::write(&path, voxbatch::audio::encode_wav(&samples, rate).bytes).unwrap();
    path
}

#[tokio::test]
async fn cosyvoice3_text_and_speech_token_jobs_become_audio_through_the_queue_and_bad_ones_are_refused_or_fail_alone() {
    let mut env = TestEnv::new_with("cosyvoice3", |cfg| {
        // Short segments, so that the chapter makes many.
        common::short_segments(cfg);
    })
    .await;
    // Its random LM ends on eos after tens of tokens: max_len at 200× a segment's text tokens.
    let patient = common::tiny_cosyvoice3_with_max_ratio("200.0");
    let model = patient.path().to_path_buf();
    env.cfg.model.dir = model.clone();
    // A voice from a recording, for CosyVoice3 (its v3 speech tokenizer's stand-in, its mel).
    let tmp = tempfile::tempdir().unwrap();
    let add = VoiceAdd { name: "narrator".into(), audio: recording(tmp.path()), text: "今天天气很好，我们去公园散步。".into(), model_dir: model.clone(), replace: false };
    let added = commands::voice_add(&env.cfg, &add).await.unwrap();
    assert_eq!(added.model, "cosyvoice3-tiny");
    assert!(added.prompt_speech_tokens > 50 && added.prompt_text_tokens > 5, "{added:?}");

    let chapter = "第一章。".to_string() + &"今天天气很好，我们去公园散步。The price was $1,299.50, paid on 2024-01-15. ".repeat(4);
    let mut good = vec![
        text_job("你好，世界！今天是2024年1月15日。", "voice1", Some(Mode::ZeroShot), None),
        text_job("It costs $0.99. Call me at 10:30 am!", "voice0", Some(Mode::Instruct), Some("Speak slowly")),
        text_job("Hello 世界, this is a mixed line with 3 apples.", "voice0", None, None),
        text_job(&chapter, "voice1", Some(Mode::CrossLingual), None),
        text_job("会议定在下周三上午九点，请大家准时参加。", "narrator", Some(Mode::ZeroShot), None),
        speech_job((0..30).map(|t| (7 * t) % 64).collect(), "voice0"),
    ];
    good[5].speed = Some(1.5);
    for (i, job) in good.iter_mut().enumerate() {
        job.job_id = uuid::Uuid::from_u128(0xc3_0000 + i as u128);
    }
    let nothing = text_job("。。。！！ ……", "voice0", None, None);
    let no_prompt = text_job("你好。", "voice0", Some(Mode::ZeroShot), None);
    let out_of_vocab = speech_job(vec![1, 2, 64], "voice1");
    env.publish(&good).await;
    env.publish(&[nothing, no_prompt, out_of_vocab]).await;

    let summary = env.drain().await;
    let mut letters = dead_letters(&env, (summary.rejected + summary.jobs_failed) as usize).await;
    assert_eq!((summary.jobs_done, summary.rejected, summary.jobs_failed), (good.len() as u64, 2, 1), "{summary:?}: {letters:?}");
    letters.sort();
    let codes: Vec<&str> = letters.iter().map(|(c, _)| c.as_str()).collect();
    assert_eq!(codes, ["invalid_speech_tokens", "nothing_to_say", "synthesis_failed"], "{letters:?}");
    assert!(letters[2].1.contains("zero_shot") && letters[2].1.contains("voice0"), "says what is wrong: {}", letters[2].1);

    for job in &good {
        let key = format!("{}cv3/{}.wav", env.key_prefix(), job.job_id);
        let (wav, _) = env.storage.get(&key).await.unwrap_or_else(|e| panic!("{key}: {e}"));
        let info = parse_wav_header(&wav).expect("a PCM WAV");
        assert_eq!(info.sample_rate, 24000);
        match &job.speech_tokens {
            Some(tokens) => assert_eq!(info.samples, (tokens.len() as f64 * 2.0 / 1.5).floor() as u32 * 480, "the speech-token job at speed 1.5"),
            None => assert!(info.samples > 0 && info.samples % 960 == 0, "job {}: {} samples", job.job_id, info.samples),
        }
    }
    let chapter_segments: Option<i32> = sqlx::query_scalar("SELECT segments FROM jobs WHERE job_id = $1").bind(good[3].job_id).fetch_one(env.db.pool()).await.unwrap();
    assert!(chapter_segments.unwrap_or(0) >= 5, "the chapter is many segments: {chapter_segments:?}");
    // Both stages recorded: the text segments through the LLM, those and the speech-token job
    // through token2wav.
    let (llm_items, t2w_items): (i64, i64) = sqlx::query_as(
        "SELECT coalesce(sum(items) FILTER (WHERE stage = 'llm'), 0), coalesce(sum(items) FILTER (WHERE stage = 'token2wav'), 0) FROM batch_stages",
    )
    .fetch_one(env.db.pool())
    .await
    .unwrap();
    let text_segments: i64 = sqlx::query_scalar("SELECT sum(segments)::bigint FROM jobs WHERE status = 'done' AND segments IS NOT NULL").fetch_one(env.db.pool()).await.unwrap();
    assert_eq!((llm_items, t2w_items), (text_segments, text_segments + 1));
    // The directory's voices and the added one, under the model's name.
    let voices: Vec<String> = sqlx::query_scalar("SELECT name FROM voices WHERE model = 'cosyvoice3-tiny' ORDER BY name").fetch_all(env.db.pool()).await.unwrap();
    assert_eq!(voices, ["narrator", "voice0", "voice1"]);
    env.cleanup().await;
}
