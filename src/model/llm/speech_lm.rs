//! CosyVoice2's `Qwen2LM.inference` (the Hugging Face path of `cosyvoice/llm/llm.py`), batched with
//! continuous refill: text tokens (and a voice's prompt text and prompt speech tokens) → speech
//! tokens, many sequences at once. CosyVoice3's `CosyVoice3LM` is the same decoder with another
//! layout ([`LmFamily`], `family`): one decoder, two heads.
//!
//! Input layout as the reference: `[sos, embed(prompt_text ++ text), task_id,
//! speech_embed(prompt_speech)]`; each step feeds `speech_embed` of the sampled token. As the
//! reference: `min_len`/`max_len` are 2× / 20× the text's token count; before `min_len` a sampled
//! end-of-speech (6561) is drawn again (up to 100 times); 6561 ends the sequence; 6562 and 6563 are
//! skipped (not emitted, the same input fed again); `max_len` steps end it. One known difference:
//! when the very first draw is skipped the reference feeds its whole prompt again; here its last
//! position is fed again (a draw of 2 in 6564 at one step of a sequence, with real weights).
//!
//! Decoding ([`BatchDecoder`]): every slot of the KV cache holds one sequence; one decode step
//! (a replayed CUDA graph on CUDA) advances all active slots; finished slots are refilled from the
//! pending requests, the newly admitted prefilled together in one unpadded pass — at once with up
//! to 16 slots, else as soon as a sixteenth of the slots are free — so the batch never drains to
//! its slowest member. Requests are admitted longest first (their step limit: the forced length, or
//! `max_len` from the text's length), so the batch's tail is short and sequences end in waves of
//! like length. Each sequence samples from its own seeded stream, so it gets the same tokens
//! batched or alone, in any order.
//!
//! CosyVoice3 ([`LmFamily::Cosyvoice3`], reference FunAudioLLM/CosyVoice `ace7c47`): sos and task
//! id are rows 6561 and 6563 of `speech_embedding` (no `llm_embedding`), the output layer has
//! 6561 + 200 rows and no bias, and every id from 6561 on ends the sequence. Before `min_len` the
//! reference masks only column 6561 (`sampling_ids`' `ignore_eos`, whose index is CosyVoice3's sos):
//! here a draw of 6561 before `min_len` is drawn again from the distribution without it, and the
//! other stop ids end the sequence as they do upstream. Its output drops each "silent" token after
//! `max_silent_tokens` of them in a row (`CosyVoice3Model.llm_job`); the decoder and the repetition
//! window still see them. Its text must hold `<|endofprompt|>` (the reference asserts it).
//!
//! Neighbours: `qwen2` (the decoder), `sequence` (a sequence's state and what each draw does to
//! it), `sampler`, `batch` (cache, step buffers, graphs); `weights` loads `llm.safetensors`.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Instant;

use tch::{Kind, TchError, Tensor};

use crate::model::layers::{Linear, R};
use crate::model::weights::Weights;
use super::batch::{BatchDecoder, DecodingLm, StepInput, StepOutputs, rows_for};
use super::cache::SlotCache;
use super::qwen2::{span_for, Qwen2, Qwen2Dims, Rows};
use super::request::max_steps;
use super::sequence::{Input, Next, Sequence};
pub use super::request::{LengthRatios, LmError, LmOutput, LmRequest};
pub use super::family::{without_column, LmFamily};
use super::sampler::{draw, uniforms_tensor, SamplingParams, SequenceRng};

/// The LM's weights in a converted model directory.
pub const LLM_FILE: &str = "llm.safetensors";

/// Positions prefilled in one call at most (a call's attention reads its rows' slots whole).
const PREFILL_POSITIONS: i64 = 4096;

