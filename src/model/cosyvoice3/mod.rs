//! CosyVoice3's token2wav half in tch, batched (`kind = "cosyvoice3-token2wav"`): speech tokens →
//! mel ([`flow`]: token embedding, pre-lookahead, the [`dit`] under conditional flow matching) →
//! 24 kHz waveform ([`hift`]: the causal HiFT) — `CosyVoice3Model.token2wav` offline (non-streaming,
//! `finalize=True`), the reference being FunAudioLLM/CosyVoice ace7c47 (/work/notes/cv3-port.md
//! is the layer-by-layer spec; `tools/make_cv3_fixtures.py` the fixtures).
//!
//! The official code runs one utterance at a time (its flow asserts it); here a batch holds items
//! of different lengths, voices and prompts padded together, and each item's output equals its
//! unbatched result (`tests/integration/cosyvoice3_parity.rs`, per stage against the reference).
//!
//! Precision, as upstream runs CosyVoice3 (`CosyVoice3Model.token2wav` wraps both stages in its
//! autocast): the flow under autocast at the model's precision (fp32: none), its estimator's inputs
//! in the speaker projection's dtype as upstream's buffers are; the vocoder under the same autocast
//! by default (`[cosyvoice3] vocoder_precision` may set another), its F0 predictor in float64
//! whatever the autocast (upstream moves it there; autocast never casts float64), its STFT/iSTFT
//! in fp32. fp32 on a CPU: everything fp32 but the F0 predictor.
//!
//! A model directory (`tools/convert_cosyvoice.py` from an official CosyVoice3 directory) holds
//! `model.toml` with a `[cosyvoice3]` section, `token2wav.safetensors` (weights with weight norm
//! folded, the flow's fixed noise and the vocoder's fixed sine noise) and `voices.safetensors`.
//!
//! The DiT's steps and the vocoder's convolutional body run through compiled AOTInductor packages
//! when the directory has them for this machine (`compiled/<key>/estimator.pt2` at the flow's
//! precision, `compiled/<key>/hift.pt2` at the vocoder's; `tools/compile_token2wav.py --family
//! cosyvoice3`), each checked as CosyVoice2's are (`model::compiled::compiled_stage`: key, stage,
//! the weights' digest), else eager; on CUDA a small batch's compiled steps replay as CUDA graphs
//! (`model::flow_graphs`).
//!
//! What it shares with CosyVoice2 lives below both families (`model::flow_matching`,
//! `model::vocoder`, `model::token2wav`, `model::pre_lookahead`, `model::layers`, `model::weights`,
//! `model::compiled`, `model::flow_graphs`); this folder holds what differs. Neighbours: [`super`]
//! (the model seam: `Synthesizer`, the one loader), `super::manifest` (`Cosyvoice3Dims`).

pub mod dit;
pub mod embeddings;
pub mod flow;
pub mod hift;

use std::path::Path;
use std::time::{Duration, Instant};

use tch::Tensor;

use self::dit::DitDims;
use self::flow::{Flow, FlowDims};
use self::hift::Hift;
use super::compiled::{compiled_stage, packages_digest};
use super::flow_graphs::{FlowGraphSettings, FlowGraphStats};
use super::shim::{AutocastGuard, Tf32Scope};
use super::token2wav::{at_speed, check_flow_prompt, cut_rows, pack_mels, FlowItem, HostWaves, MelAndWave, StageTiming, StageWaits, TextToken2Wav, Token2WavModel, Voice, Voices, WEIGHTS_FILE};
use super::torchscript::{classify, prepare_device};
use super::weights::Weights;
use super::{Device, Manifest, ModelError, Precision, Stage, StageTime, SynthItem, Synthesizer, VoicePrompt};

/// Whether the CosyVoice3 model `manifest` describes can use `prompt` (`Err` says why), from the
/// manifest alone (`ModelHandle::set_voice` asks before the model has loaded).
pub fn check_voice(manifest: &Manifest, prompt: &VoicePrompt) -> Result<(), String> {
    let Some(dims) = &manifest.cosyvoice3 else {
        return Err(format!("model {} has no [cosyvoice3] section", manifest.name));
    };
    check_flow_prompt(prompt, dims.vocab_size)?;
    match (manifest.kind, &dims.llm) {
        (super::ModelKind::Cosyvoice3, Some(llm)) => super::tts::fits_llm(&prompt.name, &prompt.speech_tokens, &prompt.prompt_text_tokens, llm),
        _ => Ok(()),
    }
}

