//! CosyVoice2 text → speech, whole (kind `cosyvoice2`): each text job arrives prepared by the
//! frontend ([`TextInput::prepare`], run at the worker's intake: normalised, segmented,
//! tokenized), its segments go through the LLM (all the batch's segments decoding together with
//! continuous refill), and as segments finish their speech tokens go through token2wav in length
//! buckets *between* LLM steps — the two stages share the GPU and neither waits for the batch's
//! slowest sequence. Each job's segment audio is joined in order. Jobs that carry speech tokens
//! (as for `cosyvoice2-token2wav`) skip the LLM. A job whose segment yields no speech tokens or
//! runs into the LLM's `max_len`, or whose voice cannot serve its mode, fails alone with its reason.
//!
//! Sizes come from a [`TextPlan`] (`sizing::text_plan`: LLM slots from `[llm]` and the memory
//! budget, token2wav buckets from the token2wav memory model over what the LLM leaves).
//!
//! Neighbours: `frontend` (text → segments), `llm` (`SpeechLm::generate_with`, `BatchDecoder`,
//! `prompt`), `Token2Wav` (this module's parent), `worker::intake` (prepares), `model` (the seam).

use std::path::Path;
use std::time::Instant;

use super::llm::batch::BatchDecoder;
use super::llm::prompt::{self, PromptError, END_OF_PROMPT};
use super::llm::sampler::SamplingParams;
use super::llm::speech_lm::{LengthRatios, LmError, LmRequest, SpeechLm};
use super::Token2Wav;
use crate::model::torchscript::classify;
use crate::batch::{Admission, BatchOutcome, TokenBudget};
use crate::config::LlmConfig;
use crate::frontend::tokenizer::{TextTokenizer, TOKENIZER_FILE};
use crate::frontend::{Frontend, FrontendError, SpeakingRates};
use crate::job::Mode;
use crate::model::{ItemAudio, LlmDims, Manifest, ModelError, Precision, Stage, StageTime, SynthItem, Synthesizer};
use crate::voice::prompt::VoicePrompt;
use crate::model::Device;

/// A text job as the frontend prepared it: what the model thread needs.
#[derive(Debug, Clone, PartialEq)]
pub struct TextInput {
    pub job_id: uuid::Uuid,
    /// Each segment's text token ids, in order.
    pub segments: Vec<Vec<i64>>,
    pub mode: Option<Mode>,
    /// The instruction's token ids followed by `<|endofprompt|>` (mode instruct).
    pub instruction: Option<Vec<i64>>,
    /// Each segment's estimated speech tokens (its characters at the speaking rate, 25 a second):
    /// the job's work for the batch policy.
    pub speech_estimate: Vec<usize>,
    /// Benchmarks with random weights (`[llm] force_lengths`): each segment decodes exactly its
    /// estimate, end-of-speech refused until then.
    pub forced: bool,
}

impl TextInput {
    /// The one way a job's text becomes model input: normalised, segmented and tokenized, its
    /// instruction tokenized. Blocking (grammars): off the async runtime.
    /// `forced`: benchmarks with random weights only.
    pub fn prepare(
        frontend: &Frontend,
        job_id: uuid::Uuid,
        text: &str,
        mode: Option<Mode>,
        instruction: Option<&str>,
        rates: &SpeakingRates,
        forced: bool,
    ) -> Result<TextInput, FrontendError> {
        let prepared = frontend.prepare(text)?;
        let instruction = match instruction {
            Some(i) => Some(frontend.tokenizer().encode(&format!("{i}{END_OF_PROMPT}"))?),
            None => None,
        };
        let speech_estimate = prepared.segments.iter().map(|s| rates.speech_tokens(&s.text, prepared.lang)).collect();
        let segments = prepared.segments.into_iter().map(|s| s.tokens).collect();
        Ok(TextInput { job_id, segments, mode, instruction, speech_estimate, forced })
    }

    /// Estimated speech tokens over all segments.
    pub fn estimated_speech_tokens(&self) -> usize {
        self.speech_estimate.iter().sum()
    }