/// A CosyVoice speech-token LM: Qwen2 plus its embeddings and output layer.
pub struct SpeechLm {
    qwen: Qwen2,
    pub(super) family: LmFamily,
    /// The sos and task-id embeddings `[2, hidden]`.
    specials: Tensor,
    speech_embedding: Tensor,
    decoder: Linear,
    /// 6561: the first id that is not a speech token (CosyVoice2's end of speech).
    pub(super) speech_tokens: i64,
    /// CosyVoice3: the id the input must hold (`<|endofprompt|>`), if checked.
    end_of_prompt: Option<i64>,
    /// CosyVoice3: silent tokens and how many in a row the output keeps.
    pub(super) silent_tokens: Vec<i64>,
    pub(super) max_silent_tokens: usize,
}

impl SpeechLm {
    /// The LM of `llm.safetensors` (`llm.model.model.*` Qwen2, `speech_embedding`, `llm_decoder`,
    /// and CosyVoice2's `llm_embedding`), laid out as `family`'s.
    pub fn new(w: &Weights, qwen: Qwen2Dims, speech_tokens: i64, family: LmFamily) -> R<SpeechLm> {
        let h = qwen.hidden;
        let outputs = speech_tokens + family.extra_outputs();
        let speech_embedding = w.get("speech_embedding.weight", &[outputs, h]);
        let specials = match family {
            LmFamily::Cosyvoice2 => w.get("llm_embedding.weight", &[2, h]),
            LmFamily::Cosyvoice3 => {
                let rows = Tensor::f_from_slice(&[speech_tokens, speech_tokens + 2])?.f_to_device(speech_embedding.device())?;
                speech_embedding.f_index_select(0, &rows)?
            }
        };
        Ok(SpeechLm {
            qwen: Qwen2::new(w, "llm.model.model", qwen)?,
            family,
            specials,
            speech_embedding,
            decoder: Linear::new(w, "llm_decoder", h, outputs, family == LmFamily::Cosyvoice2),
            speech_tokens,
            end_of_prompt: None,
            silent_tokens: Vec::new(),
            max_silent_tokens: 0,
        })
    }

    /// CosyVoice3's input check and output filter (`[cosyvoice3.llm]`'s `end_of_prompt`,
    /// `silent_tokens`, `max_silent_tokens`).
    pub fn with_rules(mut self, dims: &crate::model::LlmDims) -> SpeechLm {
        self.end_of_prompt = dims.end_of_prompt;
        self.silent_tokens = dims.silent_tokens.clone();
        self.max_silent_tokens = dims.max_silent_tokens;
        self
    }

    pub fn family(&self) -> LmFamily {
        self.family
    }

    /// Loads `dir/llm.safetensors` as `[cosyvoice2.llm]` of the manifest describes it (checked by
    /// name and shape), with weights and KV cache in bf16 on CUDA (never fp16: upstream reports
    /// NaNs) and fp32 on the CPU; log-probabilities and sampling are fp32 either way. Also returns
    /// the sampling settings and length ratios it names.
    pub fn load(dir: &std::path::Path, family: LmFamily, dims: &crate::model::LlmDims, device: tch::Device) -> Result<(SpeechLm, SamplingParams, LengthRatios), crate::model::ModelError> {
        SpeechLm::load_as(dir, family, dims, device, SpeechLm::weights_kind(device))
    }

    /// What [`SpeechLm::load`] keeps the weights in on `device`: bf16 on CUDA, fp32 elsewhere.
    pub fn weights_kind(device: tch::Device) -> Kind {
        if device.is_cuda() {
            Kind::BFloat16
        } else {
            Kind::Float
        }
    }