pub struct Token2Wav {
    pub flow: Flow,
    pub hift: Hift,
    voices: Voices,
    manifest: Manifest,
    device: Device,
    precision: Precision,
    vocoder_precision: Precision,
    /// Time split of the last batch, device-synchronised.
    pub last_timing: Option<StageTiming>,
    /// Batches pipelined (`[llm] pipelined_buckets`): as CosyVoice2's `Token2Wav::pipelined`.
    pipelined: bool,
    /// Work since the last [`Synthesizer::take_stages`].
    work: StageTime,
}

impl Token2Wav {
    pub fn load(dir: &Path, manifest: Manifest, device: Device, precision: Precision) -> Result<Token2Wav, ModelError> {
        prepare_device(device, precision)?;
        let err = |reason: String| ModelError::Manifest { dir: dir.display().to_string(), reason };
        let dims = manifest.cosyvoice3.clone().ok_or_else(|| err("kind cosyvoice3-token2wav needs a [cosyvoice3] section".into()))?;
        let dev = device.to_tch();
        let w = Weights::load(&dir.join(WEIGHTS_FILE), dev)?;
        let mut flow = Flow::new(
            &w,
            &FlowDims {
                vocab_size: dims.vocab_size,
                lookahead: dims.pre_lookahead_len,
                lookahead_channels: dims.pre_lookahead_channels,
                dit: DitDims { dim: dims.dit_dim, depth: dims.dit_depth, heads: dims.dit_heads, head_dim: dims.dit_head_dim, ff_mult: dims.dit_ff_mult },
                steps: dims.flow_steps,
                cfg_rate: dims.cfg_rate,
            },
        );
        let mut hift = Hift::new(&w, dims.hift_channels, dims.f0_channels, dims.conv_pre_look_right, dims.noise_samples)
            .map_err(|e| err(format!("cannot build the vocoder: {e}")))?;
        w.finish()?;
        let vocoder_precision = dims.vocoder(precision);
        // Packages are checked against the weights file's digest: read once, and only when there are packages.
        let digest = packages_digest(dir, &dir.join(WEIGHTS_FILE));
        flow.set_compiled(compiled_stage(dir, "estimator", device, precision, digest.as_ref()));
        hift.set_compiled(compiled_stage(dir, "hift", device, vocoder_precision, digest.as_ref()));
        let voices = Voices::load(dir, &manifest, dev, dims.vocab_size)?;
        Ok(Token2Wav { flow, hift, voices, manifest, device, precision, vocoder_precision, last_timing: None, work: idle_work(), pipelined: false })
    }

    pub fn voices(&self) -> &[Voice] {
        self.voices.as_slice()
    }

    /// Runs a batch of jobs' items (their voices from the table): per item the mel and the
    /// waveform; records [`Token2Wav::last_timing`] (its `audio_out`: cutting the items'
    /// waveforms, here on the caller's thread).
    pub fn run(&mut self, items: &[SynthItem]) -> Result<Vec<MelAndWave>, ModelError> {
        let (mels, waves) = self.run_to_host(items)?;
        cut_rows(mels, waves, &mut self.last_timing, &mut self.work)
    }

    /// [`Token2Wav::run`] up to the batch's waveforms on the host, uncut: per item the mel, and
    /// the [`HostWaves`] to cut where the caller chooses.
    pub fn run_to_host(&mut self, items: &[SynthItem]) -> Result<(Vec<Tensor>, HostWaves), ModelError> {
        self.check(items)?;
        let voices = items.iter().map(|i| self.voices.get(i.voice)).collect::<Result<Vec<_>, _>>()?;
        let flow_items: Vec<FlowItem> = items.iter().zip(&voices).map(|(i, v)| FlowItem::new(&i.tokens, v)).collect();
        let speeds: Vec<Option<f64>> = items.iter().map(|i| i.speed).collect();
        let ((mels, waves), timing) = self.forward(&flow_items, &speeds)?;
        self.account(items.len(), items.iter().map(|i| i.tokens.len()).sum(), timing, waves.is_queued());
        Ok((mels, waves))
    }

