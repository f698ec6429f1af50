//! The speech-token language model of both CosyVoice families (CosyVoice2's `Qwen2LM`, CosyVoice3's
//! `CosyVoice3LM`: one decoder, two layouts): text → speech tokens, many sequences at once.
//!
//! - [`qwen2`]: the Qwen2 decoder CosyVoice2's `Qwen2LM` wraps, over a slot KV cache ([`cache`]):
//!   unpadded multi-sequence prefill, and a decode step that advances every active slot at its own
//!   position (graph-capturable: device work only).
//! - [`sampler`]: the repetition-aware sampling, vectorised, with per-sequence seeded draws.
//! - [`batch`]: the [`batch::BatchDecoder`] — the cache sized once, the step's static buffers,
//!   the step captured as CUDA graphs per (rows, span) bucket and replayed (eager as the fallback).
//! - [`speech_lm`]: `Qwen2LM.inference` (input layout, min/max length, end-of-speech rules) with
//!   continuous refill; each sequence gets the same tokens batched or alone.
//! - [`sequence`]: one sequence's state and what each draw does to it (the end-of-speech rules).
//! - [`request`]: what the LM is asked and answers per sequence (`LmRequest`, `LmOutput`,
//!   `LmError`, the length ratios).
//! - [`family`]: whose LM (CosyVoice2's `Qwen2LM` or CosyVoice3's `CosyVoice3LM`) and the rules
//!   in which they differ: the masks before `min_len`, CosyVoice3's silent-token filter.
//! - [`prompt`]: a job's segments as LLM requests per mode (zero-shot, cross-lingual, instruct),
//!   CosyVoice3's behind its system prompt, each segment seeded by job id and index.
//!
//! At parity with the references (`tests/integration/cosyvoice2_llm_parity.rs`,
//! `cosyvoice3_llm_parity.rs`); bf16 weights on CUDA, fp32 on the CPU, log-probabilities and
//! sampling fp32. `sizing::llm` gives the slot count from the memory budget; `bench::llm` measures
//! it; `model::tts` runs it for text jobs.
//!
//! Neighbours: `weights` loads the tensors; `layers` has the result type; `model::cuda_graph`.

pub mod batch;
pub mod cache;
pub mod family;
pub mod prompt;
pub mod qwen2;
pub mod request;
pub mod sampler;
pub mod sequence;
pub mod speech_lm;