    /// [`SpeechLm::load`] with the weights in `kind`.
    pub fn load_as(
        dir: &std::path::Path,
        family: LmFamily,
        dims: &crate::model::LlmDims,
        device: tch::Device,
        kind: Kind,
    ) -> Result<(SpeechLm, SamplingParams, LengthRatios), crate::model::ModelError> {
        let w = Weights::load_as(&dir.join(LLM_FILE), device, kind)?;
        let lm = SpeechLm::new(&w, Qwen2Dims::from(dims), dims.speech_tokens, family).map_err(crate::model::ModelError::Inference)?.with_rules(dims);
        w.finish()?;
        let sampling = SamplingParams {
            top_p: dims.top_p,
            top_k: dims.top_k,
            win_size: dims.win_size,
            tau_r: dims.tau_r,
            full_excludes_nucleus: family == LmFamily::Cosyvoice3,
        };
        Ok((lm, sampling, LengthRatios { min: dims.min_token_text_ratio, max: dims.max_token_text_ratio }))
    }

    /// The reference's `lm_input` `[T, hidden]` for one request.
    pub fn input(&self, r: &LmRequest) -> R<Tensor> {
        Ok(self.inputs(&[r])?.0)
    }

    /// Positions of a request's input: sos, prompt text and text, task id, prompt speech tokens.
    fn input_len(r: &LmRequest) -> i64 {
        2 + (r.prompt_text.len() + r.text.len() + r.prompt_speech.len()) as i64
    }

    /// The inputs of several requests laid end to end (`[ΣT, hidden]`) and each one's length,
    /// built with one copy of ids to the device per table: every position is a row of
    /// `[sos, task id; embed(all text ids); speech_embed(all prompt speech ids)]`.
    pub fn inputs(&self, reqs: &[&LmRequest]) -> R<(Tensor, Vec<i64>)> {
        let device = self.device();
        let text: Vec<i64> = reqs.iter().flat_map(|r| r.prompt_text.iter().chain(&r.text)).copied().collect();
        let speech: Vec<i64> = reqs.iter().flat_map(|r| r.prompt_speech.iter()).copied().collect();
        let (text_at, speech_at) = (2i64, 2 + text.len() as i64);
        let (mut t, mut s) = (0i64, 0i64);
        let mut gather = Vec::with_capacity(reqs.iter().map(|r| Self::input_len(r) as usize).sum());
        for r in reqs {
            gather.push(0); // sos
            for _ in 0..r.prompt_text.len() + r.text.len() {
                gather.push(text_at + t);
                t += 1;
            }
            gather.push(1); // task id
            for _ in 0..r.prompt_speech.len() {
                gather.push(speech_at + s);
                s += 1;
            }
        }
        let ids = |v: &[i64]| -> R<Tensor> { Tensor::f_from_slice(v)?.f_to_device(device) };
        let pool = Tensor::f_cat(&[self.specials.shallow_clone(), self.qwen.embed_ids(&ids(&text)?)?, self.speech_embedding.f_index_select(0, &ids(&speech)?)?], 0)?;
        Ok((pool.f_index_select(0, &ids(&gather)?)?, reqs.iter().map(|r| Self::input_len(r)).collect()))
    }

    /// Positions one request needs in its slot: its input and `max_len` steps.
    pub fn positions_needed(&self, r: &LmRequest, ratios: LengthRatios) -> i64 {
        Self::input_len(r) + max_steps(r, ratios) as i64
    }

    /// Decodes every request with the decoder's slots (a request at most `max_positions` long):
    /// one result per request, in order; a libtorch failure fails the whole call. See
    /// [`SpeechLm::generate_with`].
    pub fn generate(&self, dec: &mut BatchDecoder, requests: &[LmRequest], ratios: LengthRatios) -> Result<Vec<Result<LmOutput, LmError>>, TchError> {
        let mut results: Vec<Option<Result<LmOutput, LmError>>> = requests.iter().map(|_| None).collect();
        self.generate_with(dec, requests, ratios, |index, result| -> Result<(), TchError> {
            results[index] = Some(result);
            Ok(())
        })?;
        Ok(results.into_iter().map(|r| r.unwrap_or(Err(LmError::EmptyText))).collect())
    }

