//! Voices from recordings (issue 15): a prompt recording and its transcript become a CosyVoice2
//! voice — speech tokens, speaker embedding and prompt mel — stored for the whole fleet.
//!
//! Stages, a file each: `recording` (any of WAV/FLAC/MP3/OGG in; mono; resampled as torchaudio
//! does; checked as a prompt), `features` (the speech tokenizer's Whisper log-mel, the speaker
//! embedding's Kaldi fbank, the flow's prompt mel; each matches the reference to 1e-4 in
//! `tests/voice.rs`). Next (issue 15): the ONNX models (speech tokenizer v2, CAM++), the `voices`
//! table and `voxbatch voice add|list|show|rm`.
//!
//! Neighbours: `model::cosyvoice2` (the `Voice` a recording becomes); `commands` (`voice add`).

pub mod features;
pub mod recording;
