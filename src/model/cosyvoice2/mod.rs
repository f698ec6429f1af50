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
//! Neighbours: [`super`] (the model seam: [`Synthesizer`], the inference thread),
//! `super::manifest` (the `[cosyvoice2]` dimensions) and `super::compiled` (packages).

pub mod buckets;
pub mod encoder;
pub mod estimator;
pub mod flow;
pub mod flow_graphs;
pub mod hift;
pub mod layers;
pub mod llm;
pub mod tts;
mod weights;

use std::path::Path;
use std::time::{Duration, Instant};

use tch::{Kind, Tensor};

use self::estimator::EstimatorDims;
use self::flow::{Flow, FlowDims, FlowItem};
use self::hift::{Hift, SourceDraws, SAMPLES_PER_FRAME};
pub use self::weights::{checkpoint_voices, Weights};
use super::compiled::CompiledStage;
use super::shim::{AutocastGuard, Tf32Scope};
use super::torchscript::{classify, prepare_device};
use super::{Device, Manifest, ModelError, Precision, Stage, StageTime, SynthItem, Synthesizer};
use crate::model::VoicePrompt;

pub const WEIGHTS_FILE: &str = "token2wav.safetensors";
pub const VOICES_FILE: &str = "voices.safetensors";

/// A voice on the device: x-vector and optional prompt (from a [`VoicePrompt`]).
pub struct Voice {
    pub name: String,
    pub embedding: Tensor,
    pub prompt_tokens: Vec<i64>,
    /// `[2 · prompt_tokens, 80]`.
    pub prompt_feat: Tensor,
    /// The LLM's prompt: the prompt's speech tokens and its text's token ids (zero-shot voices;
    /// empty otherwise).
    pub llm_prompt_tokens: Vec<i64>,
    pub prompt_text: Vec<i64>,
}

impl Voice {
    /// `prompt`'s tensors on `device`, after checking its shapes and that its flow prompt tokens
    /// are inside `0..vocab`; `Err` says what is wrong.
    pub fn new(prompt: &VoicePrompt, device: tch::Device, vocab: i64) -> Result<Voice, String> {
        check_flow_prompt(prompt, vocab)?;
        let flow = prompt.flow_tokens();
        let tensor = |v: &[f32], shape: &[i64]| Tensor::from_slice(v).reshape(shape).to_device(device);
        Ok(Voice {
            name: prompt.name.clone(),
            embedding: tensor(&prompt.embedding, &[prompt.embedding.len() as i64]),
            prompt_tokens: flow.to_vec(),
            prompt_feat: tensor(&prompt.prompt_mel, &[(2 * flow.len()) as i64, 80]),
            llm_prompt_tokens: prompt.speech_tokens.clone(),
            prompt_text: prompt.prompt_text_tokens.clone(),
        })
    }
}

/// `mel` (`[80, frames]`) spoken at `speed`, as upstream's `token2wav` does it (non-streaming):
/// linearly interpolated (`F.interpolate(mode="linear")`, corners not aligned) to
/// `⌊frames / speed⌋` frames, in float. Speed 1 (or `None`) leaves it as it is.
pub fn at_speed(mel: Tensor, speed: Option<f64>) -> Result<Tensor, tch::TchError> {
    let Some(speed) = speed.filter(|s| *s != 1.0) else { return Ok(mel) };
    let frames = mel.size().get(1).copied().unwrap_or(0);
    let to = ((frames as f64 / speed).floor() as i64).max(1);
    mel.f_to_kind(Kind::Float)?.f_unsqueeze(0)?.f_upsample_linear1d([to], false, None)?.f_squeeze_dim(0)
}

/// `tokens` speech tokens as batch sizing counts them at `speed`: stretched by a speed under 1,
/// since the vocoder then runs on `2 · tokens / speed` frames (the flow on the tokens' own).
pub fn stretched_len(tokens: usize, speed: Option<f64>) -> usize {
    match speed {
        Some(s) if s < 1.0 && s > 0.0 => (tokens as f64 / s).ceil() as usize,
        _ => tokens,
    }
}

/// `prompt`'s shapes and values, and its flow prompt tokens inside `0..vocab`.
fn check_flow_prompt(prompt: &VoicePrompt, vocab: i64) -> Result<(), String> {
    prompt.check()?;
    match prompt.flow_tokens().iter().find(|t| !(0..vocab).contains(*t)) {
        Some(bad) => Err(format!("voice {}: prompt token {bad} outside 0..{vocab}", prompt.name)),
        None => Ok(()),
    }
}