    /// Text tokens over all segments.
    pub fn text_tokens(&self) -> usize {
        self.segments.iter().map(Vec::len).sum()
    }
}

/// Why one job could not be synthesized (the others are unaffected).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TextJobError {
    #[error(transparent)]
    Prompt(#[from] PromptError),
    #[error("segment {segment}: {source}")]
    Llm { segment: usize, source: LmError },
    #[error("segment {segment}: the LLM ran to max_len ({tokens} speech tokens) without ending the speech")]
    MaxLen { segment: usize, tokens: usize },
    #[error("segment {segment}: the LLM produced no speech tokens")]
    NoSpeech { segment: usize },
    #[error("unknown voice index {0}")]
    UnknownVoice(i64),
}

/// How the two stages are sized.
pub struct TextPlan {
    /// `[llm]`: slot length limits and CUDA graphs.
    pub llm: LlmConfig,
    /// Sequences the LLM decodes at once.
    pub slots: usize,
    /// Admits a token2wav batch of finished segments (size, longest in speech tokens): the
    /// token2wav memory model over the budget the LLM leaves, or a token cap.
    pub token2wav: Box<dyn Admission>,
    /// Segments in one token2wav batch at most.
    pub token2wav_max_batch: usize,
}

impl TextPlan {
    /// A small plan for CPU and tests: 8 slots, token2wav batches of at most 16 segments and
    /// 16,384 padded speech tokens.
    pub fn small(llm: LlmConfig) -> TextPlan {
        TextPlan { llm, slots: 8, token2wav: Box::new(TokenBudget { max_batch_tokens: 16_384 }), token2wav_max_batch: 16 }
    }
}

/// How full a text batch's token2wav buckets were (logged per batch: `token2wav buckets`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct BucketStats {
    pub buckets: u64,
    pub segments: u64,
    /// Speech tokens the buckets' segments carry.
    pub tokens: u64,
    /// Bucket size × its longest segment, summed: what the flow ran on.
    pub padded_tokens: u64,
}

impl BucketStats {
    fn add(&mut self, lengths: impl Iterator<Item = usize>) {
        let (mut n, mut sum, mut longest) = (0u64, 0u64, 0u64);
        for len in lengths {
            n += 1;
            sum += len as u64;
            longest = longest.max(len as u64);
        }
        self.buckets += 1;
        self.segments += n;
        self.tokens += sum;
        self.padded_tokens += n * longest;
    }

    /// Real tokens over padded ones (1 with no padding).
    pub fn fill(&self) -> f64 {
        if self.padded_tokens == 0 { 1.0 } else { self.tokens as f64 / self.padded_tokens as f64 }
    }
}

/// A segment whose speech tokens wait for token2wav.
struct Ready {
    item: usize,
    segment: usize,
    tokens: Vec<i64>,
    voice: i64,
}

pub struct TextToSpeech {
    pub token2wav: Token2Wav,
    pub lm: SpeechLm,
    decoder: BatchDecoder,
    ratios: LengthRatios,
    admission: Box<dyn Admission>,
    /// The bucket cap: at most `[batching] max_batch`, lowered after out-of-memory errors.
    cap: BucketCap,
    /// LLM work since the last `take_stages`.
    llm_work: StageTime,
    /// The LLM's table sizes, which a voice's prompt must fit.
    llm_dims: LlmDims,
}

