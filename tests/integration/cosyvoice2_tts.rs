//! CosyVoice2 text → speech through the whole chain on the tiny random model (bootstrap builds it:
//! token2wav, LLM, stand-in tokenizer, the real grammars): frontend → LLM (batched, refilled) →
//! token2wav (buckets between LLM steps) → each job's audio in segment order. Random weights do not
//! speak: these tests check the chain's contract (lengths, modes, each job's failure alone), not
//! what it says.

use crate::common;

use std::sync::Arc;

use voxbatch::config::Config;
use voxbatch::frontend::segment::SegmentLimits;
use voxbatch::frontend::{Frontend, FrontendError, SpeakingRates};
use voxbatch::job::Mode;
use voxbatch::model::llm::prompt::PromptError;
use voxbatch::model::llm::family::LmFamily;
use voxbatch::model::tts::{TextJobError, TextPlan, TextToSpeech};
use voxbatch::model::{Device, Precision, Stage, SynthItem, Synthesizer, TextInput};

fn rates() -> SpeakingRates {
    SpeakingRates::from_config(&Config::defaults().unwrap().frontend)
}

fn job(frontend: &Frontend, n: u128, text: &str, voice: i64, mode: Option<Mode>, instruction: Option<&str>) -> SynthItem {
    let input = TextInput::prepare(frontend, LmFamily::Cosyvoice2, uuid::Uuid::from_u128(n), text, mode, instruction, &rates(), false).unwrap();
    SynthItem { tokens: Vec::new(), voice, text: Some(Arc::new(input)), speed: None }
}

/// Short segments (max 20, min 10, merge 5, cap 24 tokens), so that texts make several, and the
/// tiny model with a longer max_len (200× the text's tokens): running into it fails a job, which
/// is not what these tests are about.
fn short_segments() -> (Config, tempfile::TempDir, Frontend) {
    let mut cfg = Config::defaults().unwrap();
    common::short_segments(&mut cfg);
    let dir = common::tiny_cosyvoice2_with_max_ratio("200.0");
    let frontend = Frontend::load(dir.path(), SegmentLimits::from_config(&cfg)).unwrap();
    (cfg, dir, frontend)
}

#[test]
fn text_jobs_become_audio_each_mode_and_bad_ones_fail_alone() {
    let (cfg, dir, frontend) = short_segments();
    // token2wav buckets of at most 3 segments: several run between LLM steps.
    let plan = TextPlan { token2wav_max_batch: 3, ..TextPlan::small(cfg.llm.clone()) };
    let mut tts = TextToSpeech::load(dir.path(), Device::Cpu, Precision::Fp32, plan).unwrap();
    let chapter = "第一章。".to_string() + &"今天天气很好，我们去公园散步。价格是¥1,299.00。".repeat(6);
    // Text that says nothing never becomes a job: the frontend refuses it (the worker rejects it).
    let nothing = TextInput::prepare(&frontend, LmFamily::Cosyvoice2, uuid::Uuid::from_u128(3), "。。。！！", None, None, &rates(), false);
    assert!(matches!(nothing, Err(FrontendError::Empty)), "{nothing:?}");
    let items = vec![
        // voice1 has a whole prompt (text and speech tokens): zero-shot by default.
        job(&frontend, 1, "你好，世界！今天是2024年1月15日。", 1, None, None),
        job(&frontend, 2, "It costs $0.99. Call me at 10:30 am!", 0, Some(Mode::Instruct), Some("Speak slowly")),
        // A job of speech tokens (as cosyvoice2-token2wav takes) rides along without the LLM.
        SynthItem::tokens((0..40).map(|t| t % 64).collect(), 0),
        job(&frontend, 4, "你好。", 0, Some(Mode::ZeroShot), None),
        job(&frontend, 5, &chapter, 1, Some(Mode::CrossLingual), None),
    ];
    let segments = items[4].text.as_ref().unwrap().segments.len();
    assert!(segments >= 5, "the chapter is several segments: {segments}");
    let out = tts.synthesize_text(&items).unwrap();
    assert_eq!(out.len(), items.len());
    for i in [0, 1, 2, 4] {
        let audio = out[i].as_ref().unwrap_or_else(|e| panic!("item {i}: {e}"));
        // 2 mel frames a speech token, 480 samples a frame.
        assert!(!audio.is_empty() && audio.len() % 960 == 0, "item {i}: {} samples", audio.len());
        assert!(audio.joined().iter().all(|s| s.is_finite()));
    }
    assert_eq!(out[2].as_ref().unwrap().len(), 40 * 960, "the speech-token job: 40 tokens' audio");
    // voice0 has no prompt: zero-shot is refused with what to do instead.
    assert!(matches!(out[3], Err(TextJobError::Prompt(PromptError::NoPrompt(_)))), "{:?}", out[3].as_ref().err());
    // The chapter's audio is at least one token per segment longer than any one segment could be alone.
    assert!(out[4].as_ref().unwrap().len() >= segments * 960);
    // Each segment one piece, in order, joined only where the job is encoded.
    assert_eq!(out[4].as_ref().unwrap().pieces().len(), segments);
    // Both stages accounted: every segment through the LLM and through token2wav.
    let stages = tts.take_stages();
    let llm = stages.iter().find(|s| s.stage == Stage::Llm).expect("an llm stage");
    let t2w = stages.iter().find(|s| s.stage == Stage::Token2Wav).expect("a token2wav stage");
    let text_segments: u64 = items.iter().filter_map(|i| i.text.as_ref()).map(|t| t.segments.len() as u64).sum();
    assert_eq!(llm.items, text_segments - 1, "every segment but the refused zero-shot job's went through the LLM");
    assert_eq!(t2w.items, llm.items + 1, "every decoded segment and the speech-token job went through token2wav");
    assert!(llm.seconds > 0.0 && t2w.seconds > 0.0);
    assert!(tts.take_stages().is_empty(), "taken once");
}

