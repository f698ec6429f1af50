//! A voice as data ([`VoicePrompt`]): what a worker caches, Postgres stores and the model thread
//! turns into tensors — the speaker embedding and, for zero-shot voices, the prompt (speech
//! tokens, mel, transcript tokens); a converted CosyVoice2 checkpoint's come from
//! `model::weights::checkpoint_voices`. The model's side of a voice: `voice` makes prompts from recordings
//! (`VoicePrompt::from_recording`) and keeps a worker's book of them; `db::voices` stores them.


/// The speaker embedding's width (CAM++'s x-vector).
pub const EMBEDDING_DIM: usize = 192;
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
}
