//! A worker serving the CosyVoice2 token2wav model (`models/cosyvoice2-tiny` as kind
//! `cosyvoice2-token2wav`, random weights): jobs carrying speech tokens become WAVs of 2 × 480
//! samples per token through the real RabbitMQ, Postgres and SeaweedFS; jobs the model cannot take
//! are dead-lettered with their reason. (Text jobs of kind `cosyvoice2`: `cosyvoice2_text_worker.rs`.)

use crate::common;

use common::{dead_letters, model_variant, TestEnv};
use voxbatch::audio::parse_wav_header;
use voxbatch::job::Job;

fn speech_job(tokens: Vec<i64>, voice: &str) -> Job {
    let mut job = Job::new("");
    job.speech_tokens = Some(tokens);
    job.voice = voice.to_string();
    job.campaign = "t2w".to_string();
    job
}

#[tokio::test]
async fn speech_token_jobs_become_audio_and_unusable_ones_are_dead_lettered() {
    let mut env = TestEnv::new("cosyvoice2").await;
    let token2wav_only = model_variant("models/cosyvoice2-tiny", &[(r#"kind = "cosyvoice2""#, r#"kind = "cosyvoice2-token2wav""#)]);
    env.cfg.model.dir = token2wav_only.path().to_path_buf();
    let mut jobs: Vec<Job> = (0..6).map(|i| speech_job((0..(5 + 3 * i)).map(|t| t % 64).collect(), if i % 2 == 0 { "voice0" } else { "voice1" })).collect();
    // Two of them slower and faster: their mel stretched to ⌊frames / speed⌋ before the vocoder.
    (jobs[1].speed, jobs[4].speed) = (Some(0.5), Some(1.5));
    env.publish(&jobs).await;
    let text_only = Job { voice: "voice0".into(), ..Job::new("a text job for a speech-token model") };
    let out_of_vocab = speech_job(vec![1, 2, 64], "voice0");
    env.publish(&[text_only.clone(), out_of_vocab.clone()]).await;

    let summary = env.drain().await;
    assert_eq!(summary.jobs_done, jobs.len() as u64);
    assert_eq!(summary.rejected, 2);
    assert!(summary.batches < jobs.len() as u64, "speech-token jobs were batched");
    let mut codes: Vec<String> = dead_letters(&env, 2).await.into_iter().map(|(code, _)| code).collect();
    codes.sort();
    assert_eq!(codes, vec!["invalid_speech_tokens", "missing_speech_tokens"]);

    for job in &jobs {
        let key = format!("{}t2w/{}.wav", env.key_prefix(), job.job_id);
        let (wav, _) = env.storage.get(&key).await.unwrap();
        let info = parse_wav_header(&wav).expect("a PCM WAV");
        let frames = (job.speech_tokens.as_ref().map_or(0, Vec::len) as f64 * 2.0 / job.speed.unwrap_or(1.0)).floor() as u32;
        assert_eq!((info.sample_rate, info.samples), (24000, frames * 480), "job {} at speed {:?}", job.job_id, job.speed);
        let stored: serde_json::Value = sqlx::query_scalar("SELECT speech_tokens FROM jobs WHERE job_id = $1")
            .bind(job.job_id)
            .fetch_one(env.db.pool())
            .await
            .unwrap();
        assert_eq!(stored, serde_json::json!(job.speech_tokens), "tokens kept for conflict checks and audits");
    }
    // The same id with other tokens, or at another speed, is a conflict, not a silent re-synthesis
    // (nor a silent "already done"); the same speed written out (1 for none) is the same job.
    let mut conflicting = jobs[0].clone();
    conflicting.speech_tokens = Some(vec![9, 9, 9]);
    let mut faster = jobs[1].clone();
    faster.speed = Some(1.0);
    let mut same = jobs[2].clone();
    same.speed = Some(1.0);
    env.publish(&[conflicting, faster, same]).await;
    let summary = env.drain().await;
    assert_eq!((summary.jobs_done, summary.rejected, summary.already_done), (0, 2, 1), "{summary:?}");
    let mut reasons: Vec<String> = dead_letters(&env, 2).await.into_iter().map(|(code, reason)| {
        assert_eq!(code, "conflict");
        reason
    }).collect();
    reasons.sort();
    assert!(reasons.iter().any(|r| r.contains("speech_tokens")) && reasons.iter().any(|r| r.contains("speed")), "{reasons:?}");
    // Without a compiled package for this machine, every batch's flow steps ran on the eager port.
    let kernels: Vec<Option<String>> = sqlx::query_scalar("SELECT DISTINCT kernels FROM batches").fetch_all(env.db.pool()).await.unwrap();
    assert_eq!(kernels, [Some("eager".to_string())]);
    env.cleanup().await;
}