#[test]
fn a_warm_up_sentence_runs_both_stages_and_leaves_no_stage_time() {
    let cfg = Config::defaults().unwrap();
    let dir = common::tiny_cosyvoice2_with_max_ratio("200.0");
    let mut tts = TextToSpeech::load(dir.path(), Device::Cpu, Precision::Fp32, TextPlan::small(cfg.llm.clone())).unwrap();
    let seconds = tts.warm_up(vec![11, 12, 13]).unwrap();
    assert!(seconds > 0.0, "it ran: {seconds}");
    assert!(tts.take_stages().is_empty(), "its stage times are dropped");
    assert_eq!(tts.warm_up(Vec::new()).unwrap(), 0.0, "no text: nothing to warm up");
}

#[test]
fn token2wav_runs_on_the_callers_thread_batch_after_batch_so_its_per_thread_caches_outlive_a_batch() {
    // libtorch keeps cuDNN's convolution plans and attention graphs per thread and per shape, and
    // token2wav's buckets meet new shapes all the time: a token2wav thread born with each batch
    // started them empty (issue 42: ~115 ms of host time a bucket on an H100, 2026-12-07). The
    // decode gets the batch's own thread instead.
    let (cfg, dir, frontend) = short_segments();
    let mut tts = TextToSpeech::load(dir.path(), Device::Cpu, Precision::Fp32, TextPlan::small(cfg.llm.clone())).unwrap();
    let caller = std::thread::current().id();
    for (n, text) in ["The first batch's text, in two sentences. It is short.", "A second batch, another text."].into_iter().enumerate() {
        let input = Arc::new(TextInput::prepare(&frontend, LmFamily::Cosyvoice2, uuid::Uuid::from_u128(n as u128), text, Some(Mode::CrossLingual), None, &rates(), true).unwrap());
        let out = tts.synthesize_text(&[SynthItem { tokens: Vec::new(), voice: 0, text: Some(input), speed: None }]).unwrap();
        assert!(out[0].is_ok(), "batch {n}: {:?}", out[0].as_ref().err());
        let stats = tts.last_bucket_stats();
        assert!(stats.buckets > 0, "batch {n} ran token2wav buckets");
        assert_eq!(stats.thread, Some(caller), "batch {n}: token2wav ran on the caller's thread");
    }
}

#[test]
fn a_batchs_closing_buckets_are_counted_and_timed_from_the_decodes_end() {
    // The buckets run after the LLM's last segment have no decode beside them on the GPU: how many
    // and how long they take is what the batch's log line says (issue 42's closing phase).
    let (cfg, dir, frontend) = short_segments();
    let mut tts = TextToSpeech::load(dir.path(), Device::Cpu, Precision::Fp32, TextPlan::small(cfg.llm.clone())).unwrap();
    let input = Arc::new(TextInput::prepare(&frontend, LmFamily::Cosyvoice2, uuid::Uuid::from_u128(3), "A text of two sentences. Both are short.", Some(Mode::CrossLingual), None, &rates(), true).unwrap());
    let out = tts.synthesize_text(&[SynthItem { tokens: Vec::new(), voice: 0, text: Some(input), speed: None }]).unwrap();
    assert!(out[0].is_ok(), "{:?}", out[0].as_ref().err());
    let stats = tts.last_bucket_stats();
    // A short text fills no bucket while the LLM decodes: its buckets run at the batch's end.
    assert!(stats.closing_buckets >= 1 && stats.closing_buckets <= stats.buckets, "{stats:?}");
    assert!(stats.closing_ms > 0, "the closing buckets took time: {stats:?}");
}

