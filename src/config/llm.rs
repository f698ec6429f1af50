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
    pub decode_sms: i64,
    pub closing_on_all_sms: bool,
    pub pipelined_buckets: bool,
    pub token2wav_max_bucket: i64,
    pub token2wav_least_bucket: i64,
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
    /// On CUDA, above 0: token2wav's buckets run on a CUDA green context that leaves at least this
    /// many SMs to the decode (whole groups of 8 to token2wav: `cuda_stream::green_sms`), so that
    /// the decode's steps run beside a bucket instead of waiting for its blocks; token2wav is then
    /// on a stream of its own whatever `overlap_token2wav` says. 0: token2wav may use every SM.
    pub decode_sms: u32,
    /// With `decode_sms`: a batch's last buckets, once the decode is done, run on every SM (a
    /// stream of its own); false: on token2wav's share to the end.
    pub closing_on_all_sms: bool,
    /// On CUDA: token2wav's buckets pipelined — no waits between a bucket's stages, its waveforms'
    /// copy to the host waited for by the cutter thread — so that the next bucket is queued while
    /// the last one runs. Measured no gain on an H100 (2026-12-07: the launches themselves wait for
    /// the GPU's queue), so off by default.
    pub pipelined_buckets: bool,
    /// Segments token2wav runs at once at most (the memory model may allow fewer).
    pub token2wav_max_bucket: usize,
    /// While the LLM decodes, a run of at least this many like-length segments (≥ 90 % full) goes
    /// through token2wav without waiting for a full bucket; 0: only runs that fill one.
    pub token2wav_least_bucket: usize,
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
            decode_sms: u32::try_from(non_negative("llm.decode_sms", self.decode_sms)?).map_err(|_| ConfigError::Invalid { key: "llm.decode_sms", reason: format!("must be at most {}, got {}", u32::MAX, self.decode_sms) })?,
            closing_on_all_sms: self.closing_on_all_sms,
            pipelined_buckets: self.pipelined_buckets,
            token2wav_max_bucket: positive("llm.token2wav_max_bucket", self.token2wav_max_bucket)?,
            token2wav_least_bucket: non_negative("llm.token2wav_least_bucket", self.token2wav_least_bucket)? as usize,
            force_lengths: self.force_lengths,
        })
    }
}
