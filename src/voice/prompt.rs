//! A voice as data ([`VoicePrompt`]): what a worker caches, Postgres stores and the model thread
//! turns into tensors — the speaker embedding and, for zero-shot voices, the prompt (speech
//! tokens, mel, transcript tokens). Two sources: a recording and its transcript
//! ([`VoicePrompt::from_recording`], the reference's `frontend_zero_shot` prompt half), and a
//! converted checkpoint's `voices.safetensors` ([`checkpoint_voices`], its `spk2info.pt`).
//!
//! Neighbours: `recording`, `features` and `onnx` (the recording's way in); `db::voices` (the
//! table); `model::cosyvoice2` (the tensors); `book` (the worker's cache).

use std::path::Path;

use super::features::{prompt_mel, speaker_fbank, whisper_log_mel};
use super::onnx::{OnnxError, PromptModels, EMBEDDING_DIM};
use super::recording::{Recording, RecordingError};
use crate::model::{Manifest, ModelError};

/// Mel bins of the flow's prompt.
pub const MEL_BINS: usize = 80;
/// Mel frames per speech token (CosyVoice2: 50 Hz mel, 25 Hz tokens).
pub const FRAMES_PER_TOKEN: usize = 2;

/// One voice's data.
#[derive(Debug, Clone, PartialEq)]
pub struct VoicePrompt {
    pub name: String,
    /// The prompt's transcript as given (zero-shot voices).
    pub prompt_text: Option<String>,
    /// The transcript's text token ids (normalised as the reference does, not split).
    pub prompt_text_tokens: Vec<i64>,
    /// The prompt's speech tokens (25 Hz): the LLM's prompt, and the flow's unless `flow_tokens`.
    pub speech_tokens: Vec<i64>,
    /// The flow's prompt tokens where a checkpoint stores different ones; `None`: `speech_tokens`.
    pub flow_tokens: Option<Vec<i64>>,
    /// The flow's prompt mel, frame-major: `FRAMES_PER_TOKEN · flow tokens` frames of `MEL_BINS`.
    pub prompt_mel: Vec<f32>,
    /// The 192-d speaker embedding (x-vector).
    pub embedding: Vec<f32>,
}

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
    /// The flow's prompt tokens.
    pub fn flow_tokens(&self) -> &[i64] {
        self.flow_tokens.as_deref().unwrap_or(&self.speech_tokens)
    }

    /// Whether the voice carries a zero-shot prompt (transcript and speech tokens).
    pub fn has_prompt(&self) -> bool {
        !self.prompt_text_tokens.is_empty() && !self.speech_tokens.is_empty()
    }

    /// Checks the shapes (embedding width, mel frames per flow token); `Err` says what is wrong.
    pub fn check(&self) -> Result<(), String> {
        if self.embedding.len() != EMBEDDING_DIM {
            return Err(format!("voice {}: embedding of {} values, not {EMBEDDING_DIM}", self.name, self.embedding.len()));
        }
        let want = self.flow_tokens().len() * FRAMES_PER_TOKEN * MEL_BINS;
        if self.prompt_mel.len() != want {
            return Err(format!(
                "voice {}: prompt mel of {} values for {} prompt tokens (want {want})",
                self.name,
                self.prompt_mel.len(),
                self.flow_tokens().len()
            ));
        }
        if self.embedding.iter().chain(&self.prompt_mel).any(|v| !v.is_finite()) {
            return Err(format!("voice {}: non-finite values", self.name));
        }
        Ok(())
    }

    /// A zero-shot voice from a prompt recording, as `frontend_zero_shot` makes its prompt: speech
    /// tokens of the 16 kHz audio's Whisper log-mel, the embedding of its Kaldi fbank (mean
    /// removed), the mel of the 24 kHz audio; tokens and mel trimmed to two frames per token.
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
        let mel = prompt_mel(&at24.samples);
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

/// The voices a converted model directory carries (`voices.safetensors`, from the checkpoint's
/// `spk2info.pt`), in `model.toml`'s order. Blocking (reads the file).
pub fn checkpoint_voices(dir: &Path, manifest: &Manifest) -> Result<Vec<VoicePrompt>, ModelError> {
    use crate::model::cosyvoice2::{Weights, VOICES_FILE};
    let err = |reason: String| ModelError::Manifest { dir: dir.display().to_string(), reason };
    let w = Weights::load(&dir.join(VOICES_FILE), tch::Device::Cpu)?;
    let floats = |t: tch::Tensor| Vec::<f32>::try_from(t.reshape([-1])).map_err(|e| err(format!("{VOICES_FILE}: {e}")));
    let mut voices = Vec::new();
    for name in &manifest.voices {
        let embedding = floats(w.get(&format!("{name}.embedding"), &[EMBEDDING_DIM as i64]))?;
        let (flow, prompt_mel) = match w.get_ids(&format!("{name}.prompt_token")) {
            Some(tokens) => {
                let mel = floats(w.get(&format!("{name}.prompt_feat"), &[(FRAMES_PER_TOKEN * tokens.len()) as i64, MEL_BINS as i64]))?;
                (tokens, mel)
            }
            None => (Vec::new(), Vec::new()),
        };
        let llm = w.get_ids(&format!("{name}.llm_prompt_token")).unwrap_or_else(|| flow.clone());
        let prompt_text_tokens = w.get_ids(&format!("{name}.prompt_text")).unwrap_or_default();
        let flow_tokens = (llm != flow).then_some(flow);
        voices.push(VoicePrompt { name: name.clone(), prompt_text: None, prompt_text_tokens, speech_tokens: llm, flow_tokens, prompt_mel, embedding });
    }
    w.finish()?;
    Ok(voices)
}