#[test]
fn each_segment_is_stretched_to_its_frames_over_the_jobs_speed() {
    let (cfg, dir, frontend) = short_segments();
    let mut tts = TextToSpeech::load(dir.path(), Device::Cpu, Precision::Fp32, TextPlan::small(cfg.llm.clone())).unwrap();
    // Forced lengths, and one job id: every item's segments get the same speech tokens.
    let text = "今天天气很好，我们去公园散步。The price was $1,299.50, paid on 2024-01-15.";
    let input = Arc::new(TextInput::prepare(&frontend, LmFamily::Cosyvoice2, uuid::Uuid::from_u128(7), text, Some(Mode::CrossLingual), None, &rates(), true).unwrap());
    assert!(input.segments.len() >= 2, "several segments: {}", input.segments.len());
    let speeds = [None, Some(0.5), Some(0.8), Some(1.5), Some(2.0)];
    let mut items: Vec<SynthItem> = speeds.iter().map(|&speed| SynthItem { tokens: Vec::new(), voice: 0, text: Some(input.clone()), speed }).collect();
    // A speech-token job at a speed too.
    items.push(SynthItem { speed: Some(1.5), ..SynthItem::tokens((0..40).map(|t| t % 64).collect(), 0) });
    let out = tts.synthesize_text(&items).unwrap();
    // At speed 1: 2 mel frames a speech token, 480 samples a frame.
    let tokens: Vec<usize> = out[0].as_ref().unwrap().pieces().iter().map(|p| p.len() / 960).collect();
    assert!(out[0].as_ref().unwrap().pieces().iter().all(|p| !p.is_empty() && p.len() % 960 == 0));
    for (speed, audio) in speeds.iter().zip(&out) {
        let audio = audio.as_ref().unwrap_or_else(|e| panic!("speed {speed:?}: {e}"));
        // Each segment's frames stretched to ⌊frames / speed⌋.
        let want: Vec<usize> = tokens.iter().map(|&n| ((2 * n) as f64 / speed.unwrap_or(1.0)).floor() as usize * 480).collect();
        let got: Vec<usize> = audio.pieces().iter().map(Vec::len).collect();
        assert_eq!(got, want, "speed {speed:?}: each segment's samples");
        assert!(audio.joined().iter().all(|s| s.is_finite()));
    }
    assert_eq!(out[5].as_ref().unwrap().len(), (80.0f64 / 1.5).floor() as usize * 480, "the speech-token job: 40 tokens at speed 1.5");
}

/// `[llm] pipelined_buckets` on a GPU: with no waits between a bucket's stages and its waveforms'
/// copy waited for by the cutter thread, the same jobs give the same audio as with the stages
/// waited for one by one (the vocoder's draws seeded alike), and token2wav's row of the bill still
/// holds its buckets' GPU time, read from CUDA events. On a CPU the flag changes nothing, so this
/// runs on a GPU only: `scripts/device/run.sh parity PARTS=tts`.
#[test]
#[ignore = "needs a CUDA device (VOXBATCH_TEST_DEVICE=cuda:0): scripts/device/run.sh parity PARTS=tts"]
fn on_a_gpu_pipelined_buckets_give_the_same_audio_and_bill_token2wavs_gpu_time() {
    let device: Device = std::env::var("VOXBATCH_TEST_DEVICE").expect("VOXBATCH_TEST_DEVICE=cuda:N").parse().unwrap();
    let (cfg, dir, frontend) = short_segments();
    let texts = [
        "Hello there. This sentence is long enough to make several segments of speech.",
        "A second job, shorter.",
        "The third job speaks of buckets, streams and the waveforms' way back to the host.",
    ];
    let jobs: Vec<SynthItem> = texts.iter().enumerate().map(|(n, t)| job(&frontend, n as u128 + 1, t, (n % 2) as i64, None, None)).collect();
    let run = |pipelined: bool| -> (Vec<Vec<f32>>, f64) {
        let mut llm = cfg.llm.clone();
        llm.pipelined_buckets = pipelined;
        let plan = TextPlan { token2wav_max_batch: 2, ..TextPlan::small(llm) };
        let mut tts = TextToSpeech::load(dir.path(), device, Precision::Fp32, plan).unwrap();
        tch::manual_seed(5);
        let audio = tts.synthesize_text(&jobs).unwrap().into_iter().map(|r| r.unwrap().into_samples()).collect();
        let token2wav = tts.take_stages().into_iter().find(|s| s.stage == Stage::Token2Wav).map_or(0.0, |s| s.seconds);
        (audio, token2wav)
    };
    let (waited, waited_seconds) = run(false);
    let (pipelined, pipelined_seconds) = run(true);
    assert_eq!(waited.len(), pipelined.len());
    for (job, (a, b)) in waited.iter().zip(&pipelined).enumerate() {
        assert_eq!(a.len(), b.len(), "job {job}: the same length");
        let worst = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
        assert!(worst < 1e-4, "job {job}: pipelined differs by {worst}");
    }
    println!("PIPELINED token2wav seconds: waited {waited_seconds:.4}, pipelined {pipelined_seconds:.4}");
    assert!(pipelined_seconds > 0.0, "the pipelined buckets' GPU time is billed");
}