/// Whether the model `manifest` describes can use `prompt` (`Err` says why): what its thread's
/// `set_voice` checks, decided from the manifest alone, so a worker's voice book can answer
/// before the model has loaded (`ModelHandle::set_voice`).
pub fn check_voice(manifest: &Manifest, prompt: &VoicePrompt) -> Result<(), String> {
    let Some(dims) = manifest.cosyvoice2.as_ref().filter(|_| manifest.kind.has_prompt_voices()) else {
        return Err(format!("a {} model's voices are fixed by its directory", manifest.kind.as_str()));
    };
    check_flow_prompt(prompt, dims.vocab_size)?;
    match (manifest.kind, &dims.llm) {
        (super::ModelKind::Cosyvoice2, Some(llm)) => tts::fits_llm(&prompt.name, &prompt.speech_tokens, &prompt.prompt_text_tokens, llm),
        _ => Ok(()),
    }
}

/// The model directory's compiled `stage` for this device and precision, if it has a usable one
/// (`model::compiled`); the eager port otherwise, with a warning when a package was there but
/// cannot serve. `weights` is the weights file's digest, `None` for a directory without packages.
fn compiled_stage(dir: &Path, stage: &str, device: Device, precision: Precision, weights: Option<&Result<String, String>>) -> Option<CompiledStage> {
    use crate::model::compiled::{find_package, PackageChoice};
    let weights = match weights? {
        Ok(d) => d,
        Err(reason) => {
            tracing::warn!(stage, reason, "compiled packages not used: the eager port runs");
            return None;
        }
    };
    match find_package(dir, stage, device, precision, weights) {
        PackageChoice::Compiled(c) => {
            tracing::info!(stage, package = %c.package.path.display(), max_batch = c.max_batch, max_frames = c.max_frames, variant = %c.variant, "runs compiled");
            Some(c)
        }
        PackageChoice::Absent { key } => {
            tracing::debug!(stage, key, "no compiled package for this machine: the eager port runs");
            None
        }
        PackageChoice::Unusable { path, reason } => {
            tracing::warn!(stage, package = %path.display(), reason, "compiled package not used: the eager port runs");
            None
        }
    }
}

/// One item's output: its mel `[80, frames]` and its waveform.
pub type MelAndWave = (Tensor, Vec<f32>);

/// A batch's waveforms on the host — `[B, samples]` f32, page-locked when they came from a GPU —
/// and each item's length in samples. [`HostWaves::into_rows`] cuts one `Vec` per item: host work
/// the caller may hand to another thread (the text model does, so that the GPU does not wait on it:
/// ≈ 0.1 s per bucket of 128 on the H200, 2026-12-04).
pub struct HostWaves {
    wav: Tensor,
    samples: Vec<i64>,
}

impl HostWaves {
    /// Each item's samples, in batch order.
    pub fn into_rows(self) -> Result<Vec<Vec<f32>>, ModelError> {
        let bad = |row: usize, e: tch::TchError| ModelError::BadOutput(format!("waveform of item {row}: {e}"));
        self.samples
            .iter()
            .enumerate()
            .map(|(row, &n)| {
                let samples = self.wav.f_get(row as i64).and_then(|w| w.f_narrow(0, 0, n)).and_then(|w| w.f_contiguous()).map_err(|e| bad(row, e))?;
                Vec::<f32>::try_from(samples).map_err(|e| bad(row, e))
            })
            .collect()
    }
}

pub struct Token2Wav {
    pub flow: Flow,
    pub hift: Hift,
    voices: Vec<Voice>,
    manifest: Manifest,
    device: Device,
    precision: Precision,
    /// `[cosyvoice2] vocoder_precision`: the vocoder's own precision (outside the flow's autocast).
    vocoder_precision: Precision,
    /// Time split of the last batch (encoder+flow, vocoder), device-synchronised.
    pub last_timing: Option<StageTiming>,
    /// Work since the last [`Synthesizer::take_stages`].
    work: StageTime,
}

/// Where the time of one batch went.
#[derive(Debug, Clone, Copy, Default)]
pub struct StageTiming {
    pub encoder: Duration,
    pub flow_steps: Duration,
    /// The vocoder, and the waveform's copy to host memory.
    pub vocoder: Duration,
    /// Host only, after the device work: each item's samples cut from the batch's waveform by
    /// [`Token2Wav::run`] on its caller's thread (the GPU waits meanwhile when the caller has no
    /// other work queued); zero from [`Token2Wav::run_to_host`], whose caller cuts them.
    pub audio_out: Duration,
}