    /// Decodes every request, handing each result to `on_done(request index, result)` as soon as
    /// its sequence ends — between decode steps, so the caller can put other device work (token2wav)
    /// between them. Newly admitted requests are prefilled together (unpadded); every step
    /// advances all active slots at once; finished slots are refilled as [`SpeechLm::admit`] says.
    /// An error of libtorch or of `on_done` ends the call.
    pub fn generate_with<E: From<TchError>>(
        &self,
        dec: &mut BatchDecoder,
        requests: &[LmRequest],
        ratios: LengthRatios,
        mut on_done: impl FnMut(usize, Result<LmOutput, LmError>) -> Result<(), E>,
    ) -> Result<(), E> {
        let max_positions = dec.max_positions();
        let mut pending: VecDeque<usize> = VecDeque::new();
        let mut done: Vec<(usize, Result<LmOutput, LmError>)> = Vec::new();
        for (i, r) in requests.iter().enumerate() {
            let needed = self.positions_needed(r, ratios);
            if r.text.is_empty() {
                done.push((i, Err(LmError::EmptyText)));
            } else if self.end_of_prompt.is_some_and(|e| !r.prompt_text.contains(&e) && !r.text.contains(&e)) {
                done.push((i, Err(LmError::NoEndOfPrompt)));
            } else if needed > max_positions {
                done.push((i, Err(LmError::TooLong { needed, limit: max_positions })));
            } else {
                pending.push_back(i);
            }
        }
        // Longest first (a stable sort: like lengths keep their order). The longest sequences
        // then do not start last and hold the batch's tail on a few busy slots, and sequences end
        // in waves of like length, which token2wav's buckets take full. Each sequence draws from
        // its own seeded stream: the order changes when it ends, not what it says.
        pending.make_contiguous().sort_by_key(|&i| std::cmp::Reverse(max_steps(&requests[i], ratios)));
        for slot in 0..dec.slots() {
            dec.cache.free(slot);
        }
        let params = *dec.params();
        let mut free: BTreeSet<usize> = (0..dec.slots()).collect();
        // Sequences by slot.
        let mut active: BTreeMap<usize, Sequence> = BTreeMap::new();
        loop {
            for (index, result) in done.drain(..) {
                on_done(index, result)?;
            }
            let started = Instant::now();
            self.admit(dec, requests, ratios, &mut pending, &mut free, &mut active, &mut done)?;
            let admitted = Instant::now();
            dec.stats_mut().prefill_seconds += (admitted - started).as_secs_f64();
            let Some((&highest, _)) = active.last_key_value() else { break };
            let rows = rows_for(highest + 1, dec.slots());
            let mut tokens = vec![0i64; rows as usize];
            let mut positions = vec![0i64; rows as usize];
            let mut uniforms = vec![(0.5, 0.5); rows as usize];
            let mut embeddings = Vec::new();
            for (&slot, seq) in active.iter_mut() {
                match &seq.next_input {
                    Input::Token(t) => tokens[slot] = *t,
                    Input::Embedding(e) => embeddings.push((slot, e.shallow_clone())),
                }
                positions[slot] = dec.cache.len(slot);
                uniforms[slot] = seq.rng.next_pair();
            }
            let span = span_for(positions.iter().copied().max().unwrap_or(0) + 1, max_positions);
            let out = dec.step(self, rows, span, &StepInput { tokens: &tokens, embeddings: &embeddings, positions: &positions, uniforms: &uniforms })?;
            let launched = Instant::now();
            let picks = Vec::<i64>::try_from(out.picks.f_to_device(tch::Device::Cpu)?.f_flatten(0, -1)?)?;
            let picked = Instant::now();
            let slots: Vec<usize> = active.keys().copied().collect();
            for &slot in &slots {
                dec.cache.advance(slot, 1);
            }
            let drawn: Vec<(i64, i64)> = slots.iter().map(|&s| (picks[2 * s], picks[2 * s + 1])).collect();
            let logp_rows: Vec<i64> = slots.iter().map(|&s| s as i64).collect();
            let mut seqs: Vec<&mut Sequence> = active.values_mut().collect();
            let nexts = self.advance(&mut seqs, &out.logp, &logp_rows, &drawn, &params)?;
            for (slot, next) in slots.into_iter().zip(nexts) {
                if let Next::Done(result) = next {
                    if let Some(seq) = active.remove(&slot) {
                        done.push((seq.index, result));
                    }
                    dec.cache.free(slot);
                    free.insert(slot);
                }
            }
            let stats = dec.stats_mut();
            stats.launch_seconds += (launched - admitted).as_secs_f64();
            stats.wait_seconds += (picked - launched).as_secs_f64();
            stats.host_seconds += picked.elapsed().as_secs_f64();
        }
        for (index, result) in done.drain(..) {
            on_done(index, result)?;
        }
        Ok(())
    }

