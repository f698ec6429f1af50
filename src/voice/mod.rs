//! Voices from recordings (issue 15): a prompt recording and its transcript become a CosyVoice2
//! voice — speech tokens, speaker embedding and prompt mel — stored for the whole fleet.
//!
//! Stages, a file each: `recording` (any of WAV/FLAC/MP3/OGG in; mono; resampled; checked as a
//! prompt). Next: the features (log-mel, fbank, prompt mel), the ONNX models and the `voices`
//! table.
//!
//! Neighbours: `model::cosyvoice2` (the `Voice` a recording becomes); `commands` (`voice add`).

pub mod features;
pub mod recording;
