//! CosyVoice2 text → speech, whole: for each job its text through the frontend (normalised,
//! segmented, tokenized), the segments through the LLM (all the batch's segments decoding together
//! with continuous refill), their speech tokens through token2wav (padded batches of segments) and
//! each job's segment audio joined in order. A job whose text says nothing, whose segment yields no
//! speech tokens or runs into the LLM's `max_len` fails alone, with its reason; the others are
//! unaffected.
//!
//! This is the chain the `cosyvoice2` model kind will run on the model thread (issue 14: the worker
//! wiring, segments as the batch unit and the two stages' interleaving are next); tests run it on
//! the tiny random model.
//!
//! Neighbours: `frontend` (text → segments), `llm` (`SpeechLm`, `BatchDecoder`, `prompt`),
//! `Token2Wav` (this module's parent), `job::Mode`.

use std::path::Path;

use super::llm::batch::BatchDecoder;
use super::llm::prompt::{self, PromptError, END_OF_PROMPT};
use super::llm::sampler::SamplingParams;
use super::llm::speech_lm::{LengthRatios, LmError, SpeechLm};
use super::Token2Wav;
use crate::config::Config;
use crate::frontend::segment::SegmentLimits;
use crate::frontend::{Frontend, FrontendError};
use crate::job::Mode;
use crate::model::{Device, Manifest, ModelError, Precision, SynthItem, Synthesizer};

/// One text job.
#[derive(Debug, Clone)]
pub struct TextJob {
    pub job_id: uuid::Uuid,
    pub text: String,
    /// Index of its voice in the manifest's voices.
    pub voice: usize,
    pub mode: Option<Mode>,
    pub instruction: Option<String>,
}

