//! Text → speech, whole (kinds `cosyvoice2` and `cosyvoice3`): each text job arrives prepared by
//! the frontend ([`TextInput::prepare`], run at the worker's intake: normalised, segmented,
//! tokenized), its segments go through the LLM (all the batch's segments decoding together with
//! continuous refill), and as segments finish their speech tokens go through the family's token2wav
//! ([`TextToken2Wav`]: CosyVoice2's or CosyVoice3's) in length buckets on the model's thread (on
//! CUDA, optionally a stream of its own: `[llm] overlap_token2wav`) while the LLM decodes on, on a
//! thread of its own for the batch — the
//! two stages share the GPU at once, each on the stream `streams` chose for it — and neither
//! waits for the batch's slowest sequence. Each bucket's waveforms are cut into segments on a
//! thread of their own (with `[llm] pipelined_buckets` on CUDA, that thread also waits for their
//! copy, so the next bucket is queued while the last one runs), and a job's segments come back in
//! order as the pieces of its `audio::Waveform` (joined where the job is encoded, off this
//! thread). A warm-up sentence runs through both stages at load on CUDA. Jobs that carry speech
//! tokens (as for the `-token2wav` kinds) skip the LLM. A job whose segment yields no speech
//! tokens or runs into the LLM's `max_len`, or whose voice cannot serve its mode, fails alone with
//! its reason.
//!
//! The two families differ here only in their LM's layout and rules (`llm::family::LmFamily`,
//! loaded from the manifest's `[cosyvoice2.llm]` or `[cosyvoice3.llm]`) and in how it is prompted
//! (`llm::prompt`: CosyVoice3's system prompt).
//!
//! Sizes come from a [`TextPlan`] (`sizing::text_plan`: LLM slots from `[llm]` and the memory
//! budget, token2wav buckets from the token2wav memory model over what the LLM leaves).
//!
//! Neighbours: [`buckets`] (which finished segments go through token2wav together), `streams`
//! (which CUDA stream, or share of the SMs, each stage's kernels go to), `frontend`
//! (text → segments), `model::llm` (`SpeechLm::generate_with`, `BatchDecoder`, `prompt`),
//! `model::token2wav` (the token2wav seam), `worker::intake` (prepares), `model` (the seam, the
//! one loader).

pub mod buckets;
mod streams;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::time::Instant;

