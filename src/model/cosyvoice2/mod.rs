//! CosyVoice2's token2wav half in tch, batched (`kind = "cosyvoice2-token2wav"`): speech tokens →
//! mel ([`flow`]: encoder + conditional flow matching) → 24 kHz waveform ([`hift`]).
//!
//! The official code runs one utterance at a time; here a batch holds items of different lengths
//! (and different voices and prompts) padded together, and each item's output equals its
//! unbatched result. `tests/cosyvoice2_parity.rs` checks every stage against the reference Python
//! code (`tools/make_parity_fixtures.py`).
//!
//! A model directory (written by `tools/convert_cosyvoice.py`) holds `model.toml` with a
//! `[cosyvoice2]` section of dimensions, `token2wav.safetensors` (weights, weight norm folded) and
//! `voices.safetensors` (per voice: x-vector, optional prompt tokens and prompt mel, and the LLM's
//! prompt: speech tokens and prompt text ids).
//!
//! The flow's encoder stage and estimator and the vocoder's convolutional body run through
//! compiled AOTInductor packages when the directory has them for this machine
//! (`compiled/<key>/encoder.pt2` and `estimator.pt2` at the flow's precision,
//! `compiled/<key>/hift.pt2` at the vocoder's; `tools/compile_token2wav.py`), else eager.
//!
//! What it shares with CosyVoice3 lives below both families: `model::flow_matching` (the Euler
//! loop with guidance), `model::vocoder` (HiFT: this family's centred layout), `model::token2wav`
//! (voices, speed, the vocoder's batch, timing), `model::pre_lookahead`, `model::layers`,
//! `model::weights`, `model::flow_graphs`, the speech-token LM (`model::llm`) and the text pipeline
//! (`model::tts`); this folder holds what differs (the conformer encoder, the U-Net estimator).
//!
//! Neighbours: [`super`] (the model seam: [`Synthesizer`], the inference thread),
//! `super::manifest` (the `[cosyvoice2]` dimensions) and `super::compiled` (packages).

pub mod encoder;
pub mod estimator;
pub mod flow;
pub mod hift;
pub use crate::model::{flow_graphs, layers};

use std::path::Path;
use std::time::{Duration, Instant};

use tch::Tensor;

use self::estimator::EstimatorDims;
use self::flow::{Flow, FlowDims, FlowItem};
use self::hift::{Hift, SourceDraws, SAMPLES_PER_FRAME};
use super::compiled::{compiled_stage, packages_digest};
use super::flow_graphs::{FlowGraphSettings, FlowGraphStats};
use super::shim::{AutocastGuard, Tf32Scope};
use super::token2wav::{pack_mels, StageWaits, TextToken2Wav, Token2WavModel, Voices};
use super::torchscript::{classify, prepare_device};
use super::{Device, Manifest, ModelError, Precision, Stage, StageTime, SynthItem, Synthesizer};
use crate::model::VoicePrompt;
pub use crate::model::token2wav::{at_speed, stretched_len, HostWaves, MelAndWave, StageTiming, Voice, VOICES_FILE, WEIGHTS_FILE};
pub use crate::model::weights::{checkpoint_voices, Weights};

