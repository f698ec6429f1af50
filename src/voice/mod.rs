//! Voices (issue 15): a prompt recording and its transcript become a CosyVoice2 voice — speech
//! tokens, speaker embedding and prompt mel — stored in Postgres for the whole fleet, and each
//! worker's book of the voices its jobs may name.
//!
//! Stages, a file each: `recording` (any of WAV/FLAC/MP3/OGG in; mono; resampled as torchaudio
//! does; checked as a prompt), `features` (the speech tokenizer's Whisper log-mel, the speaker
//! embedding's Kaldi fbank, the flow's prompt mel; each matches the reference to 1e-4 in
//! `tests/integration/voice.rs`), `onnx` (the checkpoint's speech tokenizer and CAM++ through onnxruntime),
//! `prompt` (the voice as data, from a recording or a checkpoint), `book` (a worker's voices:
//! Postgres's, handed to the model thread, refreshed while it runs).
//!
//! Neighbours: `db::voices` (the table), `model::cosyvoice2` (the voice's tensors),
//! `commands::voice` (`voxbatch voice add|list|show|rm`), `worker::intake` (looks voices up).

pub mod book;
pub mod features;
pub mod onnx;
pub mod prompt;
pub mod recording;

pub use book::{BookEntry, BookError, Lookup, VoiceBook};
pub use prompt::VoicePrompt;
