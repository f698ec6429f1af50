//! A voice from a recording and its transcript ([`VoicePrompt::from_recording`], the reference's
//! `frontend_zero_shot` prompt half). The voice as data, and a converted checkpoint's voices
//! ([`checkpoint_voices`], its `spk2info.pt`), are the model's (`model::voice_prompt`).
//!
//! Neighbours: `recording`, `features` and `onnx` (the recording's way in); `db::voices` (the
//! table); `model::token2wav` (the tensors); `book` (the worker's cache).

use super::features::{prompt_mel, speaker_fbank, whisper_log_mel};
use super::onnx::{OnnxError, PromptModels};
use super::recording::{Recording, RecordingError};
pub use crate::model::cosyvoice2::checkpoint_voices;
pub use crate::model::voice_prompt::{VoicePrompt, FRAMES_PER_TOKEN, MEL_BINS};

/// Why a recording cannot become a voice.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PromptError {
    #[error(transparent)]
    Recording(#[from] RecordingError),
    #[error(transparent)]
    Onnx(#[from] OnnxError),
    #[error("the speech tokenizer found no speech tokens in the recording")]
    NoSpeechTokens,
}

impl VoicePrompt {
    /// A zero-shot voice from a prompt recording, as `frontend_zero_shot` makes its prompt: speech
    /// tokens of the 16 kHz audio's Whisper log-mel, the embedding of its Kaldi fbank (mean
    /// removed), the mel of the 24 kHz audio (as `models`' recipe says: the family's tokenizer
    /// and mel); tokens and mel trimmed to two frames per token.
    /// `text_tokens` are the transcript's ids (see `Frontend::prompt_tokens`). Blocking.
    pub fn from_recording(
        name: &str,
        recording: &Recording,
        prompt_text: &str,
        text_tokens: Vec<i64>,
        models: &mut PromptModels,
    ) -> Result<VoicePrompt, PromptError> {
        recording.check_prompt()?;
        let at16 = recording.resampled(16_000)?;
        let at24 = recording.resampled(24_000)?;
        let mel = prompt_mel(&at24.samples, models.recipe().mel_fmax);
        let tokens = models.speech_tokens(&whisper_log_mel(&at16.samples))?;
        let embedding = models.embedding(&speaker_fbank(&at16.samples))?;
        // CosyVoice2 forces mel frames = 2 × tokens by trimming both to the shorter.
        let n = (mel.len() / FRAMES_PER_TOKEN).min(tokens.len());
        if n == 0 {
            return Err(PromptError::NoSpeechTokens);
        }
        Ok(VoicePrompt {
            name: name.to_string(),
            prompt_text: Some(prompt_text.to_string()),
            prompt_text_tokens: text_tokens,
            speech_tokens: tokens[..n].to_vec(),
            flow_tokens: None,
            prompt_mel: mel[..n * FRAMES_PER_TOKEN].iter().flatten().copied().collect(),
            embedding,
        })
    }
}

