//! CosyVoice2 text → speech through the whole chain on the tiny random model (bootstrap builds it:
//! token2wav, LLM, stand-in tokenizer, the real grammars): frontend → LLM (batched, refilled) →
//! token2wav → each job's audio in segment order. Random weights do not speak: these tests check
//! the chain's contract (lengths, modes, each job's failure alone), not what it says.

use std::path::PathBuf;

use voxbatch::config::Config;
use voxbatch::frontend::FrontendError;
use voxbatch::job::Mode;
use voxbatch::model::cosyvoice2::llm::prompt::PromptError;
use voxbatch::model::cosyvoice2::tts::{TextJob, TextJobError, TextToSpeech};
use voxbatch::model::{Device, Precision};

fn model() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/cosyvoice2-tiny");
    assert!(dir.join("tokenizer.json").is_file() && dir.join("llm.safetensors").is_file(), "run scripts/bootstrap.sh");
    dir
}

/// The tiny model with a longer `max_len` (200× the text's tokens instead of 20×): its random LLM
/// ends speech at random (a few percent a step), and running into max_len fails a job — which is
/// not what this test is about. Files linked, model.toml rewritten.
fn patient_model() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(model()).unwrap() {
        let entry = entry.unwrap();
        if entry.file_name() != "model.toml" {
            std::os::unix::fs::symlink(entry.path(), dir.path().join(entry.file_name())).unwrap();
        }
    }
    let toml = std::fs::read_to_string(model().join("model.toml")).unwrap();
    assert!(toml.contains("max_token_text_ratio = 20.0"));
    std::fs::write(dir.path().join("model.toml"), toml.replace("max_token_text_ratio = 20.0", "max_token_text_ratio = 200.0")).unwrap();
    dir
}

fn job(n: u128, text: &str, voice: usize, mode: Option<Mode>, instruction: Option<&str>) -> TextJob {
    TextJob { job_id: uuid::Uuid::from_u128(n), text: text.into(), voice, mode, instruction: instruction.map(str::to_string) }
}

#[test]
fn text_jobs_become_audio_each_mode_and_bad_ones_fail_alone() {
    // Short segments (max 20, min 10, merge 5, cap 24 tokens), so that texts make several.
    let mut cfg = Config::defaults().unwrap();
    (cfg.frontend.segment_max_tokens, cfg.frontend.segment_min_tokens, cfg.frontend.segment_merge_tokens, cfg.llm.max_text_tokens) = (20, 10, 5, 24);
    let dir = patient_model();
    let mut tts = TextToSpeech::load(dir.path(), Device::Cpu, Precision::Fp32, &cfg, 8).unwrap();
    let chapter = "第一章。".to_string() + &"今天天气很好，我们去公园散步。价格是¥1,299.00。".repeat(6);
    let jobs = vec![
        job(1, "你好，世界！今天是2024年1月15日。", 1, None, None),
        job(2, "It costs $0.99. Call me at 10:30 am!", 0, Some(Mode::Instruct), Some("Speak slowly")),
        job(3, "。。。！！", 0, None, None),
        job(4, "你好。", 1, Some(Mode::ZeroShot), None),
        job(5, &chapter, 1, Some(Mode::CrossLingual), None),
    ];
    let segments = tts.frontend().prepare(&chapter).unwrap().segments.len();
    assert!(segments >= 5, "the chapter is several segments: {segments}");
    let out = tts.synthesize(&jobs).unwrap();
    assert_eq!(out.len(), jobs.len());
    for i in [0, 1, 4] {
        let audio = out[i].as_ref().unwrap_or_else(|e| panic!("job {}: {e}", i + 1));
        // 2 mel frames a speech token, 480 samples a frame.
        assert!(!audio.is_empty() && audio.len() % 960 == 0, "job {}: {} samples", i + 1, audio.len());
        assert!(audio.iter().all(|s| s.is_finite()));
    }
    assert!(matches!(out[2], Err(TextJobError::Frontend(FrontendError::Empty))), "{:?}", out[2].as_ref().err());
    // voice1 has a flow prompt but no prompt text: zero-shot is refused with what to do instead.
    assert!(matches!(out[3], Err(TextJobError::Prompt(PromptError::NoPrompt(_)))), "{:?}", out[3].as_ref().err());
    // The chapter's audio is at least one token per segment longer than any one segment could be alone.
    assert!(out[4].as_ref().unwrap().len() >= segments * 960);
}
