//! CosyVoice3 text → speech through the whole chain on the tiny random model (bootstrap converts
//! it from `tests/data/cosyvoice3/official`: DiT token2wav, CosyVoice3's LM, its tokenizer, the
//! real grammars): frontend → LLM (CosyVoice3's layout, batched, refilled) → token2wav (buckets
//! between LLM steps) → each job's audio in segment order — the same pipeline as CosyVoice2's
//! (`model::tts`), the family's token2wav and prompts. CosyVoice3's LM refuses input without
//! `<|endofprompt|>`: every mode decoding at all shows its system prompt is there. Random weights
//! do not speak: these tests check the chain's contract, not what it says.

use crate::common;

use std::sync::Arc;

use voxbatch::config::Config;
use voxbatch::frontend::segment::SegmentLimits;
use voxbatch::frontend::{Frontend, SpeakingRates};
use voxbatch::job::Mode;
use voxbatch::model::llm::family::LmFamily;
use voxbatch::model::llm::prompt::PromptError;
use voxbatch::model::tts::{TextJobError, TextPlan, TextToSpeech};
use voxbatch::model::{Device, Manifest, ModelKind, Precision, Stage, SynthItem, Synthesizer, TextInput};

fn rates() -> SpeakingRates {
    SpeakingRates::from_config(&Config::defaults().unwrap().frontend)
}

/// Short segments (max 20, min 10, merge 5, cap 24 tokens), so that texts make several, and the
/// tiny model with a longer max_len (200× the text's tokens): running into it fails a job, which
/// is not what these tests are about.
fn short_segments() -> (Config, tempfile::TempDir, Frontend) {
    let mut cfg = Config::defaults().unwrap();
    common::short_segments(&mut cfg);
    let dir = common::tiny_cosyvoice3_with_max_ratio("200.0");
    let frontend = Frontend::load(dir.path(), SegmentLimits::from_config(&cfg)).unwrap_or_else(|e| panic!("{e} (scripts/bootstrap.sh test converts models/cosyvoice3-tiny)"));
    (cfg, dir, frontend)
}

fn job(frontend: &Frontend, n: u128, text: &str, voice: i64, mode: Option<Mode>, instruction: Option<&str>) -> SynthItem {
    let input = TextInput::prepare(frontend, LmFamily::Cosyvoice3, uuid::Uuid::from_u128(n), text, mode, instruction, &rates(), false).unwrap();
    SynthItem { tokens: Vec::new(), voice, text: Some(Arc::new(input)), speed: None }
}

#[test]
fn cosyvoice3_text_jobs_become_audio_in_each_mode_and_bad_ones_fail_alone() {
    let (cfg, dir, frontend) = short_segments();
    assert_eq!(Manifest::load(dir.path()).unwrap().kind, ModelKind::Cosyvoice3);
    // token2wav buckets of at most 3 segments: several run between LLM steps.
    let plan = TextPlan { token2wav_max_batch: 3, ..TextPlan::small(cfg.llm.clone()) };
    let mut tts = TextToSpeech::load(dir.path(), Device::Cpu, Precision::Fp32, plan).unwrap();
    let chapter = "第一章。".to_string() + &"今天天气很好，我们去公园散步。价格是¥1,299.00。".repeat(6);
    let items = vec![
        // voice1 has a whole prompt (its transcript has no <|endofprompt|>: the system prompt goes before it).
        job(&frontend, 1, "你好，世界！今天是2024年1月15日。", 1, None, None),
        job(&frontend, 2, "It costs $0.99. Call me at 10:30 am!", 0, Some(Mode::Instruct), Some("请用广东话表达。")),
        // A job of speech tokens rides along without the LLM.
        SynthItem::tokens((0..40).map(|t| t % 64).collect(), 0),
        job(&frontend, 4, "你好。", 0, Some(Mode::ZeroShot), None),
        job(&frontend, 5, &chapter, 1, Some(Mode::CrossLingual), None),
        // The reference example's own markup: its prompt prefix is not spoken, its text not normalised.
        job(&frontend, 6, "You are a helpful assistant.<|endofprompt|>[breath]因为他们那一辈人[breath]在乡里面住的要习惯一点。", 0, Some(Mode::CrossLingual), None),
    ];
    let chapter_segments = items[4].text.as_ref().unwrap().segments.len();
    assert!(chapter_segments >= 5, "the chapter is several segments: {chapter_segments}");
    let out = tts.synthesize_text(&items).unwrap();
    assert_eq!(out.len(), items.len());
    for i in [0, 1, 2, 4, 5] {
        let audio = out[i].as_ref().unwrap_or_else(|e| panic!("item {i}: {e}"));
        assert!(!audio.is_empty() && audio.len() % 960 == 0, "item {i}: {} samples", audio.len());
        assert!(audio.joined().iter().all(|s| s.is_finite()));
    }
    assert_eq!(out[2].as_ref().unwrap().len(), 40 * 960, "the speech-token job: 40 tokens' audio");
    assert!(matches!(out[3], Err(TextJobError::Prompt(PromptError::NoPrompt(_)))), "{:?}", out[3].as_ref().err());
    assert_eq!(out[4].as_ref().unwrap().pieces().len(), chapter_segments, "each segment one piece, in order");
    let stages = tts.take_stages();
    let llm = stages.iter().find(|s| s.stage == Stage::Llm).expect("an llm stage");
    let t2w = stages.iter().find(|s| s.stage == Stage::Token2Wav).expect("a token2wav stage");
    let text_segments: u64 = items.iter().filter_map(|i| i.text.as_ref()).map(|t| t.segments.len() as u64).sum();
    assert_eq!(llm.items, text_segments - 1, "every segment but the refused zero-shot job's went through the LLM");
    assert_eq!(t2w.items, llm.items + 1, "every decoded segment and the speech-token job went through token2wav");
}