impl TextToSpeech {
    /// Loads a converted directory with its LLM (`llm.safetensors`) sized as `plan` says, after
    /// checking that its tokenizer and voice prompts fit the LLM's tables.
    pub fn load(dir: &Path, device: Device, precision: Precision, plan: TextPlan) -> Result<TextToSpeech, ModelError> {
        let manifest = Manifest::load(dir)?;
        let err = |reason: String| ModelError::Manifest { dir: dir.display().to_string(), reason };
        let dims = manifest.cosyvoice2.as_ref().and_then(|c| c.llm).ok_or_else(|| err("model.toml has no [cosyvoice2.llm] (convert llm.pt)".into()))?;
        // Ids the LLM's tables cannot look up would fail every batch they are in: refuse the
        // model before loading its weights.
        let tokenizer = TextTokenizer::load(&dir.join(TOKENIZER_FILE)).map_err(|e| err(e.to_string()))?;
        let known = tokenizer.vocab_size();
        if known as i64 > dims.vocab {
            return Err(err(format!("tokenizer.json knows {known} ids, the LLM's embedding has {} rows: not this model's tokenizer", dims.vocab)));
        }
        let token2wav = Token2Wav::load(dir, manifest, device, precision)?;
        for voice in token2wav.voices() {
            fits_llm(&voice.name, &voice.llm_prompt_tokens, &voice.prompt_text, &dims).map_err(err)?;
        }
        let (lm, params, ratios): (SpeechLm, SamplingParams, LengthRatios) = SpeechLm::load(dir, &dims, device.to_tch())?;
        let positions = crate::sizing::llm::max_positions(&plan.llm, &dims);
        let decoder = BatchDecoder::new(&lm, plan.slots.max(1), positions, params, plan.llm.cuda_graphs).map_err(ModelError::Inference)?;
        Ok(TextToSpeech {
            token2wav,
            lm,
            decoder,
            ratios,
            admission: plan.token2wav,
            cap: BucketCap::new(plan.token2wav_max_batch),
            llm_work: StageTime::idle(Stage::Llm),
            llm_dims: dims,
        })
    }

    /// Each item's audio (24 kHz) or why it failed: text items through LLM and token2wav,
    /// speech-token items through token2wav. `Err` for the whole batch only when libtorch fails
    /// (out of memory above all: the caller splits and retries).
    pub fn synthesize_text(&mut self, items: &[SynthItem]) -> Result<Vec<Result<Vec<f32>, TextJobError>>, ModelError> {
        let n = items.len();
        let mut failed: Vec<Option<TextJobError>> = (0..n).map(|_| None).collect();
        // Audio per item per segment, filled as token2wav finishes them.
        let mut pieces: Vec<Vec<Option<Vec<f32>>>> = vec![Vec::new(); n];
        let mut ready: Vec<Ready> = Vec::new();
        // (item, segment) of every LLM request, in order.
        let mut owners: Vec<(usize, usize)> = Vec::new();
        let mut requests: Vec<LmRequest> = Vec::new();
        for (i, item) in items.iter().enumerate() {
            match &item.text {
                Some(text) => match self.requests(text, item.voice) {
                    Ok(reqs) => {
                        pieces[i] = vec![None; reqs.len()];
                        owners.extend((0..reqs.len()).map(|s| (i, s)));
                        requests.extend(reqs);
                    }
                    Err(e) => failed[i] = Some(e),
                },
                None => {
                    pieces[i] = vec![None];
                    ready.push(Ready { item: i, segment: 0, tokens: item.tokens.clone(), voice: item.voice });
                }
            }
        }
        let started = Instant::now();
        let t2w_before = self.token2wav.work_seconds();
        let ratios = self.ratios;
        let voices = items.iter().map(|i| i.voice).collect::<Vec<_>>();
        let mut stats = BucketStats::default();
        let TextToSpeech { token2wav, lm, decoder, admission, llm_work, cap, .. } = self;
        tch::no_grad(|| {
            lm.generate_with(decoder, &requests, ratios, |index, out| -> Result<(), StepError> {
                let (i, segment) = owners[index];
                llm_work.items += 1;
                if failed[i].is_some() {
                    return Ok(());
                }
                match out {
                    Err(source) => failed[i] = Some(TextJobError::Llm { segment, source }),
                    // A forced length (benchmarks) ends there by design.
                    Ok(o) if o.hit_max_len && requests[index].forced_len.is_none() => {
                        failed[i] = Some(TextJobError::MaxLen { segment, tokens: o.tokens.len() })
                    }
                    Ok(o) if o.tokens.is_empty() => failed[i] = Some(TextJobError::NoSpeech { segment }),
                    Ok(o) => {
                        llm_work.tokens += o.tokens.len() as u64;
                        ready.push(Ready { item: i, segment, tokens: o.tokens, voice: voices[i] });
                    }
                }
                // Between LLM steps: a full token2wav bucket runs now.
                while let Some(batch) = take_bucket(&mut ready, admission.as_ref(), cap.cap, false) {
                    run_bucket(token2wav, batch, &failed, &mut pieces, &mut ready, cap, admission.as_mut(), &mut stats)
                        .map_err(StepError::Model)?;
                }
                Ok(())
            })
        })
        .map_err(|e| match e {
            StepError::Tch(e) => classify(e, requests.len()),
            StepError::Model(e) => e,
        })?;
        while let Some(batch) = take_bucket(&mut ready, self.admission.as_ref(), self.cap.cap, true) {
            run_bucket(&mut self.token2wav, batch, &failed, &mut pieces, &mut ready, &mut self.cap, self.admission.as_mut(), &mut stats)?;
        }
        tracing::info!(
            buckets = stats.buckets,
            segments = stats.segments,
            tokens = stats.tokens,
            padded_tokens = stats.padded_tokens,
            fill = format!("{:.3}", stats.fill()),
            "token2wav buckets"
        );
        let t2w = self.token2wav.work_seconds() - t2w_before;
        self.llm_work.seconds += (started.elapsed().as_secs_f64() - t2w).max(0.0);
        Ok(failed
            .into_iter()
            .zip(pieces)
            .map(|(f, segs)| match f {
                Some(e) => Err(e),
                // Every segment's audio, in order; one missing would drop text: never silently.
                None => segs
                    .into_iter()
                    .enumerate()
                    .map(|(segment, audio)| audio.ok_or(TextJobError::NoSpeech { segment }))
                    .collect::<Result<Vec<_>, _>>()
                    .map(|parts| parts.concat()),
            })
            .collect())
    }