use self::buckets::{cut_segments, vocode, BucketCap, BucketStats, Ready};
use self::streams::StageStreams;
use super::llm::batch::BatchDecoder;
use super::llm::prompt::{self, PromptError, SystemPrompt, END_OF_PROMPT, SYSTEM_PROMPT};
use super::llm::sampler::SamplingParams;
use super::llm::speech_lm::{LengthRatios, LmError, LmFamily, LmRequest, SpeechLm};
use super::token2wav::{HostWaves, TextToken2Wav};
use crate::audio::Waveform;
use crate::model::cuda_stream::SideStream;
use crate::model::tch_panic::caught;
use crate::model::torchscript::classify;
use crate::batch::{Admission, TokenBudget};
use crate::config::LlmConfig;
use crate::frontend::tokenizer::{TextTokenizer, TOKENIZER_FILE};
use crate::frontend::{Frontend, FrontendError, SpeakingRates};
use crate::job::Mode;
use crate::model::{ItemAudio, LlmDims, Manifest, ModelError, Precision, Stage, StageTime, SynthItem, Synthesizer};
use crate::model::VoicePrompt;
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
    /// instruction written as `family`'s LM takes it and tokenized. Blocking (grammars): off the
    /// async runtime.
    /// `forced`: benchmarks with random weights only.
    #[allow(clippy::too_many_arguments)]
    pub fn prepare(
        frontend: &Frontend,
        family: LmFamily,
        job_id: uuid::Uuid,
        text: &str,
        mode: Option<Mode>,
        instruction: Option<&str>,
        rates: &SpeakingRates,
        forced: bool,
    ) -> Result<TextInput, FrontendError> {
        let prepared = frontend.prepare(text)?;
        let instruction = match instruction {
            Some(i) => Some(frontend.tokenizer().encode(&prompt::instruction_text(family, i))?),
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

pub struct TextToSpeech {
    pub token2wav: Box<dyn TextToken2Wav>,
    pub lm: SpeechLm,
    decoder: BatchDecoder,
    ratios: LengthRatios,
    admission: Box<dyn Admission>,
    /// The bucket cap: at most `[llm] token2wav_max_bucket`, lowered after out-of-memory errors.
    cap: BucketCap,
    /// LLM work since the last `take_stages`.
    llm_work: StageTime,
    /// The LLM's table sizes, which a voice's prompt must fit.
    llm_dims: LlmDims,
    /// CosyVoice3's system prompt (`None` for CosyVoice2).
    system: Option<SystemPrompt>,
    /// Where the token2wav thread queues its kernels (`[llm] overlap_token2wav` on CUDA): beside
    /// the decode's; with `[llm] decode_sms`, on a share of the SMs. `None`: the default stream,
    /// the decode's own.
    side_stream: Option<SideStream>,
    /// Where the decode queues its kernels while token2wav runs on `side_stream`: with
    /// `[llm] prioritise_decode`, a stream of high priority. `None`: the calling thread's stream.
    decode_stream: Option<SideStream>,
    /// Where the token2wav thread queues a batch's last buckets once the decode is done, when
    /// `side_stream` keeps it to a share of the SMs (`[llm] decode_sms`, `closing_on_all_sms`): a
    /// stream of every SM. `None`: `side_stream` to the end.
    closing_stream: Option<SideStream>,
    /// The last text batch's token2wav buckets ([`TextToSpeech::last_bucket_stats`]).
    last_buckets: BucketStats,
}

impl TextToSpeech {
    /// Loads a converted directory (kind `cosyvoice2` or `cosyvoice3`) with its LLM
    /// (`llm.safetensors`) sized as `plan` says, after checking that its tokenizer and voice
    /// prompts fit the LLM's tables.
    pub fn load(dir: &Path, device: Device, precision: Precision, plan: TextPlan) -> Result<TextToSpeech, ModelError> {
        let manifest = Manifest::load(dir)?;
        let err = |reason: String| ModelError::Manifest { dir: dir.display().to_string(), reason };
        if !manifest.kind.takes_text() {
            return Err(err(format!("kind {} takes no text (kinds cosyvoice2 and cosyvoice3 do)", manifest.kind.as_str())));
        }
        let (family, dims) = manifest.llm().map(|(f, d)| (f, d.clone())).ok_or_else(|| err("model.toml has no LM section (convert llm.pt)".into()))?;
        // Ids the LLM's tables cannot look up would fail every batch they are in: refuse the
        // model before loading its weights.
        let tokenizer = TextTokenizer::load(&dir.join(TOKENIZER_FILE)).map_err(|e| err(e.to_string()))?;
        let known = tokenizer.vocab_size();
        if known as i64 > dims.vocab {
            return Err(err(format!("tokenizer.json knows {known} ids, the LLM's embedding has {} rows: not this model's tokenizer", dims.vocab)));
        }
        let system = match family {
            LmFamily::Cosyvoice2 => None,
            LmFamily::Cosyvoice3 => Some(system_prompt(&tokenizer, &dims).map_err(err)?),
        };
        // Where a load's seconds go (the worker consumes meanwhile, but the GPU waits for it).
        let started = std::time::Instant::now();
        let mut token2wav = super::family_token2wav(dir, manifest, device, precision)?;
        for voice in token2wav.voices() {
            fits_llm(&voice.name, &voice.llm_prompt_tokens, &voice.prompt_text, &dims).map_err(err)?;
        }
        let token2wav_s = started.elapsed().as_secs_f64();
        let (lm, params, ratios): (SpeechLm, SamplingParams, LengthRatios) = SpeechLm::load(dir, family, &dims, device.to_tch())?;
        let llm_s = started.elapsed().as_secs_f64() - token2wav_s;
        let positions = super::llm::request::max_positions(&plan.llm, &dims, system.as_ref().map_or(0, |s| s.tokens.len()));
        let decoder = BatchDecoder::new(&lm, plan.slots.max(1), positions, params, plan.llm.cuda_graphs).map_err(ModelError::Inference)?;
        tracing::info!(
            token2wav_s = format!("{token2wav_s:.2}"),
            llm_s = format!("{llm_s:.2}"),
            kv_cache_s = format!("{:.2}", started.elapsed().as_secs_f64() - token2wav_s - llm_s),
            "weights loaded"
        );
        let warm_up_text = tokenizer.encode(WARM_UP_TEXT).map_err(|e| err(e.to_string()))?;
        let StageStreams { buckets: side_stream, closing: closing_stream, decode: decode_stream } = StageStreams::new(&plan.llm, device).map_err(err)?;
        if plan.llm.pipelined_buckets && matches!(device, Device::Cuda(_)) {
            token2wav.set_pipelined(true);
            tracing::info!("token2wav's buckets pipelined: the next queued while the last runs, its waveforms waited for by the cutter");
        }
        let mut tts = TextToSpeech {
            token2wav,
            lm,
            decoder,
            ratios,
            admission: plan.token2wav,
            cap: BucketCap::new(plan.token2wav_max_batch, plan.llm.token2wav_least_bucket),
            llm_work: StageTime::idle(Stage::Llm),
            llm_dims: dims,
            system,
            side_stream,
            decode_stream,
            closing_stream,
            last_buckets: BucketStats::default(),
        };
        if matches!(device, Device::Cuda(_)) {
            // A failed warm-up costs the first batch its speed, not the worker.
            match tts.warm_up(warm_up_text) {
                Ok(seconds) => tracing::info!(seconds = format!("{seconds:.2}"), "warmed up: one sentence through the LLM and token2wav"),
                Err(e) => tracing::warn!(error = %e, "warm-up failed; the first batch pays the first calls' costs"),
            }
        }
        Ok(tts)
    }

    /// How the last text batch's token2wav buckets ran: their count, fill, and the thread they ran on.
    pub fn last_bucket_stats(&self) -> BucketStats {
        self.last_buckets
    }

    /// One short sentence (`text`: its token ids) through both stages, its length forced (random
    /// weights warm up as real ones do): the LLM's first prefill and graph capture, the compiled
    /// packages' first calls (their kernels load then) and libtorch's first handles happen here,
    /// at load, rather than inside the first text batch — the 2026-12-04 corpus run's first batch (12 jobs,
    /// 444 s of audio) took 3.3 s with NVML at ≈ 50 %. Nothing is kept: its stage times are
    /// dropped. Returns the seconds it took. `Ok` without work for a model with no voice.
    pub fn warm_up(&mut self, text: Vec<i64>) -> Result<f64, ModelError> {
        let started = Instant::now();
        if self.token2wav.voices().is_empty() || text.is_empty() {
            return Ok(0.0);
        }
        let input = TextInput {
            job_id: uuid::Uuid::nil(),
            segments: vec![text],
            mode: Some(Mode::CrossLingual),
            instruction: None,
            speech_estimate: vec![WARM_UP_SPEECH_TOKENS],
            forced: true,
        };
        let item = SynthItem { tokens: Vec::new(), voice: 0, text: Some(std::sync::Arc::new(input)), speed: None };
        let out = self.synthesize_text(std::slice::from_ref(&item));
        let _ = self.take_stages();
        match out?.pop() {
            Some(Ok(_)) => Ok(started.elapsed().as_secs_f64()),
            Some(Err(e)) => Err(ModelError::BadOutput(format!("warm-up sentence: {e}"))),
            None => Err(ModelError::BadOutput("warm-up sentence: no result".into())),
        }
    }

    /// Each item's audio (24 kHz) or why it failed: text items through LLM and token2wav,
    /// speech-token items through token2wav. `Err` for the whole batch only when libtorch fails
    /// (out of memory above all: the caller splits and retries).
    /// Each job's segments come back as the pieces of its [`Waveform`], joined where it is
    /// encoded: off this thread, which the GPU waits on.
    pub fn synthesize_text(&mut self, items: &[SynthItem]) -> Result<Vec<Result<Waveform, TextJobError>>, ModelError> {
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
                    ready.push(Ready { item: i, segment: 0, tokens: item.tokens.clone(), voice: item.voice, speed: item.speed });
                }
            }
        }
        let started = Instant::now();
        let t2w_before = self.token2wav.work_seconds();
        let graphs_before = self.token2wav.flow_graph_stats();
        let decoder_before = self.decoder.stats().clone();
        let mut stats = BucketStats::default();
        // Each bucket's waveforms are cut into its segments' audio on a thread of their own, while
        // the GPU runs on (≈ 0.1 s of host work per bucket of 128 on the H200, 2026-12-04).
        let (cut_tx, cut_rx) = std::sync::mpsc::channel::<(Vec<(usize, usize)>, HostWaves)>();
        let (cut, queued_seconds) = std::thread::scope(|scope| -> Result<(Vec<(usize, usize, Vec<f32>)>, f64), ModelError> {
            let cutter = scope.spawn(move || cut_segments(cut_rx));
            let ran = self.decode_and_vocode(&requests, &owners, items, &mut failed, std::mem::take(&mut ready), &cut_tx, &mut stats);
            // The cutter ends once the last bucket's waveforms are cut.
            drop(cut_tx);
            let cut = cutter.join();
            ran?;
            cut.map_err(|_| ModelError::BadOutput("the thread cutting segments' audio panicked".into()))?
        })?;
        for (item, segment, audio) in cut {
            pieces[item][segment] = Some(audio);
        }
        self.last_buckets = stats;
        // Small buckets' flow steps replayed as CUDA graphs (`flow_graphs`), and their captures.
        let graphs = self.token2wav.flow_graph_stats();
        tracing::info!(
            buckets = stats.buckets,
            segments = stats.segments,
            tokens = stats.tokens,
            padded_tokens = stats.padded_tokens,
            fill = format!("{:.3}", stats.fill()),
            graph_steps = graphs.replays - graphs_before.replays,
            graphs_captured = graphs.captured - graphs_before.captured,
            graph_capture_ms = ((graphs.capture_seconds - graphs_before.capture_seconds) * 1000.0) as u64,
            closing_buckets = stats.closing_buckets,
            closing_ms = stats.closing_ms,
            "token2wav buckets"
        );
        // Where the LLM's share of the batch went; the GPU idles through `host` and `capture`.
        let d = self.decoder.stats().timings_since(&decoder_before);
        tracing::info!(
            steps = d.steps - decoder_before.steps,
            prefill_ms = (d.prefill_seconds * 1000.0) as u64,
            launch_ms = (d.launch_seconds * 1000.0) as u64,
            wait_ms = (d.wait_seconds * 1000.0) as u64,
            host_ms = (d.host_seconds * 1000.0) as u64,
            graphs_captured = d.graphs_captured - decoder_before.graphs_captured,
            capture_ms = ((d.capture_seconds - decoder_before.capture_seconds) * 1000.0) as u64,
            "llm decode"
        );
        // The batch's time is billed once: token2wav's row holds its buckets' time, the LLM's the
        // rest of the batch's (with the stages overlapped, the time the LLM ran alone). Pipelined
        // buckets' GPU time is known once the cutter has waited for their copies.
        self.token2wav.add_work_seconds(queued_seconds);
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
                    .map(Waveform::from_pieces),
            })
            .collect())
    }

    /// Every request through the LLM on a thread of its own for the batch while token2wav runs on
    /// this one, the model's ([`vocode`]: libtorch's per-thread caches of cuDNN's plans and graphs,
    /// which token2wav's ever-new bucket shapes fill, outlive the batch): each finished segment
    /// goes to token2wav as the LLM returns it, full buckets run as
    /// they fill, the rest in the batch's last buckets once decoding is over; each bucket's host
    /// waveforms go to `cut` with their (item, segment). `ready`: segments that need no LLM
    /// (speech-token items). Segments of jobs failed meanwhile are skipped.
    ///
    /// On CUDA with `[llm] overlap_token2wav` token2wav queues its kernels on the
    /// model's side stream, so the GPU runs the decode's memory-bound steps and the flow's
    /// compute-bound buckets at once — the decode on a stream of high priority with
    /// `[llm] prioritise_decode`, so that its small kernels do not queue behind the flow's blocks;
    /// otherwise both threads queue on the default stream and the GPU runs them one after the
    /// other (the host work of either still overlaps the other's).
    #[allow(clippy::too_many_arguments)]
    fn decode_and_vocode(
        &mut self,
        requests: &[LmRequest],
        owners: &[(usize, usize)],
        items: &[SynthItem],
        failed: &mut [Option<TextJobError>],
        ready: Vec<Ready>,
        cut: &Sender<(Vec<(usize, usize)>, HostWaves)>,
        stats: &mut BucketStats,
    ) -> Result<(), ModelError> {
        let ratios = self.ratios;
        let TextToSpeech { token2wav, lm, decoder, admission, llm_work, cap, side_stream, decode_stream, closing_stream, .. } = self;
        // Jobs failed so far: token2wav skips their segments.
        let dropped: Vec<AtomicBool> = failed.iter().map(|f| AtomicBool::new(f.is_some())).collect();
        // Set when decoding fails: token2wav stops at its next bucket.
        let abort = AtomicBool::new(false);
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Ready>();
        std::thread::scope(|scope| -> Result<(), ModelError> {
            let (dropped_ref, abort_ref) = (&dropped, &abort);
            // The decode on a thread of its own for the batch; token2wav on this one, the model's
            // thread, which outlives the batch: libtorch keeps cuDNN's convolution plans and
            // attention graphs per thread and per shape, and token2wav's buckets meet new shapes
            // all the time, so its caches must not start empty with every batch (the decode's
            // FlashAttention and cuBLAS calls keep nothing per thread).
            let decoder_thread = std::thread::Builder::new()
                .name("llm-decode".into())
                .spawn_scoped(scope, move || -> Result<(), StepError> {
                    // The decode's kernels on its stream of high priority, when there is one.
                    let _decode_stream = decode_stream.as_ref().map(SideStream::enter_scoped).transpose().map_err(|e| StepError::Classified(ModelError::Inference(e.into())))?;
                    // A libtorch failure tch raises as a panic is the batch's error, classified
                    // (out of memory included), as on the model's thread.
                    let decoded = caught(requests.len(), || Ok(tch::no_grad(|| {
                        lm.generate_with(decoder, requests, ratios, |index, out| -> Result<(), StepError> {
                            let (i, segment) = owners[index];
                            llm_work.items += 1;
                            if failed[i].is_some() {
                                return Ok(());
                            }
                            let failure = match out {
                                Err(source) => TextJobError::Llm { segment, source },
                                // A forced length (benchmarks) ends there by design.
                                Ok(o) if o.hit_max_len && requests[index].forced_len.is_none() => TextJobError::MaxLen { segment, tokens: o.tokens.len() },
                                Ok(o) if o.tokens.is_empty() => TextJobError::NoSpeech { segment },
                                Ok(o) => {
                                    llm_work.tokens += o.tokens.len() as u64;
                                    let r = Ready { item: i, segment, tokens: o.tokens, voice: items[i].voice, speed: items[i].speed };
                                    // token2wav is gone only after an error, which the batch reports.
                                    return ready_tx.send(r).map_err(|_| StepError::VocoderStopped);
                                }
                            };
                            failed[i] = Some(failure);
                            dropped_ref[i].store(true, Ordering::Relaxed);
                            Ok(())
                        })
                    })))
                    .unwrap_or_else(|e| Err(StepError::Classified(e)));
                    if decoded.is_err() {
                        abort_ref.store(true, Ordering::Relaxed);
                    }
                    // The last segment is sent (`ready_tx` dropped here): token2wav runs the rest and ends.
                    decoded
                })
                .map_err(|e| ModelError::BadOutput(format!("cannot start the LLM's decode thread: {e}")))?;
            let vocoded = (|| -> Result<(), ModelError> {
                // token2wav's buckets on their stream for this batch (the one before is current again after).
                let _side_stream = side_stream.as_ref().map(SideStream::enter_scoped).transpose().map_err(|e| ModelError::Inference(e.into()))?;
                tch::no_grad(|| vocode(token2wav.as_mut(), ready_rx, closing_stream.as_ref(), ready, dropped_ref, abort_ref, cut, cap, admission.as_mut(), stats))
            })();
            // token2wav stopped (done, or failed: the decode's next send then fails and it ends).
            let decoded = decoder_thread.join().map_err(|_| ModelError::BadOutput("the LLM's decode thread panicked".into()))?;
            match decoded {
                Ok(()) => vocoded,
                Err(StepError::VocoderStopped) => Err(vocoded.err().unwrap_or_else(|| ModelError::BadOutput("token2wav stopped before the LLM's last segment".into()))),
                Err(StepError::Tch(e)) => Err(classify(e, requests.len())),
                Err(StepError::Classified(e)) => Err(e),
            }
        })
    }

    /// A job's LLM requests: its segments, prompted as its mode says.
    fn requests(&self, text: &TextInput, voice: i64) -> Result<Vec<LmRequest>, TextJobError> {
        let index = usize::try_from(voice).map_err(|_| TextJobError::UnknownVoice(voice))?;
        let v = self.token2wav.voices().get(index).ok_or(TextJobError::UnknownVoice(voice))?;
        let mut requests = prompt::requests(text.job_id, &text.segments, &v.name, v, text.mode, text.instruction.as_deref(), self.system.as_ref())?;
        if text.forced {
            for (r, &n) in requests.iter_mut().zip(&text.speech_estimate) {
                r.forced_len = Some(n);
            }
        }
        Ok(requests)
    }
}

