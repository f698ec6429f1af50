//! CosyVoice2's `Qwen2LM.inference` (the Hugging Face path of `cosyvoice/llm/llm.py`), batched with
//! continuous refill: text tokens (and a voice's prompt text and prompt speech tokens) → speech
//! tokens, many sequences at once.
//!
//! Input layout as the reference: `[sos, embed(prompt_text ++ text), task_id,
//! speech_embed(prompt_speech)]`; each step feeds `speech_embed` of the sampled token. As the
//! reference: `min_len`/`max_len` are 2× / 20× the text's token count; before `min_len` a sampled
//! end-of-speech (6561) is drawn again (up to 100 times); 6561 ends the sequence; 6562 and 6563 are
//! skipped (not emitted, the same input fed again); `max_len` steps end it. One known difference:
//! when the very first draw is skipped the reference feeds its whole prompt again; here its last
//! position is fed again (a draw of 2 in 6564 at one step of a sequence, with real weights).
//!
//! Decoding: every slot of the [`SlotCache`] holds one sequence; one decode step advances all
//! active slots; a finished slot is refilled from the pending requests at once (prefilled alone,
//! unpadded), so the batch never drains to its slowest member. Each sequence samples from its own
//! seeded stream, so it gets the same tokens batched or alone.
//!
//! Neighbours: `qwen2` (the decoder), `sampler`, `cache`; `weights` loads `llm.safetensors`.

use std::collections::VecDeque;

use tch::{Kind, TchError, Tensor};

use super::super::layers::{Linear, R};
use super::super::weights::Weights;
use super::qwen2::{Qwen2, Qwen2Dims};
use super::sampler::{ras_sample, SamplingParams, SequenceRng};

/// The LM's weights in a converted model directory.
pub const LLM_FILE: &str = "llm.safetensors";

/// Draws of an end-of-speech token before `min_len` tolerated per step.
const MAX_TRIALS: usize = 100;

/// One sequence to decode.
#[derive(Debug, Clone, PartialEq)]
pub struct LmRequest {
    pub text: Vec<i64>,
    pub prompt_text: Vec<i64>,
    pub prompt_speech: Vec<i64>,
    /// Seed of the sequence's draws (e.g. from job id and segment index).
    pub seed: u64,
}

/// `min_len` / `max_len` as multiples of the text's token count.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LengthRatios {
    pub min: f64,
    pub max: f64,
}

impl Default for LengthRatios {
    fn default() -> Self {
        LengthRatios { min: 2.0, max: 20.0 }
    }
}

/// A decoded sequence.
#[derive(Debug, Clone, PartialEq)]
pub struct LmOutput {
    pub tokens: Vec<i64>,
    /// True when it stopped at `max_len` rather than at an end-of-speech token.
    pub hit_max_len: bool,
}

/// Why one sequence could not be decoded (the others are unaffected).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LmError {
    #[error("the text has no tokens")]
    EmptyText,
    #[error("{needed} positions do not fit the cache's {limit} per sequence")]
    TooLong { needed: i64, limit: i64 },
    #[error("sampling drew only end-of-speech {MAX_TRIALS} times before min_len")]
    OnlyEndOfSpeech,
}

/// CosyVoice2's speech-token LM: Qwen2 plus its embeddings and output layer.
pub struct SpeechLm {
    qwen: Qwen2,
    llm_embedding: Tensor,
    speech_embedding: Tensor,
    decoder: Linear,
    /// 6561: the end-of-speech id; ids above it are skipped.
    speech_tokens: i64,
}

struct Sequence {
    index: usize,
    slot: usize,
    step: usize,
    min_len: usize,
    max_len: usize,
    out: Vec<i64>,
    next_input: Tensor,
    rng: SequenceRng,
}

/// What one sampled token did to its sequence.
enum Next {
    Continue,
    Done(Result<LmOutput, LmError>),
}