impl Token2Wav {
    pub fn load(dir: &Path, manifest: Manifest, device: Device, precision: Precision) -> Result<Token2Wav, ModelError> {
        prepare_device(device, precision)?;
        let err = |reason: String| ModelError::Manifest { dir: dir.display().to_string(), reason };
        let dims = manifest.cosyvoice2.ok_or_else(|| err("kind cosyvoice2-token2wav needs a [cosyvoice2] section".into()))?;
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
        let mut hift = Hift::new(&w, dims.hift_channels, dims.f0_channels);
        w.finish()?;
        // Packages are checked against the weights file's digest: read once, and only when there are packages.
        let digest = dir.join("compiled").is_dir().then(|| crate::model::compiled::weights_digest(&dir.join(WEIGHTS_FILE)));
        flow.set_compiled_encoder(compiled_stage(dir, "encoder", device, precision, digest.as_ref()));
        flow.set_compiled(compiled_stage(dir, "estimator", device, precision, digest.as_ref()));
        hift.set_compiled(compiled_stage(dir, "hift", device, dims.vocoder(), digest.as_ref()));

        let mut voices = Vec::new();
        for (i, prompt) in weights::checkpoint_voices(dir, &manifest)?.iter().enumerate() {
            let declared = manifest.prompt_tokens(i as i64);
            if declared != prompt.flow_tokens().len() {
                return Err(err(format!(
                    "voice {}: model.toml's voice_prompt_tokens says {declared}, voices.safetensors has a prompt of {} tokens",
                    prompt.name,
                    prompt.flow_tokens().len()
                )));
            }
            voices.push(Voice::new(prompt, dev, dims.vocab_size).map_err(err)?);
        }
        Ok(Token2Wav { flow, hift, voices, manifest, device, precision, vocoder_precision: dims.vocoder(), last_timing: None, work: idle_work() })
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
        &self.voices
    }

    /// Puts `prompt` at voice index `index` (replacing, or one past the end): how a worker's voice
    /// book hands the model thread a voice it learned from Postgres.
    pub fn set_voice(&mut self, index: usize, prompt: &VoicePrompt) -> Result<(), ModelError> {
        if index > self.voices.len() {
            return Err(ModelError::BadInput(format!("voice index {index}: the next free index is {}", self.voices.len())));
        }
        let voice = Voice::new(prompt, self.device.to_tch(), self.flow.vocab_size()).map_err(ModelError::BadInput)?;
        if index == self.voices.len() {
            self.voices.push(voice);
        } else {
            self.voices[index] = voice;
        }
        Ok(())
    }

    /// Runs a batch with explicit vocoder draws (parity tests) or fresh ones (`None`).
    /// Returns per item the mel `[80, frames]` and the waveform; records [`Token2Wav::last_timing`]
    /// (its `audio_out`: cutting the items' waveforms, here on the caller's thread).
    pub fn run(&mut self, items: &[SynthItem], draws: Option<&SourceDraws>) -> Result<Vec<MelAndWave>, ModelError> {
        let (mels, waves) = self.run_to_host(items, draws)?;
        let started = Instant::now();
        let rows = waves.into_rows()?;
        if let Some(t) = self.last_timing.as_mut() {
            t.audio_out = started.elapsed();
        }
        self.work.seconds += started.elapsed().as_secs_f64();
        Ok(mels.into_iter().zip(rows).collect())
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
        self.work.seconds += started.elapsed().as_secs_f64();
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
        let vocab = self.flow.vocab_size();
        for item in items {
            let voice = self.voice(item.voice)?;
            let most = self.flow.max_frames() / 2 - voice.prompt_tokens.len() as i64;
            if item.tokens.is_empty() || item.tokens.len() as i64 > most {
                return Err(ModelError::BadInput(format!(
                    "{} speech tokens: with this voice a job takes 1 to {most}",
                    item.tokens.len()
                )));
            }
            if let Some(bad) = item.tokens.iter().find(|t| !(0..vocab).contains(*t)) {
                return Err(ModelError::BadInput(format!("speech token {bad} outside 0..{vocab}")));
            }
            if let Some(speed) = item.speed.filter(|s| !(crate::job::MIN_SPEED..=crate::job::MAX_SPEED).contains(s)) {
                return Err(ModelError::BadInput(format!("speed {speed} outside {}-{}", crate::job::MIN_SPEED, crate::job::MAX_SPEED)));
            }
        }
        Ok(())
    }