/// Why one job could not be synthesized (the others are unaffected).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TextJobError {
    #[error(transparent)]
    Frontend(#[from] FrontendError),
    #[error(transparent)]
    Prompt(#[from] PromptError),
    #[error("segment {segment}: {source}")]
    Llm { segment: usize, source: LmError },
    #[error("segment {segment}: the LLM ran to max_len ({tokens} speech tokens) without ending the speech")]
    MaxLen { segment: usize, tokens: usize },
    #[error("segment {segment}: the LLM produced no speech tokens")]
    NoSpeech { segment: usize },
    #[error("unknown voice index {0}")]
    UnknownVoice(usize),
}

/// Segments token2wav runs in one padded batch at most.
const TOKEN2WAV_BATCH: usize = 16;

pub struct TextToSpeech {
    pub token2wav: Token2Wav,
    pub lm: SpeechLm,
    decoder: BatchDecoder,
    ratios: LengthRatios,
    frontend: Frontend,
}

impl TextToSpeech {
    /// Loads a converted directory with its LLM (`llm.safetensors`), tokenizer and grammars, as
    /// `cfg` says: segments as `[frontend]` and `[llm] max_text_tokens` cut them, slots as long as
    /// `sizing::llm::max_positions`, CUDA graphs as `[llm] cuda_graphs`; the LLM decodes `slots`
    /// sequences at once.
    pub fn load(dir: &Path, device: Device, precision: Precision, cfg: &Config, slots: usize) -> Result<TextToSpeech, ModelError> {
        let manifest = Manifest::load(dir)?;
        let err = |reason: String| ModelError::Manifest { dir: dir.display().to_string(), reason };
        let dims = manifest.cosyvoice2.as_ref().and_then(|c| c.llm).ok_or_else(|| err("model.toml has no [cosyvoice2.llm] (convert llm.pt)".into()))?;
        let frontend = Frontend::load(dir, SegmentLimits::from_config(cfg)).map_err(|e| err(e.to_string()))?;
        // Ids the LLM's tables cannot look up would fail every batch they are in: refuse the
        // model before loading its weights.
        let known = frontend.tokenizer().vocab_size();
        if known as i64 > dims.vocab {
            return Err(err(format!("tokenizer.json knows {known} ids, the LLM's embedding has {} rows: not this model's tokenizer", dims.vocab)));
        }
        let token2wav = Token2Wav::load(dir, manifest, device, precision)?;
        for (name, voice) in Synthesizer::manifest(&token2wav).voices.iter().zip(token2wav.voices()) {
            if let Some(bad) = voice.llm_prompt_tokens.iter().find(|t| !(0..dims.speech_tokens).contains(*t)) {
                return Err(err(format!("voice {name}: LLM prompt token {bad} outside 0..{}", dims.speech_tokens)));
            }
            if let Some(bad) = voice.prompt_text.iter().find(|t| !(0..dims.vocab).contains(*t)) {
                return Err(err(format!("voice {name}: prompt text id {bad} outside 0..{}", dims.vocab)));
            }
        }
        let (lm, params, ratios): (SpeechLm, SamplingParams, LengthRatios) = SpeechLm::load(dir, &dims, device.to_tch())?;
        let positions = crate::sizing::llm::max_positions(&cfg.llm, &dims);
        let decoder = BatchDecoder::new(&lm, slots, positions, params, cfg.llm.cuda_graphs).map_err(ModelError::Inference)?;
        Ok(TextToSpeech { token2wav, lm, decoder, ratios, frontend })
    }

    pub fn frontend(&self) -> &Frontend {
        &self.frontend
    }

    /// Each job's audio (24 kHz) or why it failed; `Err` for the whole batch only when libtorch
    /// fails (out of memory above all: the caller splits and retries).
    pub fn synthesize(&mut self, jobs: &[TextJob]) -> Result<Vec<Result<Vec<f32>, TextJobError>>, ModelError> {
        let mut results: Vec<Option<Result<Vec<f32>, TextJobError>>> = jobs.iter().map(|_| None).collect();
        // (job, segment) of every request, in order.
        let mut owners = Vec::new();
        let mut requests = Vec::new();
        for (j, job) in jobs.iter().enumerate() {
            match self.requests(job) {
                Ok(reqs) => {
                    owners.extend((0..reqs.len()).map(|s| (j, s)));
                    requests.extend(reqs);
                }
                Err(e) => results[j] = Some(Err(e)),
            }
        }
        let decoded = tch::no_grad(|| self.lm.generate(&mut self.decoder, &requests, self.ratios)).map_err(ModelError::Inference)?;
        // Speech tokens per job, in segment order; the first failure of a job is its result.
        let mut tokens: Vec<Vec<Vec<i64>>> = jobs.iter().map(|_| Vec::new()).collect();
        for ((j, segment), out) in owners.into_iter().zip(decoded) {
            if results[j].is_some() {
                continue;
            }
            match out {
                Err(source) => results[j] = Some(Err(TextJobError::Llm { segment, source })),
                Ok(o) if o.hit_max_len => results[j] = Some(Err(TextJobError::MaxLen { segment, tokens: o.tokens.len() })),
                Ok(o) if o.tokens.is_empty() => results[j] = Some(Err(TextJobError::NoSpeech { segment })),
                Ok(o) => tokens[j].push(o.tokens),
            }
        }
        // Every segment of the jobs still standing, in order, with its job.
        let (segment_jobs, items): (Vec<usize>, Vec<SynthItem>) = tokens
            .into_iter()
            .enumerate()
            .filter(|(j, _)| results[*j].is_none())
            .flat_map(|(j, segs)| segs.into_iter().map(move |t| (j, SynthItem { tokens: t, voice: jobs[j].voice as i64 })))
            .unzip();
        let mut audio: Vec<Vec<f32>> = jobs.iter().map(|_| Vec::new()).collect();
        for (owners, batch) in segment_jobs.chunks(TOKEN2WAV_BATCH).zip(items.chunks(TOKEN2WAV_BATCH)) {
            for (&j, (_, wave)) in owners.iter().zip(self.token2wav.run(batch, None)?) {
                audio[j].extend(wave);
            }
        }
        Ok(results.into_iter().zip(audio).map(|(r, a)| r.unwrap_or(Ok(a))).collect())
    }

    /// A job's LLM requests: its segments, prompted as its mode says.
    fn requests(&self, job: &TextJob) -> Result<Vec<super::llm::speech_lm::LmRequest>, TextJobError> {
        let prepared = self.frontend.prepare(&job.text)?;
        let voice = self.token2wav.voices().get(job.voice).ok_or(TextJobError::UnknownVoice(job.voice))?;
        let name = Synthesizer::manifest(&self.token2wav).voices.get(job.voice).cloned().unwrap_or_default();
        let instruction = match &job.instruction {
            Some(text) => Some(self.frontend.tokenizer().encode(&format!("{text}{END_OF_PROMPT}")).map_err(FrontendError::from)?),
            None => None,
        };
        let segments: Vec<Vec<i64>> = prepared.segments.into_iter().map(|s| s.tokens).collect();
        Ok(prompt::requests(job.job_id, &segments, &name, voice, job.mode, instruction.as_deref())?)
    }
}