#[test]
fn a_cosyvoice3_job_gets_the_same_audio_in_a_batch_as_alone() {
    let (cfg, dir, frontend) = short_segments();
    let mut tts = TextToSpeech::load(dir.path(), Device::Cpu, Precision::Fp32, TextPlan::small(cfg.llm.clone())).unwrap();
    let a = job(&frontend, 11, "The train left the station at 6:45 pm, and by midnight it had crossed the river.", 1, None, None);
    let b = job(&frontend, 12, "会议定在下周三上午九点，请大家准时参加。", 0, Some(Mode::CrossLingual), None);
    let c = job(&frontend, 13, "Please read this slowly.", 0, Some(Mode::Instruct), Some("Speak slowly and warmly."));
    let together = tts.synthesize_text(&[a.clone(), b.clone(), c.clone()]).unwrap();
    for (i, item) in [a, b, c].into_iter().enumerate() {
        let alone = tts.synthesize_text(std::slice::from_ref(&item)).unwrap().pop().unwrap().unwrap();
        let batched = together[i].as_ref().unwrap();
        // Each segment samples from its own stream (job id, segment): the same speech tokens, so
        // the same lengths; token2wav's batch equals its items alone to float rounding.
        assert_eq!(batched.pieces().iter().map(Vec::len).collect::<Vec<_>>(), alone.pieces().iter().map(Vec::len).collect::<Vec<_>>(), "item {i}");
        let worst = batched.joined().iter().zip(alone.joined().iter()).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
        assert!(worst < 1e-3, "item {i}: batched and alone differ by {worst}");
    }
}

#[test]
fn an_instruction_reaches_cosyvoice3s_lm_behind_its_system_prompt() {
    let (_, _dir, frontend) = short_segments();
    let prepared = TextInput::prepare(&frontend, LmFamily::Cosyvoice3, uuid::Uuid::nil(), "你好。", Some(Mode::Instruct), Some("请用广东话表达。"), &rates(), false).unwrap();
    let want = frontend.tokenizer().encode("You are a helpful assistant. 请用广东话表达。<|endofprompt|>").unwrap();
    assert_eq!(prepared.instruction.as_deref(), Some(&want[..]));
    // CosyVoice2's as before: the instruction and <|endofprompt|>.
    let cv2 = TextInput::prepare(&frontend, LmFamily::Cosyvoice2, uuid::Uuid::nil(), "你好。", Some(Mode::Instruct), Some("请用广东话表达。"), &rates(), false).unwrap();
    assert_eq!(cv2.instruction.unwrap(), frontend.tokenizer().encode("请用广东话表达。<|endofprompt|>").unwrap());
}

#[tokio::test]
async fn a_measurement_loads_a_text_models_token2wav_half_alone_and_runs_the_batch_as_given() {
    // What `voxbatch calibrate` and the policy bench load (`LoadOptions::token2wav_only`): no LLM,
    // no text plan whose buckets would cut the batch (the small plan's hold 16 segments).
    let options = voxbatch::model::LoadOptions { cpu_threads: 1, token2wav_only: true, ..Default::default() };
    let model = voxbatch::model::ModelHandle::load(&common::repo_path("models/cosyvoice3-tiny"), Device::Cpu, Precision::Fp32, options).await.unwrap();
    assert_eq!(model.manifest().kind, ModelKind::Cosyvoice3);
    assert_eq!(model.llm_slots(), None, "no LLM loaded");
    let items: Vec<SynthItem> = (0..20).map(|i| SynthItem::tokens((0..12).map(|t| (t * 5 + i) % 64).collect(), i % 2)).collect();
    let out = model.synthesize(items).await.unwrap();
    assert_eq!(out.audio.len(), 20);
    assert!(out.audio.iter().all(|a| a.as_ref().is_ok_and(|w| w.len() == 12 * 960)));
    let stages: Vec<(Stage, u64)> = out.stages.iter().map(|s| (s.stage, s.items)).collect();
    assert_eq!(stages, [(Stage::Token2Wav, 20)], "twenty items through token2wav, no LLM stage");
}