    /// A job's LLM requests: its segments, prompted as its mode says.
    fn requests(&self, text: &TextInput, voice: i64) -> Result<Vec<LmRequest>, TextJobError> {
        let index = usize::try_from(voice).map_err(|_| TextJobError::UnknownVoice(voice))?;
        let v = self.token2wav.voices().get(index).ok_or(TextJobError::UnknownVoice(voice))?;
        let mut requests = prompt::requests(text.job_id, &text.segments, &v.name, v, text.mode, text.instruction.as_deref())?;
        if text.forced {
            for (r, &n) in requests.iter_mut().zip(&text.speech_estimate) {
                r.forced_len = Some(n);
            }
        }
        Ok(requests)
    }
}

/// Whether a voice's LLM prompt (speech tokens, text ids) fits the LLM's tables; `Err` says why not.
fn fits_llm(name: &str, speech: &[i64], text: &[i64], dims: &LlmDims) -> Result<(), String> {
    if let Some(bad) = speech.iter().find(|t| !(0..dims.speech_tokens).contains(*t)) {
        return Err(format!("voice {name}: LLM prompt token {bad} outside 0..{}", dims.speech_tokens));
    }
    if let Some(bad) = text.iter().find(|t| !(0..dims.vocab).contains(*t)) {
        return Err(format!("voice {name}: prompt text id {bad} outside 0..{}", dims.vocab));
    }
    Ok(())
}

/// An error between LLM steps: libtorch's (classified with the batch's size) or token2wav's.
enum StepError {
    Tch(tch::TchError),
    Model(ModelError),
}

impl From<tch::TchError> for StepError {
    fn from(e: tch::TchError) -> StepError {
        StepError::Tch(e)
    }
}

/// Between LLM steps a bucket is taken only when it is this full: its segments' speech tokens over
/// its size × its longest. Measured 2026-12-04 on the H200 (`scripts/device/text-e2e.sh`):
/// taking the longest waiting segments as soon as a bucket's worth waited filled buckets to 0.54
/// (a few long segments padded a hundred short ones) and token2wav ran at 258 audio-s/s inside
/// text batches against 541 on equal lengths. The LLM keeps the GPU busy while like segments
/// gather; at the batch's end every waiting segment is taken, longest first (`flush`).
const MIN_FILL: f64 = 0.9;

