//! `[llm]`: the CosyVoice2 speech-token LM stage (models with `[cosyvoice2.llm]`): how many
//! sequences decode at once and how long each may be, which size its KV cache.

use serde::Deserialize;

use super::check::{fraction, non_negative, positive};
use super::ConfigError;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLlm {
    pub slots: i64,
    pub max_slots: i64,
    pub memory_share: f64,
    pub max_text_tokens: i64,
    pub max_prompt_text_tokens: i64,
    pub max_prompt_speech_tokens: i64,
    pub cuda_graphs: bool,
    pub overlap_token2wav: bool,
    pub prioritise_decode: bool,
    pub pipelined_buckets: bool,
    pub token2wav_max_bucket: i64,
    pub force_lengths: bool,
}

/// The LM stage's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct LlmConfig {
    /// Fixed slot count; `None`: as many as `memory_share` of the budget holds, up to `max_slots`.
    pub slots: Option<usize>,
    pub max_slots: usize,
    /// Share of the memory budget for the LM's KV cache and decode steps.
    pub memory_share: f64,
    pub max_text_tokens: usize,
    pub max_prompt_text_tokens: usize,
    pub max_prompt_speech_tokens: usize,
    pub cuda_graphs: bool,
    /// token2wav's buckets on a CUDA stream of their own, beside the decode steps (else on the
    /// decode's stream: the GPU runs the two stages one after the other).
    pub overlap_token2wav: bool,
    /// With `overlap_token2wav`: the decode's steps on a CUDA stream of high priority, so that the
    /// GPU starts their blocks before the flow's waiting ones (token2wav's buckets wait for the
    /// decode's segments; the decode waits for nothing of token2wav's).
    pub prioritise_decode: bool,
    /// On CUDA: token2wav's buckets pipelined — no waits between a bucket's stages, its waveforms'
    /// copy to the host waited for by the cutter thread — so that the next bucket is queued while
    /// the last one runs. Measured no gain on an H100 (2026-12-07: the launches themselves wait for
    /// the GPU's queue), so off by default.
    pub pipelined_buckets: bool,
    /// Segments token2wav runs at once at most (the memory model may allow fewer).
    pub token2wav_max_bucket: usize,
    /// Benchmarks with random weights only: every segment decodes exactly its characters ÷
    /// `[frontend]` chars_per_second × 25 speech tokens (end-of-speech refused until then).
    pub force_lengths: bool,
}

impl RawLlm {
    pub fn validate(self) -> Result<LlmConfig, ConfigError> {
        Ok(LlmConfig {
            slots: Some(non_negative("llm.slots", self.slots)? as usize).filter(|s| *s > 0),
            max_slots: positive("llm.max_slots", self.max_slots)?,
            memory_share: fraction("llm.memory_share", self.memory_share)?,
            max_text_tokens: positive("llm.max_text_tokens", self.max_text_tokens)?,
            max_prompt_text_tokens: non_negative("llm.max_prompt_text_tokens", self.max_prompt_text_tokens)? as usize,
            max_prompt_speech_tokens: non_negative("llm.max_prompt_speech_tokens", self.max_prompt_speech_tokens)? as usize,
            cuda_graphs: self.cuda_graphs,
            overlap_token2wav: self.overlap_token2wav,
            prioritise_decode: self.prioritise_decode,
            pipelined_buckets: self.pipelined_buckets,
            token2wav_max_bucket: positive("llm.token2wav_max_bucket", self.token2wav_max_bucket)?,
            force_lengths: self.force_lengths,
        })
    }
}
