//! CosyVoice2's speech-token language model (issue 13, in progress): text → speech tokens.
//!
//! So far: [`qwen2`], the Qwen2 decoder CosyVoice2's `Qwen2LM` wraps, over a slot KV cache
//! ([`cache`]) so that many sequences decode at once and a finished slot is refilled while the
//! others keep decoding (each sequence computes what it would alone; tested). Still to come: the
//! CosyVoice2 wrapper (`llm_embedding`, `speech_embedding`, `llm_decoder`, the input layout), the
//! repetition-aware sampler, the converter for `llm.pt`, parity against the reference, CUDA
//! graphs and the bench.
//!
//! Neighbours: `weights` loads the tensors; `layers` has the result type.

pub mod cache;
pub mod sampler;
pub mod qwen2;
