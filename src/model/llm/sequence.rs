//! One sequence in the batched decoder ([`Sequence`]: its slot, step, length limits, output,
//! next input and seeded stream) and what each step's draw does to it ([`SpeechLm::advance`]: the
//! reference's choice, an end-of-speech drawn again before `min_len` — CosyVoice3: once, without
//! it, or with a forced length without any stop id — the family's stop ids, skipped ids fed
//! again, `max_len`), and the output a finished sequence keeps ([`SpeechLm::kept`]).
//!
//! Neighbours: `speech_lm` (admits sequences and steps them), `sampler` (the draws), `family`
//! (the masks and the silent-token filter), `request` (what a sequence returns).

use tch::Tensor;

use super::family::{drop_long_silences, without_column, without_columns_from, LmFamily};
use super::request::{LmError, LmOutput, MAX_TRIALS};
use super::sampler::{choose, ras_sample, SamplingParams, SequenceRng};
use super::speech_lm::SpeechLm;
use crate::model::layers::R;

/// What a sequence is fed next.
pub(super) enum Input {
    Token(i64),
    /// The last prompt position's embedding, when the first draw is skipped.
    Embedding(Tensor),
}

pub(super) struct Sequence {
    pub(super) index: usize,
    pub(super) slot: usize,
    pub(super) step: usize,
    pub(super) min_len: usize,
    pub(super) max_len: usize,
    pub(super) out: Vec<i64>,
    pub(super) next_input: Input,
    pub(super) rng: SequenceRng,
    /// A benchmark's forced length: CosyVoice3 refuses every stop id before it, not only 6561.
    pub(super) forced: bool,
}

/// What one sampled token did to its sequence.
pub(super) enum Next {
    Continue,
    Done(Result<LmOutput, LmError>),
}

impl SpeechLm {
    /// Applies each sequence's draw (`drawn[i]`: its nucleus and full-distribution picks from row
    /// `logp_rows[i]` of `logp`): the reference's choice, end-of-speech drawn again before `min_len`.
    pub(super) fn advance(&self, seqs: &mut [&mut Sequence], logp: &Tensor, logp_rows: &[i64], drawn: &[(i64, i64)], params: &SamplingParams) -> R<Vec<Next>> {
        let eos = self.speech_tokens;
        let mut picks: Vec<i64> = seqs.iter().zip(drawn).map(|(s, &(nucleus, full))| choose(nucleus, full, &s.out, params)).collect();
        // Before min_len an end-of-speech is drawn again, row by row, as the reference does
        // (CosyVoice3: once, from the distribution without it, as its mask leaves it; with a forced
        // length, without any stop id).
        let early: Vec<bool> = seqs.iter().map(|s| s.step < s.min_len).collect();
        let all_stops: Vec<bool> = seqs.iter().map(|s| self.family == LmFamily::Cosyvoice3 && s.forced).collect();
        let refused = |i: usize, pick: i64| early[i] && (pick == eos || (all_stops[i] && pick > eos));
        let (mut without_sos, mut without_stops): (Option<Tensor>, Option<Tensor>) = (None, None);
        for _ in 0..MAX_TRIALS {
            let again: Vec<usize> = (0..seqs.len()).filter(|&i| refused(i, picks[i])).collect();
            if again.is_empty() {
                break;
            }
            let (plain, stops): (Vec<usize>, Vec<usize>) = again.iter().partition(|&&i| !all_stops[i]);
            for (rows, forced) in [(plain, false), (stops, true)] {
                if rows.is_empty() {
                    continue;
                }
                let table = match (self.family, forced) {
                    (LmFamily::Cosyvoice2, _) => logp,
                    (LmFamily::Cosyvoice3, false) => &*without_sos.get_or_insert(without_column(logp, eos)?),
                    (LmFamily::Cosyvoice3, true) => &*without_stops.get_or_insert(without_columns_from(logp, eos)?),
                };
                for (i, p) in rows.iter().zip(self.sample_rows(seqs, table, logp_rows, params, &rows)?) {
                    picks[*i] = p;
                }
            }
        }
        let ends = |pick: i64| match self.family {
            LmFamily::Cosyvoice2 => pick == eos,
            LmFamily::Cosyvoice3 => pick >= eos,
        };
        let mut nexts = Vec::with_capacity(seqs.len());
        for (i, seq) in seqs.iter_mut().enumerate() {
            let pick = picks[i];
            let refused = refused(i, pick);
            seq.step += 1;
            let next = if refused {
                Next::Done(Err(LmError::OnlyEndOfSpeech))
            } else if ends(pick) {
                Next::Done(Ok(LmOutput { tokens: self.kept(std::mem::take(&mut seq.out)), hit_max_len: false }))
            } else {
                // A skipped id (above end-of-speech) leaves the input as it was: fed again.
                if pick < eos {
                    seq.out.push(pick);
                    seq.next_input = Input::Token(pick);
                }
                if seq.step >= seq.max_len {
                    Next::Done(Ok(LmOutput { tokens: self.kept(std::mem::take(&mut seq.out)), hit_max_len: true }))
                } else {
                    Next::Continue
                }
            };
            nexts.push(next);
        }
        Ok(nexts)
    }

    /// A finished sequence's output: CosyVoice3 drops each silent token after `max_silent_tokens`
    /// of them in a row (`CosyVoice3Model.llm_job`); CosyVoice2 keeps every token.
    pub fn kept(&self, tokens: Vec<i64>) -> Vec<i64> {
        drop_long_silences(tokens, &self.silent_tokens, self.max_silent_tokens)
    }

    /// One draw for each of `rows` (indices into `seqs`; sequence `r` reads row `logp_rows[r]`).
    fn sample_rows(&self, seqs: &mut [&mut Sequence], logp: &Tensor, logp_rows: &[i64], params: &SamplingParams, rows: &[usize]) -> R<Vec<i64>> {
        let index = Tensor::f_from_slice(&rows.iter().map(|&r| logp_rows[r]).collect::<Vec<_>>())?.f_to_device(logp.device())?;
        let uniforms: Vec<(f64, f64)> = rows.iter().map(|&r| seqs[r].rng.next_pair()).collect();
        let history: Vec<&[i64]> = rows.iter().map(|&r| seqs[r].out.as_slice()).collect();
        ras_sample(&logp.f_index_select(0, &index)?, &history, &uniforms, params)
    }
}