/// A token2wav call's fixed cost in padded speech tokens, for splitting the batch-end leftovers.
/// From the H200 bench with both packages (2026-12-04): 32 ten-second items took 0.609 s and 64
/// took 1.148 s, i.e. 16.8 ms an item (250 tokens) and 70 ms a call — about 1,000 tokens' worth.
const BUCKET_OVERHEAD_TOKENS: usize = 1_000;

/// The next token2wav batch from `ready`, sorted longest first: a run of consecutive segments as
/// long as the admission rule and `max_batch` allow for its longest. With `flush`, the first run of
/// the split of all of them that costs least ([`cheapest_first_run`]); otherwise the longest run
/// that is complete (one more segment would not be admitted) and at least [`MIN_FILL`] full, or
/// none: partial and ragged runs wait for more segments to finish.
fn take_bucket(ready: &mut Vec<Ready>, admission: &dyn Admission, max_batch: usize, flush: bool) -> Option<Vec<Ready>> {
    if ready.is_empty() {
        return None;
    }
    ready.sort_by_key(|r| std::cmp::Reverse(r.tokens.len()));
    let lengths: Vec<usize> = ready.iter().map(|r| r.tokens.len()).collect();
    // How many segments from `start` one bucket admits (at least one: a lone segment that does
    // not fit is the worker's to split). The admission rule is monotone in size: bisect.
    let admitted = |start: usize| -> usize {
        let (mut fits, mut refused) = (1, (lengths.len() - start).min(max_batch) + 1);
        while refused - fits > 1 {
            let mid = (fits + refused) / 2;
            if admission.check(mid, lengths[start]).is_none() {
                fits = mid;
            } else {
                refused = mid;
            }
        }
        fits
    };
    if flush {
        let size = cheapest_first_run(&lengths, admitted);
        return Some(ready.drain(..size).collect());
    }
    let mut prefix = Vec::with_capacity(lengths.len() + 1);
    prefix.push(0usize);
    for len in &lengths {
        prefix.push(prefix[prefix.len() - 1] + len);
    }
    for start in 0..lengths.len() {
        let size = admitted(start);
        let complete = size == max_batch || admission.check(size + 1, lengths[start]).is_some();
        // Shorter runs further down admit at least as many and have fewer segments below them:
        // none of them is complete either.
        if !complete || start + size > lengths.len() {
            return None;
        }
        let fill = (prefix[start + size] - prefix[start]) as f64 / (size * lengths[start]) as f64;
        if fill >= MIN_FILL {
            return Some(ready.drain(start..start + size).collect());
        }
    }
    None
}

/// `lengths` (sorted longest first) split into consecutive runs, each at most `admitted(start)`
/// long, so that the padded tokens plus [`BUCKET_OVERHEAD_TOKENS`] a run add up to the least: the
/// first run's length. Segments left waiting for like-length peers (long ones, above all) go
/// together instead of padding a bucket of short ones. Dynamic programming over suffixes (a run's
/// cost is set by its first, longest segment): `lengths.len()` × `max_batch` steps.
fn cheapest_first_run(lengths: &[usize], admitted: impl Fn(usize) -> usize) -> usize {
    let n = lengths.len();
    let mut cost = vec![0usize; n + 1];
    let mut first = vec![1usize; n + 1];
    for start in (0..n).rev() {
        cost[start] = usize::MAX;
        for size in 1..=admitted(start).min(n - start) {
            let c = size * lengths[start] + BUCKET_OVERHEAD_TOKENS + cost[start + size];
            if c < cost[start] {
                cost[start] = c;
                first[start] = size;
            }
        }
    }
    first[0]
}