/// The sentence [`TextToSpeech::warm_up`] synthesizes at load, and the speech tokens it is forced to.
const WARM_UP_TEXT: &str = "Warming up.";
const WARM_UP_SPEECH_TOKENS: usize = 50;

/// Tokens of the system prompt `manifest`'s LM puts before a text (0 for CosyVoice2's): what a
/// slot's positions must hold beyond `[llm]`'s limits (`request::max_positions`). Blocking (reads
/// `tokenizer.json` for CosyVoice3).
pub fn system_prompt_tokens(manifest: &Manifest) -> Result<usize, ModelError> {
    let err = |reason: String| ModelError::Manifest { dir: manifest.dir.display().to_string(), reason };
    match manifest.llm() {
        Some((LmFamily::Cosyvoice3, dims)) => {
            let tokenizer = TextTokenizer::load(&manifest.dir.join(TOKENIZER_FILE)).map_err(|e| err(e.to_string()))?;
            Ok(system_prompt(&tokenizer, dims).map_err(err)?.tokens.len())
        }
        _ => Ok(0),
    }
}

/// CosyVoice3's [`SystemPrompt`] in `tokenizer`'s ids, its `<|endofprompt|>` checked against
/// `[cosyvoice3.llm] end_of_prompt`.
fn system_prompt(tokenizer: &TextTokenizer, dims: &LlmDims) -> Result<SystemPrompt, String> {
    let end_of_prompt = dims.end_of_prompt.ok_or("[cosyvoice3.llm] has no end_of_prompt")?;
    let tokens = tokenizer.encode(&format!("{SYSTEM_PROMPT}{END_OF_PROMPT}")).map_err(|e| e.to_string())?;
    if tokens.last() != Some(&end_of_prompt) {
        return Err(format!("tokenizer.json does not encode {END_OF_PROMPT} as end_of_prompt ({end_of_prompt}): not this model's tokenizer"));
    }
    Ok(SystemPrompt { tokens, end_of_prompt })
}