impl SpeechLm {
    /// The LM of `llm.safetensors` (`llm.model.model.*` Qwen2, `llm_embedding`, `speech_embedding`,
    /// `llm_decoder`).
    pub fn new(w: &Weights, qwen: Qwen2Dims, speech_tokens: i64) -> R<SpeechLm> {
        let h = qwen.hidden;
        Ok(SpeechLm {
            qwen: Qwen2::new(w, "llm.model.model", qwen)?,
            llm_embedding: w.get("llm_embedding.weight", &[2, h]),
            speech_embedding: w.get("speech_embedding.weight", &[speech_tokens + 3, h]),
            decoder: Linear::new(w, "llm_decoder", h, speech_tokens + 3, true),
            speech_tokens,
        })
    }

    /// Loads `dir/llm.safetensors` as `[cosyvoice2.llm]` of the manifest describes it (checked by
    /// name and shape), with weights and KV cache in bf16 on CUDA (never fp16: upstream reports
    /// NaNs) and fp32 on the CPU; log-probabilities and sampling are fp32 either way. Also returns
    /// the sampling settings and length ratios it names.
    pub fn load(dir: &std::path::Path, dims: &crate::model::LlmDims, device: tch::Device) -> Result<(SpeechLm, SamplingParams, LengthRatios), crate::model::ModelError> {
        let kind = if device.is_cuda() { Kind::BFloat16 } else { Kind::Float };
        SpeechLm::load_as(dir, dims, device, kind)
    }

    /// [`SpeechLm::load`] with the weights in `kind`.
    pub fn load_as(
        dir: &std::path::Path,
        dims: &crate::model::LlmDims,
        device: tch::Device,
        kind: Kind,
    ) -> Result<(SpeechLm, SamplingParams, LengthRatios), crate::model::ModelError> {
        let w = Weights::load_as(&dir.join(LLM_FILE), device, kind)?;
        let lm = SpeechLm::new(&w, Qwen2Dims::from(dims), dims.speech_tokens).map_err(crate::model::ModelError::Inference)?;
        w.finish()?;
        let sampling = SamplingParams { top_p: dims.top_p, top_k: dims.top_k, win_size: dims.win_size, tau_r: dims.tau_r };
        Ok((lm, sampling, LengthRatios { min: dims.min_token_text_ratio, max: dims.max_token_text_ratio }))
    }

    /// The reference's `lm_input` `[T, hidden]` for one request.
    pub fn input(&self, r: &LmRequest) -> R<Tensor> {
        let text: Vec<i64> = r.prompt_text.iter().chain(&r.text).copied().collect();
        let mut parts = vec![self.llm_embedding.f_narrow(0, 0, 1)?, self.qwen.embed(&text)?, self.llm_embedding.f_narrow(0, 1, 1)?];
        if !r.prompt_speech.is_empty() {
            let ids = Tensor::f_from_slice(&r.prompt_speech)?.f_to_device(self.speech_embedding.device())?;
            parts.push(self.speech_embedding.f_index_select(0, &ids)?);
        }
        Tensor::f_cat(&parts, 0)
    }

    /// Positions one request needs in its slot: its input and `max_len` steps.
    pub fn positions_needed(&self, r: &LmRequest, ratios: LengthRatios) -> i64 {
        let input = 2 + (r.prompt_text.len() + r.text.len() + r.prompt_speech.len()) as i64;
        input + (r.text.len() as f64 * ratios.max) as i64
    }