/// Runs one token2wav batch and files each segment's audio (segments of failed jobs are skipped),
/// counting it in `stats`.
/// Out of memory with more than one segment: the bucket cap backs off, the admission rule hears
/// of it, and the segments go back to `ready` to be taken again in smaller buckets — the LLM's
/// work for the batch is kept. One segment that does not fit alone fails the batch (the worker
/// splits it).
fn run_bucket(
    token2wav: &mut Token2Wav,
    batch: Vec<Ready>,
    failed: &[Option<TextJobError>],
    pieces: &mut [Vec<Option<Vec<f32>>>],
    ready: &mut Vec<Ready>,
    cap: &mut BucketCap,
    admission: &mut dyn Admission,
    stats: &mut BucketStats,
) -> Result<(), ModelError> {
    let batch: Vec<Ready> = batch.into_iter().filter(|r| failed[r.item].is_none()).collect();
    if batch.is_empty() {
        return Ok(());
    }
    let items: Vec<SynthItem> = batch.iter().map(|r| SynthItem::tokens(r.tokens.clone(), r.voice)).collect();
    match token2wav.run(&items, None) {
        Ok(out) => {
            stats.add(batch.iter().map(|r| r.tokens.len()));
            for (r, (_, wave)) in batch.iter().zip(out) {
                pieces[r.item][r.segment] = Some(wave);
            }
            cap.clean();
            admission.observe(&BatchOutcome::Clean);
            Ok(())
        }
        Err(e) if e.is_oom() && batch.len() > 1 => {
            token2wav.release_cached();
            cap.out_of_memory(batch.len());
            admission.observe(&BatchOutcome::OutOfMemory);
            tracing::warn!(segments = batch.len(), cap = cap.cap, "token2wav ran out of memory: smaller buckets from now on");
            ready.extend(batch);
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// Clean buckets before the cap grows by one again.
const RECOVER_AFTER: usize = 4;

/// The token2wav bucket cap, AIMD: half the size of a bucket that ran out of memory, one more
/// after every `RECOVER_AFTER` clean buckets, never above `[batching] max_batch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketCap {
    pub cap: usize,
    max: usize,
    clean: usize,
}

impl BucketCap {
    pub fn new(max: usize) -> BucketCap {
        BucketCap { cap: max.max(1), max: max.max(1), clean: 0 }
    }

    pub fn clean(&mut self) {
        self.clean += 1;
        if self.clean >= RECOVER_AFTER {
            self.clean = 0;
            self.cap = (self.cap + 1).min(self.max);
        }
    }

    pub fn out_of_memory(&mut self, size: usize) {
        self.cap = (size / 2).max(1);
        self.clean = 0;
    }
}

impl Synthesizer for TextToSpeech {
    fn manifest(&self) -> &Manifest {
        Synthesizer::manifest(&self.token2wav)
    }

    /// Speech-token items only (what `cosyvoice2-token2wav` takes); text items fail here.
    fn synthesize(&mut self, items: &[SynthItem]) -> Result<Vec<Vec<f32>>, ModelError> {
        self.synthesize_text(items)?.into_iter().map(|r| r.map_err(|e| ModelError::BadInput(e.to_string()))).collect()
    }

    fn synthesize_items(&mut self, items: &[SynthItem]) -> Result<Vec<ItemAudio>, ModelError> {
        Ok(self.synthesize_text(items)?.into_iter().map(|r| r.map_err(|e| e.to_string())).collect())
    }

    fn llm_slots(&self) -> Option<usize> {
        Some(self.decoder.slots())
    }

    fn set_voice(&mut self, index: usize, prompt: &VoicePrompt) -> Result<(), ModelError> {
        fits_llm(&prompt.name, &prompt.speech_tokens, &prompt.prompt_text_tokens, &self.llm_dims).map_err(ModelError::BadInput)?;
        self.token2wav.set_voice(index, prompt)
    }

    fn take_stages(&mut self) -> Vec<StageTime> {
        let llm = std::mem::replace(&mut self.llm_work, StageTime::idle(Stage::Llm));
        let mut stages = if llm.items > 0 { vec![llm] } else { Vec::new() };
        stages.extend(self.token2wav.take_stages());
        stages
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bucket_cap_halves_below_an_oom_and_climbs_back_slowly_to_its_maximum() {
        let mut cap = BucketCap::new(128);
        cap.out_of_memory(128);
        assert_eq!(cap.cap, 64);
        cap.out_of_memory(64);
        cap.out_of_memory(1);
        assert_eq!(cap.cap, 1, "never below one");
        for _ in 0..RECOVER_AFTER * 3 {
            cap.clean();
        }
        assert_eq!(cap.cap, 4, "one more per {RECOVER_AFTER} clean buckets");
        for _ in 0..RECOVER_AFTER * 1000 {
            cap.clean();
        }
        assert_eq!(cap.cap, 128, "never above max_batch");
        assert_eq!(BucketCap::new(0).cap, 1);
    }

    fn waiting(lengths: impl IntoIterator<Item = usize>) -> Vec<Ready> {
        lengths.into_iter().enumerate().map(|(i, n)| Ready { item: i, segment: 0, tokens: vec![1; n], voice: 0 }).collect()
    }

    #[test]
    fn between_llm_steps_a_bucket_is_taken_only_when_like_segments_fill_it() {
        let budget = TokenBudget { max_batch_tokens: 1 << 30 };
        // One long segment among short ones: a bucket led by it would be a third full.
        let mut ready = waiting(std::iter::once(100).chain([10; 6]));
        let bucket = take_bucket(&mut ready, &budget, 4, false).expect("four like short segments fill a bucket");
        assert_eq!(bucket.iter().map(|r| r.tokens.len()).collect::<Vec<_>>(), vec![10; 4]);
        assert!(take_bucket(&mut ready, &budget, 4, false).is_none(), "100, 10, 10: no complete, full bucket");
        assert_eq!(ready.len(), 3, "nothing taken");
        ready.extend(waiting([98, 95, 90]));
        let bucket = take_bucket(&mut ready, &budget, 4, false).expect("the long one has peers now");
        let lengths: Vec<usize> = bucket.iter().map(|r| r.tokens.len()).collect();
        assert_eq!(lengths, vec![100, 98, 95, 90]);
        let mut stats = BucketStats::default();
        stats.add(lengths.iter().copied());
        assert_eq!((stats.tokens, stats.padded_tokens), (383, 400));
        // At the batch's end everything goes, longest first, split where padding plus each
        // call's overhead costs least: 50 alone (1,050) and the rest together (1,040), not
        // 50, 10, 10, 1 (1,200) and 1 (1,001).
        ready.extend(waiting([50, 1, 1]));
        let mut runs = Vec::new();
        while let Some(b) = take_bucket(&mut ready, &budget, 4, true) {
            runs.push(b.iter().map(|r| r.tokens.len()).collect::<Vec<_>>());
        }
        assert_eq!(runs, vec![vec![50], vec![10, 10, 1, 1]]);
        assert!(ready.is_empty());
    }

    #[test]
    fn at_the_batchs_end_long_leftovers_go_together_not_in_front_of_short_ones() {
        let budget = TokenBudget { max_batch_tokens: 1 << 30 };
        let mut ready = waiting([100, 98, 95].into_iter().chain([10; 200]));
        let mut runs = Vec::new();
        while let Some(b) = take_bucket(&mut ready, &budget, 128, true) {
            runs.push((b.len(), b[0].tokens.len()));
        }
        // Longest first would pad 125 short segments to 100 (12,800 tokens for 1,543).
        assert_eq!(runs[0], (3, 100), "the three long ones alone");
        assert_eq!(runs.iter().map(|r| r.0).sum::<usize>(), 203);
        assert!(runs[1..].iter().all(|r| r.1 == 10));
        // A lone segment past what memory admits still goes (the worker splits what fails).
        let mut ready = waiting([50, 50]);
        let tight = TokenBudget { max_batch_tokens: 10 };
        assert_eq!(take_bucket(&mut ready, &tight, 128, true).map(|b| b.len()), Some(1));
    }

    #[test]
    fn a_memory_limited_bucket_is_complete_at_what_memory_admits() {
        // 40 padded tokens: two segments of 20.
        let budget = TokenBudget { max_batch_tokens: 40 };
        let mut ready = waiting([20]);
        assert!(take_bucket(&mut ready, &budget, 128, false).is_none(), "one of two");
        ready.extend(waiting([20, 20]));
        assert_eq!(take_bucket(&mut ready, &budget, 128, false).map(|b| b.len()), Some(2));
        // A segment past the budget alone still goes (the worker splits what fails).
        let mut ready = waiting([50]);
        assert_eq!(take_bucket(&mut ready, &budget, 128, true).map(|b| b.len()), Some(1));
    }
}