/// Whether the model `manifest` describes can use `prompt` (`Err` says why): what its thread's
/// `set_voice` checks, decided from the manifest alone, so a worker's voice book can answer
/// before the model has loaded (`ModelHandle::set_voice`).
pub fn check_voice(manifest: &Manifest, prompt: &VoicePrompt) -> Result<(), String> {
    let Some(dims) = manifest.cosyvoice2.as_ref().filter(|_| manifest.kind.has_prompt_voices()) else {
        return Err(format!("a {} model's voices are fixed by its directory", manifest.kind.as_str()));
    };
    super::token2wav::check_flow_prompt(prompt, dims.vocab_size)?;
    match (manifest.kind, &dims.llm) {
        (super::ModelKind::Cosyvoice2, Some(llm)) => super::tts::fits_llm(&prompt.name, &prompt.speech_tokens, &prompt.prompt_text_tokens, llm),
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
    /// `[cosyvoice2] vocoder_precision`: the vocoder's own precision (outside the flow's autocast).
    vocoder_precision: Precision,
    /// Time split of the last batch (encoder+flow, vocoder), device-synchronised.
    pub last_timing: Option<StageTiming>,
    /// Batches pipelined (`[llm] pipelined_buckets`, the text pipeline on CUDA): no waits between
    /// the stages, the waveforms' copy queued ([`HostWaves::queued`]), the stage times only the
    /// launches', the GPU time added by the caller once the copy is waited for.
    pipelined: bool,
    /// Work since the last [`Synthesizer::take_stages`].
    work: StageTime,
}

impl Token2Wav {
    pub fn load(dir: &Path, manifest: Manifest, device: Device, precision: Precision) -> Result<Token2Wav, ModelError> {
        prepare_device(device, precision)?;
        let err = |reason: String| ModelError::Manifest { dir: dir.display().to_string(), reason };
        let dims = manifest.cosyvoice2.clone().ok_or_else(|| err("kind cosyvoice2-token2wav needs a [cosyvoice2] section".into()))?;
        let dev = device.to_tch();
        let w = Weights::load(&dir.join(WEIGHTS_FILE), dev)?;
        let mut flow = Flow::new(
            &w,
            &FlowDims {
                vocab_size: dims.vocab_size,
                encoder_heads: dims.encoder_heads,
                encoder_units: dims.encoder_units,
                encoder_blocks: dims.encoder_blocks,
                encoder_up_blocks: dims.encoder_up_blocks,
                estimator: EstimatorDims {
                    channels: dims.decoder_channels,
                    blocks: dims.decoder_blocks,
                    mid_blocks: dims.decoder_mid_blocks,
                    heads: dims.decoder_heads,
                    head_dim: dims.decoder_head_dim,
                    attention: dims.flow_attention,
                },
                steps: dims.flow_steps,
                cfg_rate: dims.cfg_rate,
            },
        );
        // The flow always runs under autocast at `precision` (`in_flow_precision`): its eager
        // encoder keeps its parameters in that dtype instead of casting them on every call.
        if let Some(kind) = AutocastGuard::kind(precision) {
            flow.cast_encoder_for_autocast(kind).map_err(|e| err(format!("cannot cast the flow encoder to {precision}: {e}")))?;
        }
        let mut hift = Hift::new(&w, dims.hift_channels, dims.f0_channels).map_err(|e| err(format!("cannot build the vocoder: {e}")))?;
        w.finish()?;
        // Packages are checked against the weights file's digest: read once, and only when there are packages.
        let digest = packages_digest(dir, &dir.join(WEIGHTS_FILE));
        flow.set_compiled_encoder(compiled_stage(dir, "encoder", device, precision, digest.as_ref()));
        flow.set_compiled(compiled_stage(dir, "estimator", device, precision, digest.as_ref()));
        hift.set_compiled(compiled_stage(dir, "hift", device, dims.vocoder(), digest.as_ref()));

        let voices = Voices::load(dir, &manifest, dev, dims.vocab_size)?;
        Ok(Token2Wav { flow, hift, voices, manifest, device, precision, vocoder_precision: dims.vocoder(), last_timing: None, work: idle_work(), pipelined: false })
    }

    /// Gives the caching allocator's free blocks back to the device (after an out-of-memory error).
    /// The flow's step graphs go too (captured again as batches need them).
    pub fn release_cached(&self) {
        self.drop_graphs();
        crate::model::memory::MemoryProbe::new(self.device).release_cached();
    }

    /// Drops the flow's step graphs and their memory pool (captured again as batches need them).
    pub fn drop_graphs(&self) {
        self.flow.clear_graphs();
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

    /// Device seconds of the batches run since the last [`Synthesizer::take_stages`].
    pub fn work_seconds(&self) -> f64 {
        self.work.seconds
    }

    pub fn voices(&self) -> &[Voice] {
        self.voices.as_slice()
    }

    /// Puts `prompt` at voice index `index` (replacing, or one past the end): how a worker's voice
    /// book hands the model thread a voice it learned from Postgres.
    pub fn set_voice(&mut self, index: usize, prompt: &VoicePrompt) -> Result<(), ModelError> {
        self.voices.set(index, prompt)
    }

    /// Runs a batch with explicit vocoder draws (parity tests) or fresh ones (`None`).
    /// Returns per item the mel `[80, frames]` and the waveform; records [`Token2Wav::last_timing`]
    /// (its `audio_out`: cutting the items' waveforms, here on the caller's thread).
    pub fn run(&mut self, items: &[SynthItem], draws: Option<&SourceDraws>) -> Result<Vec<MelAndWave>, ModelError> {
        let (mels, waves) = self.run_to_host(items, draws)?;
        super::token2wav::cut_rows(mels, waves, &mut self.last_timing, &mut self.work)
    }

    /// [`Token2Wav::run`] up to the batch's waveforms on the host, uncut: per item the mel, and the
    /// [`HostWaves`] to cut where the caller chooses.
    pub fn run_to_host(&mut self, items: &[SynthItem], draws: Option<&SourceDraws>) -> Result<(Vec<Tensor>, HostWaves), ModelError> {
        self.check(items)?;
        let _no_grad = tch::no_grad_guard();
        // Every operation of the port is tch's fallible `f_*` form: a libtorch failure (out of
        // memory above all) comes back as an error, classified here.
        let started = Instant::now();
        let (result, timing) = self.forward(items, draws)?;
        self.last_timing = Some(timing);
        // A queued copy's GPU time is the text pipeline's to add, once the cutter has waited for it.
        if !result.1.is_queued() {
            self.work.seconds += started.elapsed().as_secs_f64();
        }
        self.work.items += items.len() as u64;
        self.work.tokens += items.iter().map(|i| i.tokens.len() as u64).sum::<u64>();
        for (compiled, eager) in [self.flow.take_step_counts(), self.hift.take_call_counts()] {
            self.work.compiled_steps += compiled;
            self.work.eager_steps += eager;
        }
        Ok(result)
    }

    /// Input checks, so that nothing a job carries can make libtorch fail.
    fn check(&self, items: &[SynthItem]) -> Result<(), ModelError> {
        let frames = self.flow.max_frames();
        self.voices.check(items, |voice, _| frames / 2 - voice.prompt_tokens.len() as i64)
    }

    fn forward(&self, items: &[SynthItem], draws: Option<&SourceDraws>) -> Result<((Vec<Tensor>, HostWaves), StageTiming), ModelError> {
        let dev = self.device.to_tch();
        let waits = StageWaits::begin(self.pipelined, self.device)?;
        let flow_items: Vec<FlowItem> = items
            .iter()
            .map(|i| {
                let v = &self.voices.as_slice()[i.voice as usize];
                FlowItem { tokens: &i.tokens, prompt_tokens: &v.prompt_tokens, prompt_feat: &v.prompt_feat, embedding: &v.embedding }
            })
            .collect();
        let t0 = Instant::now();
        let failed = |e: tch::TchError| classify(e, items.len());
        let (mels, t1, t2, [w1, w2]) = self.in_flow_precision(|flow| {
            let encoded = flow.encode(&flow_items).map_err(failed)?;
            let w1 = waits.stage_done();
            let t1 = t0.elapsed();
            let mels = flow.sample(&flow_items, &encoded).map_err(failed)?;
            let w2 = waits.stage_done();
            Ok((mels, t1, t0.elapsed(), [w1, w2]))
        })?;
        // Each item at its speed, as upstream stretches the mel between the flow and the vocoder.
        let mels = mels.into_iter().zip(items).map(|(m, item)| at_speed(m, item.speed)).collect::<Result<Vec<_>, _>>().map_err(failed)?;
        let (wav, frames) = self.in_vocoder_precision(|hift| {
            let vocode = || -> layers::R<(Tensor, Vec<i64>)> {
                let (mel, frames) = pack_mels(&mels, dev)?;
                let t_max = mel.size3()?.2;
                let fresh;
                let draws = match draws {
                    Some(d) => d,
                    None => {
                        fresh = SourceDraws::random(items.len() as i64, t_max * SAMPLES_PER_FRAME, dev)?;
                        &fresh
                    }
                };
                Ok((hift.forward(&mel, &frames, draws)?.wav, frames))
            };
            vocode().map_err(failed)
        })?;
        let (waves, w3, allocator) = waits.waves(&wav, &frames).map_err(failed)?;
        let t3 = t0.elapsed();
        Ok(((mels, waves), StageTiming { encoder: t1, flow_steps: t2 - t1, vocoder: t3 - t2, waited: [w1, w2, w3], allocator, audio_out: Duration::ZERO }))
    }

    /// Runs `f` on the flow under the flow's precision (autocast), as [`Token2Wav::run`] does;
    /// stage-by-stage checks call it too.
    pub fn in_flow_precision<T>(&self, f: impl FnOnce(&Flow) -> Result<T, ModelError>) -> Result<T, ModelError> {
        let _autocast = AutocastGuard::enter(self.device, self.precision)?;
        f(&self.flow)
    }

    /// Runs `f` on the vocoder at its own precision (`vocoder_precision`: TF32 or not, its
    /// autocast), outside the flow's, as [`Token2Wav::run`] does.
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
        Ok(self.run(items, None)?.into_iter().map(|(_, wav)| wav).collect())
    }

    fn set_voice(&mut self, index: usize, prompt: &VoicePrompt) -> Result<(), ModelError> {
        Token2Wav::set_voice(self, index, prompt)
    }

    fn release_memory(&self) {
        self.drop_graphs();
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
    fn run_seeded(&mut self, items: &[SynthItem], seed: Option<u64>) -> Result<Vec<MelAndWave>, ModelError> {
        let Some(seed) = seed else { return self.run(items, None) };
        let tokens = items.iter().map(|i| super::token2wav::stretched_len(i.tokens.len(), i.speed)).max().unwrap_or(1) as i64;
        tch::manual_seed(seed as i64);
        let draws = SourceDraws::random(items.len() as i64, tokens * 2 * SAMPLES_PER_FRAME, tch::Device::Cpu).map_err(ModelError::Inference)?;
        self.run(items, Some(&draws))
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

    /// Fresh vocoder draws, as the worker runs it.
    fn run_to_host(&mut self, items: &[SynthItem]) -> Result<(Vec<Tensor>, HostWaves), ModelError> {
        Token2Wav::run_to_host(self, items, None)
    }

    fn work_seconds(&self) -> f64 {
        Token2Wav::work_seconds(self)
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

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Kind;

    #[test]
    fn an_encoder_cast_once_for_autocast_gives_what_casting_on_every_call_gives() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/cosyvoice2-tiny");
        let manifest = Manifest::load(&dir).unwrap_or_else(|e| panic!("{e}; run scripts/bootstrap.sh"));
        let per_call = Token2Wav::load(&dir, manifest.clone(), Device::Cpu, Precision::Fp32).unwrap();
        let cast_once = Token2Wav::load(&dir, manifest, Device::Cpu, Precision::Bf16).unwrap();
        let voice = &cast_once.voices()[cast_once.voices().len() - 1];
        let tokens: Vec<i64> = (0..23).map(|i| (i * 7) % per_call.flow.vocab_size()).collect();
        let short = &tokens[..9];
        let items = [
            FlowItem { tokens: &tokens, prompt_tokens: &voice.prompt_tokens, prompt_feat: &voice.prompt_feat, embedding: &voice.embedding },
            FlowItem { tokens: short, prompt_tokens: &[], prompt_feat: &voice.prompt_feat, embedding: &voice.embedding },
        ];
        let _no_grad = tch::no_grad_guard();
        // The fp32 model's encoder under bf16 autocast: autocast casts its parameters every call.
        let expected = {
            let _autocast = AutocastGuard::enter(Device::Cpu, Precision::Bf16).unwrap();
            per_call.flow.encode(&items).unwrap().0
        };
        let got = cast_once.in_flow_precision(|flow| flow.encode(&items).map_err(ModelError::Inference)).unwrap().0;
        assert_eq!(got.kind(), expected.kind());
        let diff = got.to_kind(Kind::Float).f_sub(&expected.to_kind(Kind::Float)).unwrap().abs().max().double_value(&[]);
        assert_eq!(diff, 0.0, "the same roundings, once at load instead of every call");
        // And the bf16 model's encoder parameters are bf16 indeed: outside autocast it cannot run.
        assert!(cast_once.flow.encode(&items).is_err(), "a bf16 model's encoder keeps its parameters in bf16");
    }
}