    /// Runs flow items as given (prompts and x-vectors of the caller's, as the reference's
    /// `token2wav` takes them), each at its speed: per item the mel and the waveform.
    pub fn run_flow_items(&mut self, items: &[FlowItem], speeds: &[Option<f64>]) -> Result<Vec<MelAndWave>, ModelError> {
        let ((mels, waves), timing) = self.forward(items, speeds)?;
        self.account(items.len(), items.iter().map(|i| i.tokens.len()).sum(), timing, false);
        cut_rows(mels, waves, &mut self.last_timing, &mut self.work)
    }

    /// `queued`: the waveforms' copy not yet waited for (pipelined), whose GPU time the text
    /// pipeline adds once the cutter has waited for it.
    fn account(&mut self, items: usize, tokens: usize, timing: StageTiming, queued: bool) {
        let total = timing.encoder + timing.flow_steps + timing.vocoder + timing.audio_out;
        self.last_timing = Some(timing);
        if !queued {
            self.work.seconds += total.as_secs_f64();
        }
        self.work.items += items as u64;
        self.work.tokens += tokens as u64;
        for (compiled, eager) in [self.flow.take_step_counts(), self.hift.take_call_counts()] {
            self.work.compiled_steps += compiled;
            self.work.eager_steps += eager;
        }
    }

    /// Runs the vocoder at `precision` from now on (benchmarks; the worker keeps `model.toml`'s).
    /// A compiled vocoder of another precision is set aside (the eager port runs).
    pub fn set_vocoder_precision(&mut self, precision: Precision) {
        self.vocoder_precision = precision;
        if self.hift.compiled().is_some_and(|c| c.precision != precision) {
            tracing::info!(%precision, "the compiled vocoder is of another precision: the eager port runs");
            self.hift.set_compiled(None);
        }
    }

    /// Gives the caching allocator's free blocks back to the device (after an out-of-memory
    /// error); the flow's step graphs go too (captured again as batches need them).
    pub fn release_cached(&self) {
        self.flow.clear_graphs();
        crate::model::memory::MemoryProbe::new(self.device).release_cached();
    }

    /// Input checks, so that nothing a job carries can make libtorch fail: the flow's noise
    /// covers prompt and tokens, the vocoder's the generated frames at the item's speed.
    fn check(&self, items: &[SynthItem]) -> Result<(), ModelError> {
        let (flow_frames, vocoder_frames) = (self.flow.max_frames(), self.hift.max_frames());
        self.voices.check(items, |voice, speed| {
            let by_flow = flow_frames / 2 - voice.prompt_tokens.len() as i64;
            let by_vocoder = (vocoder_frames as f64 * speed.unwrap_or(1.0) / 2.0).floor() as i64;
            by_flow.min(by_vocoder)
        })
    }

    fn forward(&self, items: &[FlowItem], speeds: &[Option<f64>]) -> Result<((Vec<Tensor>, HostWaves), StageTiming), ModelError> {
        let _no_grad = tch::no_grad_guard();
        let waits = StageWaits::begin(self.pipelined, self.device)?;
        let failed = |e: tch::TchError| classify(e, items.len());
        let t0 = Instant::now();
        let (mels, t1, t2, [w1, w2]) = self.in_flow_precision(|flow| {
            let encoded = flow.encode(items).map_err(failed)?;
            let w1 = waits.stage_done();
            let t1 = t0.elapsed();
            let mels = flow.sample(items, &encoded).map_err(failed)?;
            let w2 = waits.stage_done();
            Ok((mels, t1, t0.elapsed(), [w1, w2]))
        })?;
        // Each item at its speed: upstream stretches the mel between the flow and the vocoder.
        let mels = mels.into_iter().zip(speeds).map(|(m, s)| at_speed(m, *s)).collect::<Result<Vec<_>, _>>().map_err(failed)?;
        let (wav, frames) = self.in_vocoder_precision(|hift| {
            let vocode = || -> Result<(Tensor, Vec<i64>), tch::TchError> {
                let (mel, frames) = pack_mels(&mels, self.device.to_tch())?;
                Ok((hift.forward(&mel, &frames)?.wav, frames))
            };
            vocode().map_err(failed)
        })?;
        let (waves, w3, allocator) = waits.waves(&wav, &frames).map_err(failed)?;
        let t3 = t0.elapsed();
        let timing = StageTiming { encoder: t1, flow_steps: t2 - t1, vocoder: t3 - t2, waited: [w1, w2, w3], allocator, audio_out: Duration::ZERO };
        Ok(((mels, waves), timing))
    }