    fn forward(&self, items: &[SynthItem], draws: Option<&SourceDraws>) -> Result<((Vec<Tensor>, HostWaves), StageTiming), ModelError> {
        let dev = self.device.to_tch();
        let sync = || {
            if let Device::Cuda(n) = self.device {
                tch::Cuda::synchronize(n as i64);
            }
        };
        let flow_items: Vec<FlowItem> = items
            .iter()
            .map(|i| {
                let v = &self.voices[i.voice as usize];
                FlowItem { tokens: &i.tokens, prompt_tokens: &v.prompt_tokens, prompt_feat: &v.prompt_feat, embedding: &v.embedding }
            })
            .collect();
        let t0 = Instant::now();
        let failed = |e: tch::TchError| classify(e, items.len());
        let (mels, t1, t2) = self.in_flow_precision(|flow| {
            let encoded = flow.encode(&flow_items).map_err(failed)?;
            sync();
            let t1 = t0.elapsed();
            let mels = flow.sample(&flow_items, &encoded).map_err(failed)?;
            sync();
            Ok((mels, t1, t0.elapsed()))
        })?;
        // Each item at its speed, as upstream stretches the mel between the flow and the vocoder.
        let mels = mels.into_iter().zip(items).map(|(m, item)| at_speed(m, item.speed)).collect::<Result<Vec<_>, _>>().map_err(failed)?;
        let frames: Vec<i64> = mels.iter().map(|m| m.size().get(1).copied().unwrap_or(0)).collect();
        let t_max = frames.iter().copied().max().unwrap_or(1);
        let wav = self.in_vocoder_precision(|hift| {
            let vocode = || -> layers::R<Tensor> {
                let mel = Tensor::f_zeros([items.len() as i64, 80, t_max], (Kind::Float, dev))?;
                for (row, m) in mels.iter().enumerate() {
                    let mut dst = mel.f_get(row as i64)?.f_narrow(1, 0, frames[row])?;
                    dst.f_copy_(m)?;
                }
                let fresh;
                let draws = match draws {
                    Some(d) => d,
                    None => {
                        fresh = SourceDraws::random(items.len() as i64, t_max * SAMPLES_PER_FRAME, dev)?;
                        &fresh
                    }
                };
                Ok(hift.forward(&mel, &frames, draws)?.wav)
            };
            vocode().map_err(failed)
        })?;
        let wav = wav.f_to_kind(Kind::Float).map_err(failed)?;
        let wav = crate::model::shim::to_host(&wav).map_err(|e| failed(e.into()))?;
        let t3 = t0.elapsed();
        let waves = HostWaves { wav, samples: frames.iter().map(|f| f * SAMPLES_PER_FRAME).collect() };
        Ok(((mels, waves), StageTiming { encoder: t1, flow_steps: t2 - t1, vocoder: t3 - t2, audio_out: Duration::ZERO }))
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

    fn voice(&self, index: i64) -> Result<&Voice, ModelError> {
        usize::try_from(index)
            .ok()
            .and_then(|i| self.voices.get(i))
            .ok_or_else(|| ModelError::BadInput(format!("voice index {index} outside 0..{}", self.voices.len())))
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

fn idle_work() -> StageTime {
    StageTime::idle(Stage::Token2Wav)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mel_at_speed_is_torchs_linear_interpolation_to_frames_over_speed() {
        // F.interpolate(mel[None], size=int(7 / speed), mode="linear")[0][3] in torch 2.11 (the
        // reference's `token2wav`), for mel[c][t] = sin(0.1·c + 0.7·t).
        let values: Vec<f32> = (0..80).flat_map(|c| (0..7).map(move |t| (c as f32 * 0.1 + t as f32 * 0.7).sin())).collect();
        let mel = Tensor::from_slice(&values).reshape([80, 7]);
        let reference: [(f64, &[f32]); 5] = [
            (0.5, &[0.29552, 0.432008, 0.704983, 0.879019, 0.954116, 0.912614, 0.754514, 0.516993, 0.200051, -0.121779, -0.448498, -0.703276, -0.886112, -0.97753]),
            (0.8, &[0.29552, 0.739105, 0.944729, 0.813801, 0.39814, -0.162619, -0.680421, -0.97753]),
            (1.1, &[0.341016, 0.879019, 0.859914, 0.305698, -0.448498, -0.947057]),
            (1.5, &[0.500252, 0.95214, 0.120816, -0.840403]),
            (2.0, &[0.659487, 0.675463, -0.733748]),
        ];
        for (speed, want) in reference {
            let got = at_speed(mel.shallow_clone(), Some(speed)).unwrap();
            assert_eq!(got.size(), [80, want.len() as i64], "speed {speed}: ⌊7 / speed⌋ frames");
            let row = Vec::<f32>::try_from(got.get(3)).unwrap();
            for (g, w) in row.iter().zip(want) {
                assert!((g - w).abs() < 1e-5, "speed {speed}: {row:?} vs {want:?}");
            }
        }
        assert_eq!(Vec::<f32>::try_from(at_speed(mel.shallow_clone(), Some(1.0)).unwrap().reshape([-1])).unwrap(), values, "speed 1: as it is");
        assert_eq!(at_speed(mel, None).unwrap().size(), [80, 7]);
    }

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

    #[test]
    fn a_slow_speed_stretches_the_length_batches_are_sized_by() {
        assert_eq!(stretched_len(100, None), 100);
        assert_eq!(stretched_len(100, Some(1.0)), 100);
        assert_eq!(stretched_len(100, Some(2.0)), 100, "faster: the flow still runs on every token");
        assert_eq!(stretched_len(100, Some(0.5)), 200);
        assert_eq!(stretched_len(100, Some(0.8)), 125);
    }
}