    /// Decodes every request with `slots` sequences at a time in a cache of `max_positions` per
    /// slot. One result per request, in order; a libtorch failure fails the whole call.
    pub fn generate(
        &self,
        requests: &[LmRequest],
        slots: usize,
        max_positions: i64,
        params: &SamplingParams,
        ratios: LengthRatios,
    ) -> Result<Vec<Result<LmOutput, LmError>>, TchError> {
        let mut results: Vec<Option<Result<LmOutput, LmError>>> = requests.iter().map(|_| None).collect();
        let mut pending: VecDeque<usize> = VecDeque::new();
        for (i, r) in requests.iter().enumerate() {
            let needed = self.positions_needed(r, ratios);
            if r.text.is_empty() {
                results[i] = Some(Err(LmError::EmptyText));
            } else if needed > max_positions {
                results[i] = Some(Err(LmError::TooLong { needed, limit: max_positions }));
            } else {
                pending.push_back(i);
            }
        }
        let mut cache = self.qwen.cache(slots.max(1), max_positions, self.speech_embedding.kind())?;
        let mut free: Vec<usize> = (0..cache.slots()).rev().collect();
        let mut active: Vec<Sequence> = Vec::new();
        loop {
            // Refill every free slot at once.
            while let (Some(&slot), Some(&index)) = (free.last(), pending.front()) {
                free.pop();
                pending.pop_front();
                let r = &requests[index];
                let input = self.input(r)?;
                let hidden = self.qwen.prefill(&mut cache, slot, &input)?;
                let (t, _) = hidden.size2()?;
                let mut seq = Sequence {
                    index,
                    slot,
                    step: 0,
                    min_len: (r.text.len() as f64 * ratios.min) as usize,
                    max_len: (r.text.len() as f64 * ratios.max) as usize,
                    out: Vec::new(),
                    // Fed again if the first draw is skipped (see the module doc).
                    next_input: input.f_get(t - 1)?,
                    rng: SequenceRng::new(r.seed),
                };
                let logp = self.log_probs(&hidden.f_narrow(0, t - 1, 1)?)?;
                match self.advance(&mut [&mut seq], &logp, params)?.pop() {
                    Some(Next::Done(result)) => {
                        results[index] = Some(result);
                        cache.free(slot);
                        free.push(slot);
                    }
                    _ => active.push(seq),
                }
            }
            if active.is_empty() {
                break;
            }
            // One step for every active slot.
            let slot_ids: Vec<usize> = active.iter().map(|s| s.slot).collect();
            let inputs = Tensor::f_stack(&active.iter().map(|s| s.next_input.shallow_clone()).collect::<Vec<_>>(), 0)?;
            let hidden = self.qwen.decode(&mut cache, &slot_ids, &inputs)?;
            let logp = self.log_probs(&hidden)?;
            let mut refs: Vec<&mut Sequence> = active.iter_mut().collect();
            let nexts = self.advance(&mut refs, &logp, params)?;
            let mut still = Vec::with_capacity(active.len());
            for (seq, next) in active.drain(..).zip(nexts) {
                match next {
                    Next::Continue => still.push(seq),
                    Next::Done(result) => {
                        results[seq.index] = Some(result);
                        cache.free(seq.slot);
                        free.push(seq.slot);
                    }
                }
            }
            active = still;
        }
        Ok(results.into_iter().map(|r| r.unwrap_or(Err(LmError::EmptyText))).collect())
    }

    /// Teacher forcing (parity): every item prefilled into its own slot, then all decoded together,
    /// item `i` fed `fed[i]` one token a step (items with fewer tokens drop out). Per item: the
    /// prefill's hidden states `[T, hidden]` and the log-probabilities `[1 + fed, V]` of each step.
    pub fn teacher_forced(&self, items: &[(&LmRequest, &[i64])], max_positions: i64) -> R<Vec<(Tensor, Tensor)>> {
        let mut cache = self.qwen.cache(items.len(), max_positions, self.speech_embedding.kind())?;
        let mut hidden = Vec::new();
        let mut logps: Vec<Vec<Tensor>> = Vec::new();
        for (slot, (r, _)) in items.iter().enumerate() {
            let h = self.qwen.prefill(&mut cache, slot, &self.input(r)?)?;
            let (t, _) = h.size2()?;
            logps.push(vec![self.log_probs(&h.f_narrow(0, t - 1, 1)?)?.f_squeeze_dim(0)?]);
            hidden.push(h);
        }
        let longest = items.iter().map(|(_, fed)| fed.len()).max().unwrap_or(0);
        for step in 0..longest {
            let rows: Vec<usize> = (0..items.len()).filter(|&i| step < items[i].1.len()).collect();
            let ids = Tensor::f_from_slice(&rows.iter().map(|&i| items[i].1[step]).collect::<Vec<_>>())?.f_to_device(self.speech_embedding.device())?;
            let h = self.qwen.decode(&mut cache, &rows, &self.speech_embedding.f_index_select(0, &ids)?)?;
            let lp = self.log_probs(&h)?;
            for (row, &i) in rows.iter().enumerate() {
                logps[i].push(lp.f_get(row as i64)?);
            }
        }
        hidden.into_iter().zip(logps).map(|(h, lp)| Ok((h, Tensor::f_stack(&lp, 0)?))).collect()
    }

