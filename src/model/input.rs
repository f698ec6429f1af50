//! What a valid job gives a model: its speech tokens (checked against the vocabulary), text for a
//! text model's frontend, or text tokenized by the manifest's tokenizer — or the reason the model
//! cannot take it. The job format (`job`) knows nothing of models; this is where the two meet.
//!
//! Neighbours: `worker::intake` asks it for each job it receives; `manifest` describes the model.

use super::Manifest;
use crate::job::{Job, RejectionKind};

/// What a job gives `manifest`'s model.
#[derive(Debug, Clone, PartialEq)]
pub enum ModelInput {
    /// Token ids: speech tokens, or text tokenized by the manifest's tokenizer.
    Tokens(Vec<i64>),
    /// Text for the CosyVoice2 frontend (kind `cosyvoice2`): normalised, segmented and tokenized
    /// off the async runtime (`model::TextInput::prepare`).
    Text,
}

/// What a job gives `manifest`'s model: its speech tokens (checked against the model's
/// vocabulary) for a speech-token model, text for the frontend of a `cosyvoice2` model (unless
/// the job carries speech tokens), its tokenized text otherwise.
pub fn model_input(job: &Job, manifest: &Manifest) -> Result<ModelInput, RejectionKind> {
    if job.speed.is_some_and(|s| s != 1.0) && !manifest.kind.has_prompt_voices() {
        let reason = format!("a {} model speaks at one speed; only CosyVoice models take `speed`", manifest.kind.as_str());
        return Err(RejectionKind::InvalidField { field: "speed", reason });
    }
    if manifest.kind.takes_text() && job.speech_tokens.is_none() {
        return if crate::job::is_blank(&job.text) { Err(RejectionKind::EmptyText) } else { Ok(ModelInput::Text) };
    }
    model_tokens(job, manifest).map(ModelInput::Tokens)
}

fn model_tokens(job: &Job, manifest: &Manifest) -> Result<Vec<i64>, RejectionKind> {
    if !manifest.takes_speech_tokens() {
        if crate::job::is_blank(&job.text) {
            return Err(RejectionKind::EmptyText);
        }
        return Ok(manifest.tokenize(&job.text));
    }
    let tokens = job.speech_tokens.as_ref().ok_or(RejectionKind::MissingSpeechTokens)?;
    let vocab = manifest.vocab_size();
    if let Some((i, t)) = tokens.iter().enumerate().find(|(_, t)| **t >= vocab) {
        return Err(RejectionKind::InvalidSpeechTokens(format!("item {i} ({t}) is not below this model's vocabulary size {vocab}")));
    }
    Ok(tokens.clone())
}

