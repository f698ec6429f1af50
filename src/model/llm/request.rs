//! What the speech-token LM is asked and answers, per sequence: a request (text, a voice's
//! prompt, its seed), the length limits as multiples of the text, the decoded tokens, and why a
//! sequence could not be decoded.
//!
//! Neighbours: `speech_lm` (decodes requests), `prompt` (builds them from a job's segments).

use crate::config::LlmConfig;
use crate::model::LlmDims;

/// Positions one slot must hold for the configured limits. `system_tokens`: the family's system
/// prompt (CosyVoice3's, `prompt::SystemPrompt`; 0 for CosyVoice2), which goes before a
/// cross-lingual segment's text — counting in its `max_len` — or before a prompt text.
pub fn max_positions(c: &LlmConfig, dims: &LlmDims, system_tokens: usize) -> i64 {
    let text = c.max_text_tokens + system_tokens;
    let input = 2 + c.max_prompt_text_tokens + text + c.max_prompt_speech_tokens;
    input as i64 + (text as f64 * dims.max_token_text_ratio).ceil() as i64
}

/// Draws of an end-of-speech token before `min_len` tolerated per step.
pub(super) const MAX_TRIALS: usize = 100;

/// One sequence to decode.
#[derive(Debug, Clone, PartialEq)]
pub struct LmRequest {
    pub text: Vec<i64>,
    pub prompt_text: Vec<i64>,
    pub prompt_speech: Vec<i64>,
    /// Seed of the sequence's draws (e.g. from job id and segment index).
    pub seed: u64,
    /// Benchmarks only: exactly this many steps, end-of-speech refused until then (random
    /// weights end at random).
    pub forced_len: Option<usize>,
}

/// `min_len` / `max_len` as multiples of the text's token count.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LengthRatios {
    pub min: f64,
    pub max: f64,
}

impl Default for LengthRatios {
    fn default() -> Self {
        LengthRatios { min: 2.0, max: 20.0 }
    }
}

/// A decoded sequence.
#[derive(Debug, Clone, PartialEq)]
pub struct LmOutput {
    pub tokens: Vec<i64>,
    /// True when it stopped at `max_len` rather than at an end-of-speech token.
    pub hit_max_len: bool,
}

/// Why one sequence could not be decoded (the others are unaffected).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LmError {
    #[error("the text has no tokens")]
    EmptyText,
    #[error("{needed} positions do not fit the cache's {limit} per sequence")]
    TooLong { needed: i64, limit: i64 },
    #[error("sampling drew only end-of-speech {MAX_TRIALS} times before min_len")]
    OnlyEndOfSpeech,
    #[error("CosyVoice3's LM input must hold <|endofprompt|> (in the prompt text or the text), as the reference asserts")]
    NoEndOfPrompt,
}

/// The reference's `max_len`: 20× (`ratios.max`) the text's tokens, or the forced length.
pub(super) fn max_steps(r: &LmRequest, ratios: LengthRatios) -> usize {
    r.forced_len.unwrap_or((r.text.len() as f64 * ratios.max) as usize)
}