    /// `log_softmax(llm_decoder(hidden))` in fp32: `[N, speech_tokens + 3]`.
    fn log_probs(&self, hidden: &Tensor) -> R<Tensor> {
        self.decoder.forward(hidden)?.f_to_kind(Kind::Float)?.f_log_softmax(-1, Kind::Float)
    }

    /// Samples one token for each sequence from its row of `logp` and applies it.
    fn advance(&self, seqs: &mut [&mut Sequence], logp: &Tensor, params: &SamplingParams) -> R<Vec<Next>> {
        let eos = self.speech_tokens;
        let mut picks = self.sample_rows(seqs, logp, params, &(0..seqs.len()).collect::<Vec<_>>())?;
        // Before min_len an end-of-speech is drawn again, row by row, as the reference does.
        let mut refused = vec![false; seqs.len()];
        for _ in 0..MAX_TRIALS {
            let again: Vec<usize> = (0..seqs.len()).filter(|&i| picks[i] == eos && seqs[i].step < seqs[i].min_len).collect();
            if again.is_empty() {
                break;
            }
            for (i, p) in again.iter().zip(self.sample_rows(seqs, logp, params, &again)?) {
                picks[*i] = p;
            }
        }
        for (i, seq) in seqs.iter().enumerate() {
            refused[i] = picks[i] == eos && seq.step < seq.min_len;
        }
        let mut nexts = Vec::with_capacity(seqs.len());
        for (i, seq) in seqs.iter_mut().enumerate() {
            let pick = picks[i];
            seq.step += 1;
            let next = if refused[i] {
                Next::Done(Err(LmError::OnlyEndOfSpeech))
            } else if pick == eos {
                Next::Done(Ok(LmOutput { tokens: std::mem::take(&mut seq.out), hit_max_len: false }))
            } else {
                // A skipped id (above end-of-speech) leaves the input as it was: fed again.
                if pick < eos {
                    seq.out.push(pick);
                    seq.next_input = self.speech_embedding.f_get(pick)?;
                }
                if seq.step >= seq.max_len {
                    Next::Done(Ok(LmOutput { tokens: std::mem::take(&mut seq.out), hit_max_len: true }))
                } else {
                    Next::Continue
                }
            };
            nexts.push(next);
        }
        Ok(nexts)
    }