    /// Runs `f` on the flow under the flow's precision (autocast), as [`Token2Wav::run`] does;
    /// stage-by-stage checks call it too.
    pub fn in_flow_precision<T>(&self, f: impl FnOnce(&Flow) -> Result<T, ModelError>) -> Result<T, ModelError> {
        let _autocast = AutocastGuard::enter(self.device, self.precision)?;
        f(&self.flow)
    }

    /// Runs `f` on the vocoder at its precision (the flow's unless `vocoder_precision` says
    /// otherwise: its TF32 setting and autocast), as [`Token2Wav::run`] does.
    pub fn in_vocoder_precision<T>(&self, f: impl FnOnce(&Hift) -> Result<T, ModelError>) -> Result<T, ModelError> {
        let _tf32 = Tf32Scope::enter(self.device, self.vocoder_precision == Precision::Tf32, self.precision == Precision::Tf32)?;
        let _autocast = AutocastGuard::enter(self.device, self.vocoder_precision)?;
        f(&self.hift)
    }
}

impl Synthesizer for Token2Wav {
    fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    fn synthesize(&mut self, items: &[SynthItem]) -> Result<Vec<Vec<f32>>, ModelError> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        Ok(self.run(items)?.into_iter().map(|(_, wav)| wav).collect())
    }

    fn set_voice(&mut self, index: usize, prompt: &VoicePrompt) -> Result<(), ModelError> {
        self.voices.set(index, prompt)
    }

    fn release_memory(&self) {
        self.flow.clear_graphs();
    }

    fn take_stages(&mut self) -> Vec<StageTime> {
        let work = std::mem::replace(&mut self.work, idle_work());
        if work.items == 0 {
            Vec::new()
        } else {
            vec![work]
        }
    }
}

impl Token2WavModel for Token2Wav {
    /// The vocoder's noise is the model's fixed buffer: `seed` changes nothing.
    fn run_seeded(&mut self, items: &[SynthItem], _seed: Option<u64>) -> Result<Vec<MelAndWave>, ModelError> {
        self.run(items)
    }

    fn last_timing(&self) -> Option<StageTiming> {
        self.last_timing
    }

    fn vocoder_precision(&self) -> Precision {
        self.vocoder_precision
    }

    fn set_vocoder_precision(&mut self, precision: Precision) {
        Token2Wav::set_vocoder_precision(self, precision);
    }

    fn release_cached(&self) {
        Token2Wav::release_cached(self);
    }

    fn set_flow_graphs(&mut self, settings: FlowGraphSettings, device: Device) {
        self.flow.set_graphs(settings, device);
    }

    fn flow_graph_stats(&self) -> FlowGraphStats {
        self.flow.graph_stats()
    }
}

impl TextToken2Wav for Token2Wav {
    fn voices(&self) -> &[Voice] {
        Token2Wav::voices(self)
    }

    fn run_to_host(&mut self, items: &[SynthItem]) -> Result<(Vec<Tensor>, HostWaves), ModelError> {
        Token2Wav::run_to_host(self, items)
    }

    fn work_seconds(&self) -> f64 {
        self.work.seconds
    }

    fn set_pipelined(&mut self, on: bool) {
        self.pipelined = on && matches!(self.device, Device::Cuda(_));
    }

    fn add_work_seconds(&mut self, seconds: f64) {
        self.work.seconds += seconds;
    }
}

fn idle_work() -> StageTime {
    StageTime::idle(Stage::Token2Wav)
}