    /// Fills the lowest free slots from `pending`: prefills the admitted requests together (at
    /// most [`PREFILL_POSITIONS`] positions per call) and draws each one's first token. With more
    /// than 16 slots it waits for a sixteenth of them to be free (the others keep decoding).
    #[allow(clippy::too_many_arguments)]
    fn admit(
        &self,
        dec: &mut BatchDecoder,
        requests: &[LmRequest],
        ratios: LengthRatios,
        pending: &mut VecDeque<usize>,
        free: &mut BTreeSet<usize>,
        active: &mut BTreeMap<usize, Sequence>,
        done: &mut Vec<(usize, Result<LmOutput, LmError>)>,
    ) -> R<()> {
        let params = *dec.params();
        // A prefill pass costs a few eager milliseconds whatever it holds: with many slots, wait
        // until a sixteenth of them are free (or every pending request fits) and fill them in one.
        let wanted = (dec.slots() / 16).max(1).min(pending.len());
        if !active.is_empty() && free.len() < wanted {
            return Ok(());
        }
        while !free.is_empty() && !pending.is_empty() {
            // (slot, request index) of this pass.
            let mut batch: Vec<(usize, usize)> = Vec::new();
            let mut positions = 0;
            while let (Some(&slot), Some(&index)) = (free.first(), pending.front()) {
                let t = Self::input_len(&requests[index]);
                if !batch.is_empty() && positions + t > PREFILL_POSITIONS {
                    break;
                }
                free.pop_first();
                pending.pop_front();
                positions += t;
                if !active.is_empty() {
                    dec.count_refill();
                }
                batch.push((slot, index));
            }
            let stats = dec.stats_mut();
            stats.prefills += 1;
            stats.prefill_positions += positions as u64;
            let reqs: Vec<&LmRequest> = batch.iter().map(|&(_, index)| &requests[index]).collect();
            let (x, lens) = self.inputs(&reqs)?;
            let slots: Vec<usize> = batch.iter().map(|&(slot, _)| slot).collect();
            let hidden = self.qwen.prefill_packed(&mut dec.cache, &slots, &lens, &x)?;
            // The last position of each item.
            let last: Vec<i64> = lens.iter().scan(0, |end, len| {
                *end += len;
                Some(*end - 1)
            }).collect();
            let last_index = Tensor::f_from_slice(&last)?.f_to_device(hidden.device())?;
            let logp = self.log_probs(&hidden.f_index_select(0, &last_index)?)?;
            let mut seqs: Vec<Sequence> = batch
                .iter()
                .zip(&last)
                .map(|(&(slot, index), &end)| {
                    let r = &requests[index];
                    Ok(Sequence {
                        index,
                        slot,
                        step: 0,
                        min_len: r.forced_len.unwrap_or((r.text.len() as f64 * ratios.min) as usize),
                        max_len: max_steps(r, ratios),
                        out: Vec::new(),
                        // Fed again if the first draw is skipped (see the module doc).
                        next_input: Input::Embedding(x.f_get(end)?),
                        rng: SequenceRng::new(r.seed),
                        forced: r.forced_len.is_some(),
                    })
                })
                .collect::<R<_>>()?;
            let uniforms: Vec<(f64, f64)> = seqs.iter_mut().map(|s| s.rng.next_pair()).collect();
            let picks = draw(&logp, &uniforms_tensor(&uniforms, logp.device())?, &params)?;
            let picks = Vec::<i64>::try_from(picks.f_to_device(tch::Device::Cpu)?.f_flatten(0, -1)?)?;
            let drawn: Vec<(i64, i64)> = picks.chunks(2).map(|p| (p[0], p[1])).collect();
            let mut refs: Vec<&mut Sequence> = seqs.iter_mut().collect();
            let logp_rows: Vec<i64> = (0..refs.len() as i64).collect();
            let nexts = self.advance(&mut refs, &logp, &logp_rows, &drawn, &params)?;
            for (seq, next) in seqs.into_iter().zip(nexts) {
                match next {
                    Next::Continue => {
                        active.insert(seq.slot, seq);
                    }
                    Next::Done(result) => {
                        done.push((seq.index, result));
                        dec.cache.free(seq.slot);
                        free.insert(seq.slot);
                    }
                }
            }
        }
        Ok(())
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

    /// `log_softmax(llm_decoder(hidden))` in fp32: `[N, speech_tokens + extra outputs]`.
    fn log_probs(&self, hidden: &Tensor) -> R<Tensor> {
        self.decoder.forward(hidden)?.f_to_kind(Kind::Float)?.f_log_softmax(-1, Kind::Float)
    }

    // What the batch decoder needs of the LM.

    /// A slot cache for this LM (weights' dtype and device).
    pub(super) fn new_cache(&self, slots: usize, max_positions: i64) -> R<SlotCache> {
        self.qwen.cache(slots, max_positions, self.kind())
    }
    pub fn device(&self) -> tch::Device {
        self.speech_embedding.device()
    }
    pub fn kind(&self) -> Kind {
        self.speech_embedding.kind()
    }
    pub fn hidden_size(&self) -> i64 {
        self.qwen.dims().hidden
    }
    /// Writes the speech embeddings of `tokens` `[N]` into `out` `[N, hidden]`.
    pub(super) fn speech_embeddings_into(&self, out: &Tensor, tokens: &Tensor) -> R<Tensor> {
        self.speech_embedding.f_index_select_out(out, 0, tokens)
    }
    /// The decode step over the first rows of `cache` and its sampler draws (device work only).
    pub(super) fn step_outputs(&self, cache: &SlotCache, x: &Tensor, positions: &Tensor, uniforms: &Tensor, span: i64, params: &SamplingParams) -> R<StepOutputs> {
        let hidden = self.qwen.step(cache, Rows::First, x, positions, span)?;
        let logp = self.log_probs(&hidden)?;
        let picks = draw(&logp, uniforms, params)?;
        Ok(StepOutputs { logp, picks })
    }
}

impl DecodingLm for SpeechLm {
    fn new_cache(&self, slots: usize, max_positions: i64) -> R<SlotCache> {
        SpeechLm::new_cache(self, slots, max_positions)
    }
    fn device(&self) -> tch::Device {
        SpeechLm::device(self)
    }
    fn kind(&self) -> Kind {
        SpeechLm::kind(self)
    }
    fn hidden_size(&self) -> i64 {
        SpeechLm::hidden_size(self)
    }
    fn speech_embeddings_into(&self, out: &Tensor, tokens: &Tensor) -> R<Tensor> {
        SpeechLm::speech_embeddings_into(self, out, tokens)
    }
    fn step_outputs(&self, cache: &SlotCache, x: &Tensor, positions: &Tensor, uniforms: &Tensor, span: i64, params: &SamplingParams) -> R<StepOutputs> {
        SpeechLm::step_outputs(self, cache, x, positions, uniforms, span, params)
    }
}

#[cfg(test)]
mod tests;
