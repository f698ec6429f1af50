//! A worker serving the CosyVoice3 token2wav model (`models/cosyvoice3-tiny`, random weights):
//! jobs carrying speech tokens become WAVs of 2 × 480 samples per token (stretched by their speed)
//! through the real RabbitMQ, Postgres and SeaweedFS, batched, with the directory's voices imported
//! into Postgres and used by name; jobs the model cannot take are dead-lettered with their reason.

use crate::common;

use common::{dead_letters, TestEnv};
use voxbatch::audio::parse_wav_header;
use voxbatch::job::Job;

fn speech_job(tokens: Vec<i64>, voice: &str) -> Job {
    let mut job = Job::new("");
    job.speech_tokens = Some(tokens);
    job.voice = voice.to_string();
    job.campaign = "cv3".to_string();
    job
}

#[tokio::test]
async fn cosyvoice3_speech_token_jobs_become_audio_through_the_queue_and_unusable_ones_are_dead_lettered() {
    let mut env = TestEnv::new("cosyvoice3").await;
    env.cfg.model.dir = common::repo_path("models/cosyvoice3-tiny");
    let mut jobs: Vec<Job> = (0..6).map(|i| speech_job((0..(4 + 3 * i)).map(|t| (7 * t + i) % 64).collect(), if i % 2 == 0 { "voice0" } else { "voice1" })).collect();
    (jobs[1].speed, jobs[4].speed) = (Some(0.5), Some(1.5));
    env.publish(&jobs).await;
    let text_only = Job { voice: "voice0".into(), ..Job::new("a text job for a speech-token model") };
    let out_of_vocab = speech_job(vec![1, 2, 64], "voice1");
    env.publish(&[text_only, out_of_vocab]).await;

    let summary = env.drain().await;
    assert_eq!((summary.jobs_done, summary.rejected, summary.jobs_failed), (jobs.len() as u64, 2, 0), "{summary:?}");
    assert!(summary.batches < jobs.len() as u64, "speech-token jobs were batched");
    let mut codes: Vec<String> = dead_letters(&env, 2).await.into_iter().map(|(code, _)| code).collect();
    codes.sort();
    assert_eq!(codes, vec!["invalid_speech_tokens", "missing_speech_tokens"]);

    for job in &jobs {
        let key = format!("{}cv3/{}.wav", env.key_prefix(), job.job_id);
        let (wav, _) = env.storage.get(&key).await.unwrap();
        let info = parse_wav_header(&wav).expect("a PCM WAV");
        let frames = (job.speech_tokens.as_ref().map_or(0, Vec::len) as f64 * 2.0 / job.speed.unwrap_or(1.0)).floor() as u32;
        assert_eq!((info.sample_rate, info.samples), (24000, frames * 480), "job {} at speed {:?}", job.job_id, job.speed);
    }
    // The directory's voices were imported into Postgres under the model's name and served by it.
    let voices: Vec<String> = sqlx::query_scalar("SELECT name FROM voices WHERE model = 'cosyvoice3-tiny' ORDER BY name").fetch_all(env.db.pool()).await.unwrap();
    assert_eq!(voices, ["voice0", "voice1"]);
    // Every batch ran the eager port and recorded its token2wav stage: every job's tokens once.
    let kernels: Vec<Option<String>> = sqlx::query_scalar("SELECT DISTINCT kernels FROM batches").fetch_all(env.db.pool()).await.unwrap();
    assert_eq!(kernels, [Some("eager".to_string())]);
    let (stages, tokens): (i64, i64) = sqlx::query_as("SELECT count(*), sum(tokens)::bigint FROM batch_stages WHERE stage = 'token2wav'").fetch_one(env.db.pool()).await.unwrap();
    assert_eq!(stages, env.count("SELECT count(*) FROM batches").await);
    assert_eq!(tokens, jobs.iter().map(|j| j.speech_tokens.as_ref().map_or(0, Vec::len) as i64).sum::<i64>());
    env.cleanup().await;
}
