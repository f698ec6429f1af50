//! CosyVoice2's speech-token language model (issue 13, in progress): text → speech tokens.
//!
//! So far: [`qwen2`], the Qwen2 decoder CosyVoice2's `Qwen2LM` wraps, over a slot KV cache
//! ([`cache`]) so that many sequences decode at once and a finished slot is refilled while the
//! others keep decoding; [`sampler`], the repetition-aware sampling with per-sequence seeded
//! draws; [`speech_lm`], `Qwen2LM.inference` (input layout, min/max length, end-of-speech rules)
//! batched with continuous refill — each sequence gets the same tokens batched or alone (tested
//! on CPU with random weights), at parity with the reference (`tests/cosyvoice2_llm_parity.rs`),
//! bf16 on CUDA. Still to come: CUDA graphs for the decode step, the memory policy for the cache,
//! `bench llm`, and wiring into the worker (issue 14).
//!
//! Neighbours: `weights` loads the tensors; `layers` has the result type.

pub mod cache;
pub mod sampler;
pub mod speech_lm;
pub mod qwen2;
