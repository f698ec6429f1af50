//! Whose speech-token LM a `SpeechLm` is ([`LmFamily`]: CosyVoice2's `Qwen2LM` or CosyVoice3's
//! `CosyVoice3LM`) and the rules in which they differ beyond the layout: the masks a draw before
//! `min_len` is taken again from, and CosyVoice3's silent-token filter.
//!
//! Neighbours: `speech_lm` (the decoder's use of them), `sampler`.

use tch::{Kind, Tensor};

use crate::model::layers::R;

/// Whose speech-token LM: where sos and the task id come from, the output layer, what ends a
/// sequence (`speech_lm`'s module doc says how each is decoded).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LmFamily {
    /// `Qwen2LM`: sos and task id in `llm_embedding`; outputs `speech_tokens + 3` (with bias);
    /// `speech_tokens` ends a sequence, the two ids above it are skipped.
    Cosyvoice2,
    /// `CosyVoice3LM`: sos and task id rows `speech_tokens` and `speech_tokens + 2` of
    /// `speech_embedding`; outputs `speech_tokens + 200` (no bias), each of them from
    /// `speech_tokens` on ends a sequence.
    Cosyvoice3,
}

impl LmFamily {
    /// Output rows above the speech tokens.
    pub fn extra_outputs(self) -> i64 {
        match self {
            LmFamily::Cosyvoice2 => 3,
            LmFamily::Cosyvoice3 => 200,
        }
    }
}

/// `logp` `[N, V]` with column `column` at −∞, normalised again: the reference's `ignore_eos`
/// mask, after which its sampling softmaxes the scores (the nucleus is taken from what is left).
pub fn without_column(logp: &Tensor, column: i64) -> R<Tensor> {
    let index = Tensor::f_from_slice(&[column])?.f_to_device(logp.device())?;
    logp.f_index_fill(1, &index, f64::NEG_INFINITY)?.f_log_softmax(-1, Kind::Float)
}

/// `logp` `[N, V]` without columns `from..V` (every stop id), normalised again: a forced length's
/// draws (benchmarks with random weights).
pub(super) fn without_columns_from(logp: &Tensor, from: i64) -> R<Tensor> {
    let (_, v) = logp.size2()?;
    let index = Tensor::f_arange_start(from, v, (Kind::Int64, logp.device()))?;
    logp.f_index_fill(1, &index, f64::NEG_INFINITY)?.f_log_softmax(-1, Kind::Float)
}

/// `tokens` without each silent token (one of `silent`) after `max_run` of them in a row
/// (`CosyVoice3Model.llm_job`); with no silent tokens, all of them.
pub fn drop_long_silences(tokens: Vec<i64>, silent: &[i64], max_run: usize) -> Vec<i64> {
    if silent.is_empty() {
        return tokens;
    }
    let mut run = 0;
    tokens
        .into_iter()
        .filter(|t| {
            if silent.contains(t) {
                run += 1;
                run <= max_run
            } else {
                run = 0;
                true
            }
        })
        .collect()
}