    /// One draw for each of `rows` (indices into `seqs` and `logp`).
    fn sample_rows(&self, seqs: &mut [&mut Sequence], logp: &Tensor, params: &SamplingParams, rows: &[usize]) -> R<Vec<i64>> {
        let index = Tensor::f_from_slice(&rows.iter().map(|&r| r as i64).collect::<Vec<_>>())?.f_to_device(logp.device())?;
        let uniforms: Vec<(f64, f64)> = rows.iter().map(|&r| seqs[r].rng.next_pair()).collect();
        let history: Vec<&[i64]> = rows.iter().map(|&r| seqs[r].out.as_slice()).collect();
        ras_sample(&logp.f_index_select(0, &index)?, &history, &uniforms, params)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPEECH: i64 = 20;

    fn dims() -> Qwen2Dims {
        Qwen2Dims { layers: 2, hidden: 32, heads: 4, kv_heads: 2, head_dim: 8, intermediate: 48, vocab: 40, rope_theta: 1e6, eps: 1e-6 }
    }

    /// A random LM (fixed seed) with its weights under the names `llm.pt` converts to.
    fn random_lm(dir: &std::path::Path) -> SpeechLm {
        let d = dims();
        tch::manual_seed(5);
        let r = |shape: &[i64]| Tensor::randn(shape, (Kind::Float, tch::Device::Cpu)) * 0.3;
        let h = d.hidden;
        let mut t = super::super::qwen2::random_tensors("llm.model.model", &d, &r);
        t.extend([
            ("llm_embedding.weight".to_string(), r(&[2, h])),
            ("speech_embedding.weight".to_string(), r(&[SPEECH + 3, h])),
            ("llm_decoder.weight".to_string(), r(&[SPEECH + 3, h])),
            ("llm_decoder.bias".to_string(), r(&[SPEECH + 3])),
        ]);
        let path = dir.join("llm.safetensors");
        Tensor::write_safetensors(&t, &path).unwrap();
        let w = Weights::load(&path, tch::Device::Cpu).unwrap();
        let lm = SpeechLm::new(&w, d, SPEECH).unwrap();
        w.finish().unwrap();
        lm
    }

    fn requests() -> Vec<LmRequest> {
        let req = |text: Vec<i64>, prompt_text: Vec<i64>, prompt_speech: Vec<i64>, seed| LmRequest { text, prompt_text, prompt_speech, seed };
        vec![
            req(vec![3, 4, 5], vec![], vec![], 1),
            req(vec![7, 8, 9, 10, 11, 12], vec![1, 2], vec![4, 4, 9, 0, 13], 2),
            req(vec![20, 21], vec![5], vec![1, 2, 3], 3),
            req(vec![30, 31, 32, 33], vec![], vec![7, 7], 4),
            req(vec![], vec![], vec![], 5),
        ]
    }

    #[test]
    fn every_sequence_decodes_the_same_tokens_batched_with_refill_as_alone() {
        let dir = tempfile::tempdir().unwrap();
        let lm = random_lm(dir.path());
        let reqs = requests();
        let p = SamplingParams::default();
        let ratios = LengthRatios::default();
        let batched = tch::no_grad(|| lm.generate(&reqs, 2, 256, &p, ratios)).unwrap();
        for (i, r) in reqs.iter().enumerate() {
            let alone = tch::no_grad(|| lm.generate(std::slice::from_ref(r), 1, 256, &p, ratios)).unwrap().remove(0);
            match (&batched[i], &alone) {
                (Ok(a), Ok(b)) => {
                    assert_eq!(a, b, "request {i}");
                    // (Fewer than min_len tokens is possible: skipped ids count as steps.)
                    assert!(!a.tokens.is_empty() && a.tokens.len() <= 20 * r.text.len(), "request {i}: {} tokens", a.tokens.len());
                    assert!(a.tokens.iter().all(|&t| (0..SPEECH).contains(&t)));
                }
                (Err(LmError::EmptyText), Err(LmError::EmptyText)) => assert!(r.text.is_empty()),
                (a, b) => panic!("request {i}: {a:?} vs {b:?}"),
            }
        }
        assert!(batched.iter().filter(|r| r.is_ok()).count() == 4);
    }

    #[test]
    fn a_request_too_long_for_its_slot_is_refused_alone() {
        let dir = tempfile::tempdir().unwrap();
        let lm = random_lm(dir.path());
        let reqs = requests();
        let out = tch::no_grad(|| lm.generate(&reqs, 2, 70, &SamplingParams::default(), LengthRatios::default())).unwrap();
        // Request 1 needs sos + 2 + 6 text tokens + task + 5 prompt tokens + 20 × 6 steps.
        assert!(matches!(out[1], Err(LmError::TooLong { needed: 135, limit: 70 })), "{:?}", out[1]);
        assert!(matches!(out[3], Err(LmError::TooLong { needed: 88, limit: 70 })), "{:?}", out[3]);
        assert!(out[0].is_ok() && out[2].is_ok(), "the others are decoded");
    }
}