/// Whether a voice's LLM prompt (speech tokens, text ids) fits the LLM's tables; `Err` says why not.
pub(super) fn fits_llm(name: &str, speech: &[i64], text: &[i64], dims: &LlmDims) -> Result<(), String> {
    if let Some(bad) = speech.iter().find(|t| !(0..dims.speech_tokens).contains(*t)) {
        return Err(format!("voice {name}: LLM prompt token {bad} outside 0..{}", dims.speech_tokens));
    }
    if let Some(bad) = text.iter().find(|t| !(0..dims.vocab).contains(*t)) {
        return Err(format!("voice {name}: prompt text id {bad} outside 0..{}", dims.vocab));
    }
    Ok(())
}

/// An error between LLM steps: libtorch's (classified with the batch's size), or the token2wav
/// thread gone (its own error is the batch's).
enum StepError {
    Tch(tch::TchError),
    VocoderStopped,
    /// A model error already classified: the decode thread could not enter its CUDA stream, or
    /// libtorch failed inside it in a way tch raises as a panic.
    Classified(ModelError),
}

impl From<tch::TchError> for StepError {
    fn from(e: tch::TchError) -> StepError {
        StepError::Tch(e)
    }
}

impl Synthesizer for TextToSpeech {
    fn manifest(&self) -> &Manifest {
        self.token2wav.manifest()
    }

    /// Speech-token items only (what `cosyvoice2-token2wav` takes); text items fail here.
    fn synthesize(&mut self, items: &[SynthItem]) -> Result<Vec<Vec<f32>>, ModelError> {
        self.synthesize_text(items)?.into_iter().map(|r| r.map(Waveform::into_samples).map_err(|e| ModelError::BadInput(e.to_string()))).collect()
    }

    fn synthesize_items(&mut self, items: &[SynthItem]) -> Result<Vec<ItemAudio>, ModelError> {
        Ok(self.synthesize_text(items)?.into_iter().map(|r| r.map_err(|e| e.to_string())).collect())
    }

    fn llm_slots(&self) -> Option<usize> {
        Some(self.decoder.slots())
    }

    fn release_memory(&self) {
        self.token2wav.release_memory();
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
