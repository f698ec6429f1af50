//! What both families' token2wav models (`cosyvoice2::Token2Wav`, `cosyvoice3::Token2Wav`) do
//! alike around their flow and vocoder: the files of a converted directory, the voice table on
//! the device ([`Voices`]: x-vector and flow prompt per voice, set from Postgres by the worker's
//! voice book), the checks that keep a job's input from making libtorch fail, the mel stretch of a
//! job's `speed` ([`at_speed`]), the padded mel batch the vocoder takes ([`pack_mels`]), the
//! waveforms' way back to the host ([`HostWaves`]), where a batch's time went ([`StageTiming`]),
//! what `voxbatch bench token2wav` drives ([`Token2WavModel`]) and what the text pipeline drives
//! beside the LLM ([`TextToken2Wav`]).
//!
//! Neighbours: [`super`] (the model seam: `Synthesizer`, the one loader), `voice_prompt` (a voice
//! as data), `weights` (the voices file), `bench::token2wav`, `tts` (the text pipeline).

use std::path::Path;
use std::time::Duration;

use tch::{Kind, Tensor};

use super::cuda_stream::CudaEvent;
use super::layers::R;
use super::flow_graphs::{FlowGraphSettings, FlowGraphStats};
use super::{Device, Manifest, ModelError, Precision, SynthItem, Synthesizer, VoicePrompt};

pub const WEIGHTS_FILE: &str = "token2wav.safetensors";

pub use super::weights::VOICES_FILE;

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

/// `prompt`'s shapes and values, and its flow prompt tokens inside `0..vocab`.
pub fn check_flow_prompt(prompt: &VoicePrompt, vocab: i64) -> Result<(), String> {
    prompt.check()?;
    match prompt.flow_tokens().iter().find(|t| !(0..vocab).contains(*t)) {
        Some(bad) => Err(format!("voice {}: prompt token {bad} outside 0..{vocab}", prompt.name)),
        None => Ok(()),
    }
}

/// A model thread's voices, by index: the directory's own at load, then whatever the worker's
/// voice book sets.
pub struct Voices {
    voices: Vec<Voice>,
    device: tch::Device,
    vocab: i64,
}

impl Voices {
    /// The voices of a converted directory (`voices.safetensors`), checked against `model.toml`'s
    /// `voice_prompt_tokens`. Blocking (reads the file).
    pub fn load(dir: &Path, manifest: &Manifest, device: tch::Device, vocab: i64) -> Result<Voices, ModelError> {
        let err = |reason: String| ModelError::Manifest { dir: dir.display().to_string(), reason };
        let mut voices = Vec::new();
        for (i, prompt) in super::weights::checkpoint_voices(dir, manifest)?.iter().enumerate() {
            let declared = manifest.prompt_tokens(i as i64);
            if declared != prompt.flow_tokens().len() {
                return Err(err(format!(
                    "voice {}: model.toml's voice_prompt_tokens says {declared}, voices.safetensors has a prompt of {} tokens",
                    prompt.name,
                    prompt.flow_tokens().len()
                )));
            }
            voices.push(Voice::new(prompt, device, vocab).map_err(err)?);
        }
        Ok(Voices { voices, device, vocab })
    }

    pub fn as_slice(&self) -> &[Voice] {
        &self.voices
    }

    /// Voice `index`, or `BadInput` naming the range.
    pub fn get(&self, index: i64) -> Result<&Voice, ModelError> {
        usize::try_from(index)
            .ok()
            .and_then(|i| self.voices.get(i))
            .ok_or_else(|| ModelError::BadInput(format!("voice index {index} outside 0..{}", self.voices.len())))
    }

    /// Puts `prompt` at `index` (replacing, or one past the end): how a worker's voice book hands
    /// the model thread a voice it learned from Postgres.
    pub fn set(&mut self, index: usize, prompt: &VoicePrompt) -> Result<(), ModelError> {
        if index > self.voices.len() {
            return Err(ModelError::BadInput(format!("voice index {index}: the next free index is {}", self.voices.len())));
        }
        let voice = Voice::new(prompt, self.device, self.vocab).map_err(ModelError::BadInput)?;
        if index == self.voices.len() {
            self.voices.push(voice);
        } else {
            self.voices[index] = voice;
        }
        Ok(())
    }

    /// Input checks, so that nothing a job carries can make libtorch fail: its voice exists, its
    /// tokens are inside `0..vocab` and at most `most(voice, speed)`, its speed within the job
    /// format's range.
    pub fn check(&self, items: &[SynthItem], most: impl Fn(&Voice, Option<f64>) -> i64) -> Result<(), ModelError> {
        let vocab = self.vocab;
        for item in items {
            let voice = self.get(item.voice)?;
            if let Some(speed) = item.speed.filter(|s| !(crate::job::MIN_SPEED..=crate::job::MAX_SPEED).contains(s)) {
                return Err(ModelError::BadInput(format!("speed {speed} outside {}-{}", crate::job::MIN_SPEED, crate::job::MAX_SPEED)));
            }
            let most = most(voice, item.speed);
            if item.tokens.is_empty() || item.tokens.len() as i64 > most {
                return Err(ModelError::BadInput(format!("{} speech tokens: with this voice a job takes 1 to {most}", item.tokens.len())));
            }
            if let Some(bad) = item.tokens.iter().find(|t| !(0..vocab).contains(*t)) {
                return Err(ModelError::BadInput(format!("speech token {bad} outside 0..{vocab}")));
            }
        }
        Ok(())
    }
}

/// One item of a flow batch (both families' flows take the same): its speech tokens, its voice's
/// prompt and x-vector.
pub struct FlowItem<'a> {
    pub tokens: &'a [i64],
    pub prompt_tokens: &'a [i64],
    /// `[2 · prompt_tokens, 80]` mel of the prompt (empty without a prompt).
    pub prompt_feat: &'a Tensor,
    /// `[192]` speaker x-vector.
    pub embedding: &'a Tensor,
}

impl<'a> FlowItem<'a> {
    /// `tokens` spoken by `voice`.
    pub fn new(tokens: &'a [i64], voice: &'a Voice) -> FlowItem<'a> {
        FlowItem { tokens, prompt_tokens: &voice.prompt_tokens, prompt_feat: &voice.prompt_feat, embedding: &voice.embedding }
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

/// Each item's mel (`[80, frames]`) in one fp32 batch `[B, 80, longest]`, zero past each item's
/// frames — what an unbatched vocoder run pads with — and the frames per item.
pub fn pack_mels(mels: &[Tensor], device: tch::Device) -> R<(Tensor, Vec<i64>)> {
    let frames: Vec<i64> = mels.iter().map(|m| m.size().get(1).copied().unwrap_or(0)).collect();
    let t_max = frames.iter().copied().max().unwrap_or(1).max(1);
    let mel = Tensor::f_zeros([mels.len() as i64, 80, t_max], (Kind::Float, device))?;
    for (row, m) in mels.iter().enumerate() {
        let mut dst = mel.f_get(row as i64)?.f_narrow(1, 0, frames[row])?;
        dst.f_copy_(m)?;
    }
    Ok((mel, frames))
}

/// One item's output: its mel `[80, frames]` and its waveform.
pub type MelAndWave = (Tensor, Vec<f32>);

/// A batch's waveforms on the host — `[B, samples]` f32, page-locked when they came from a GPU —
/// and each item's length in samples. [`HostWaves::into_rows`] cuts one `Vec` per item: host work
/// the caller may hand to another thread (the text model does, so that the GPU does not wait on it:
/// ≈ 0.1 s per bucket of 128 on the H200, 2026-12-04).
///
/// Made by [`HostWaves::queued`] (pipelined buckets, `[llm] pipelined_buckets`), the copy is still
/// on its way: [`HostWaves::into_timed_rows`] waits for it, on whichever thread cuts, and says how
/// much GPU time the batch took on its stream.
pub struct HostWaves {
    wav: Tensor,
    samples: Vec<i64>,
    /// With a queued copy: the events before the batch's first kernel and after its copy.
    pending: Option<(CudaEvent, CudaEvent)>,
}

impl HostWaves {
    /// `wav` (`[B, samples]` on the device, any float dtype) copied to the host as fp32, with
    /// each item's `frames` of 480 samples. Returns once the copy is done.
    pub fn from_device(wav: &Tensor, frames: &[i64]) -> Result<HostWaves, tch::TchError> {
        let wav = super::shim::to_host(&wav.f_to_kind(Kind::Float)?)?;
        Ok(HostWaves { wav, samples: Self::samples(frames), pending: None })
    }

    /// The same copy queued on the calling thread's stream, not waited for: `started`, an event
    /// recorded before the batch's first kernel, and one recorded now after the copy travel with
    /// the waveforms. Without events (a CPU; no CUDA headers at build time) the copy is waited for
    /// here, as [`HostWaves::from_device`]'s.
    pub fn queued(wav: &Tensor, frames: &[i64], started: Option<CudaEvent>, device: super::Device) -> Result<HostWaves, tch::TchError> {
        let Some(started) = started else { return Self::from_device(wav, frames) };
        let host = super::shim::to_host_queued(&wav.f_to_kind(Kind::Float)?)?;
        match CudaEvent::record(device)? {
            Some(copied) => Ok(HostWaves { wav: host, samples: Self::samples(frames), pending: Some((started, copied)) }),
            None => Self::from_device(wav, frames),
        }
    }

    /// Whether the copy was queued and not yet waited for.
    pub fn is_queued(&self) -> bool {
        self.pending.is_some()
    }

    fn samples(frames: &[i64]) -> Vec<i64> {
        frames.iter().map(|f| f * super::vocoder::SAMPLES_PER_FRAME).collect()
    }

    /// Each item's samples, in batch order.
    pub fn into_rows(self) -> Result<Vec<Vec<f32>>, ModelError> {
        Ok(self.into_timed_rows()?.0)
    }

    /// Each item's samples, in batch order, and for a queued copy the GPU seconds from the batch's
    /// first kernel to its copy's end (waited for first).
    pub fn into_timed_rows(self) -> Result<(Vec<Vec<f32>>, Option<f64>), ModelError> {
        let gpu_seconds = match &self.pending {
            Some((started, copied)) => {
                let failed = |e: super::shim::ShimError| ModelError::BadOutput(format!("the waveforms' copy to the host: {e}"));
                copied.wait().map_err(failed)?;
                Some(started.seconds_to(copied).map_err(failed)?)
            }
            None => None,
        };
        let bad = |row: usize, e: tch::TchError| ModelError::BadOutput(format!("waveform of item {row}: {e}"));
        let rows = self
            .samples
            .iter()
            .enumerate()
            .map(|(row, &n)| {
                let samples = self.wav.f_get(row as i64).and_then(|w| w.f_narrow(0, 0, n)).and_then(|w| w.f_contiguous()).map_err(|e| bad(row, e))?;
                Vec::<f32>::try_from(samples).map_err(|e| bad(row, e))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok((rows, gpu_seconds))
    }
}

/// How a family's `forward` meets its stream, once per batch: pipelined
/// ([`TextToken2Wav::set_pipelined`]), an event before the batch's first kernel, no waits between
/// the stages and the waveforms' copy queued ([`HostWaves::queued`]); otherwise the calling
/// thread's stream alone waited for after each stage, for the stage times (the text kinds run
/// token2wav beside the LLM's decode). It also counts what the caching allocator does meanwhile.
pub(super) struct StageWaits {
    started: Option<CudaEvent>,
    device: Device,
    /// [`crate::model::memory::allocator_counts`] at the batch's start.
    allocator: [u64; 3],
}

impl StageWaits {
    /// Before the batch's first kernel. `pipelined` is only ever set on CUDA.
    pub(super) fn begin(pipelined: bool, device: Device) -> Result<StageWaits, ModelError> {
        let started = match pipelined {
            true => CudaEvent::record(device).map_err(|e| ModelError::Inference(e.into()))?,
            false => None,
        };
        Ok(StageWaits { started, device, allocator: crate::model::memory::allocator_counts(device) })
    }

    /// After a stage: its work waited for, unless pipelined. Returns how long the wait took (what
    /// the stage's time holds beyond its host work: the GPU's work, its own and whatever was
    /// queued before it on the stream).
    pub(super) fn stage_done(&self) -> Duration {
        let started = std::time::Instant::now();
        if self.started.is_none() {
            super::cuda_stream::synchronize(self.device);
        }
        started.elapsed()
    }

    /// The batch's waveforms (`[B, samples]` on the device) on their way to the host, with how long
    /// their copy was waited for, and the caching allocator's counts since [`StageWaits::begin`]
    /// ([`StageTiming::allocator`]).
    pub(super) fn waves(self, wav: &Tensor, frames: &[i64]) -> Result<(HostWaves, Duration, [u64; 3]), tch::TchError> {
        let copy = std::time::Instant::now();
        let waves = HostWaves::queued(wav, frames, self.started, self.device)?;
        Ok((waves, copy.elapsed(), crate::model::memory::allocator_delta(self.device, self.allocator)))
    }
}

/// Each item's mel with its samples cut from the batch's waveforms on the caller's thread (what
/// both families' `run` do after `run_to_host`), the time it took counted as the last batch's
/// `audio_out` and as work.
pub fn cut_rows(mels: Vec<Tensor>, waves: HostWaves, last_timing: &mut Option<StageTiming>, work: &mut super::StageTime) -> Result<Vec<MelAndWave>, ModelError> {
    let started = std::time::Instant::now();
    let rows = waves.into_rows()?;
    if let Some(t) = last_timing.as_mut() {
        t.audio_out = started.elapsed();
    }
    work.seconds += started.elapsed().as_secs_f64();
    Ok(mels.into_iter().zip(rows).collect())
}

/// Where the time of one batch went.
#[derive(Debug, Clone, Copy, Default)]
pub struct StageTiming {
    /// Up to the flow's mu: CosyVoice2's conformer encoder, CosyVoice3's token embedding and
    /// pre-lookahead layer.
    pub encoder: Duration,
    pub flow_steps: Duration,
    /// The vocoder, and the waveform's copy to host memory.
    pub vocoder: Duration,
    /// Of each of the three above, the time spent waiting for the GPU (the stage's work and what
    /// was queued before it on the stream; for the vocoder, the waveform's copy to host memory
    /// included); the rest is the host's: launches, and the inputs' making. Zero when pipelined.
    pub waited: [Duration; 3],
    /// The caching allocator's counts during the batch ([`crate::model::memory::allocator_counts`]:
    /// allocations retried after freeing every cached block, cudaMalloc and cudaFree calls).
    pub allocator: [u64; 3],
    /// Host only, after the device work: each item's samples cut from the batch's waveform on the
    /// caller's thread (the GPU waits meanwhile when the caller has no other work queued); zero
    /// where the caller cuts them itself.
    pub audio_out: Duration,
}

/// A token2wav model as `voxbatch bench token2wav` drives it: batches run at chosen precisions,
/// timed by stage, with reproducible waveforms for the quality comparison.
pub trait Token2WavModel: Synthesizer {
    /// Runs a batch: per item the mel `[80, frames]` and the waveform. `seed`: the vocoder's
    /// random draws made from it (CosyVoice2's source draws noise per call; `None` draws fresh
    /// ones); a model whose noise is fixed (CosyVoice3) ignores it.
    fn run_seeded(&mut self, items: &[SynthItem], seed: Option<u64>) -> Result<Vec<MelAndWave>, ModelError>;
    /// The last batch's time split.
    fn last_timing(&self) -> Option<StageTiming>;
    /// The vocoder's precision (`model.toml`'s, until [`Token2WavModel::set_vocoder_precision`]).
    fn vocoder_precision(&self) -> Precision;
    /// Runs the vocoder at `precision` from now on (benchmarks; the worker keeps `model.toml`'s).
    fn set_vocoder_precision(&mut self, precision: Precision);
    /// Gives the caching allocator's free blocks back (after an out-of-memory error).
    fn release_cached(&self);
    /// Small batches' compiled flow steps as CUDA graphs (models with compiled flow steps).
    fn set_flow_graphs(&mut self, settings: FlowGraphSettings, device: Device) {
        let _ = (settings, device);
    }
    /// What the step graphs did since the model loaded.
    fn flow_graph_stats(&self) -> FlowGraphStats {
        FlowGraphStats::default()
    }
}

/// A token2wav model as the text pipeline (`model::tts`) drives it beside the LLM: both families'
/// token2wav halves, whichever the model directory holds.
pub trait TextToken2Wav: Token2WavModel + Send {
    /// The voice table, by index.
    fn voices(&self) -> &[Voice];
    /// Runs a batch up to its waveforms on the host, uncut: per item the mel, and the
    /// [`HostWaves`] the caller cuts where it chooses (the text pipeline: on a thread of its own).
    /// Records the batch's [`StageTiming`] (its `audio_out` zero) and its work.
    fn run_to_host(&mut self, items: &[SynthItem]) -> Result<(Vec<Tensor>, HostWaves), ModelError>;
    /// Device seconds of the batches run since the last [`Synthesizer::take_stages`].
    fn work_seconds(&self) -> f64;
    /// On CUDA, `on`: batches pipelined — no waits between the stages, the waveforms' copy queued
    /// ([`HostWaves::queued`]), so that the next batch is queued while this one runs; their GPU
    /// time is not in [`TextToken2Wav::work_seconds`] until the caller adds it
    /// ([`TextToken2Wav::add_work_seconds`]) from [`HostWaves::into_timed_rows`]. Nothing on a CPU.
    fn set_pipelined(&mut self, on: bool);
    /// Adds pipelined batches' GPU seconds to the work [`Synthesizer::take_stages`] reports.
    fn add_work_seconds(&mut self, seconds: f64);
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

    /// Without a CUDA stream to queue on (a CPU), a queued copy is the plain one: nothing to wait
    /// for, no GPU time, the same rows. (The queued copy itself runs on a GPU:
    /// `cosyvoice2_tts::on_a_gpu_pipelined_buckets_give_the_same_audio_and_bill_token2wavs_gpu_time`.)
    #[test]
    fn on_a_cpu_queued_waveforms_are_the_plain_copy() {
        let wav = Tensor::from_slice(&(0..2 * 960).map(|v| v as f32).collect::<Vec<_>>()).reshape([2, 960]);
        let started = crate::model::cuda_stream::CudaEvent::record(super::super::Device::Cpu).unwrap();
        assert!(started.is_none(), "no event on a CPU");
        let waves = HostWaves::queued(&wav, &[2, 1], started, super::super::Device::Cpu).unwrap();
        assert!(!waves.is_queued());
        let (rows, gpu_seconds) = waves.into_timed_rows().unwrap();
        assert_eq!(gpu_seconds, None);
        assert_eq!(rows.iter().map(Vec::len).collect::<Vec<_>>(), [960, 480], "each item's frames × 480 samples");
        assert_eq!(rows[1][..3], [960.0, 961.0, 962.0]);
    }

    #[test]
    fn a_slow_speed_stretches_the_length_batches_are_sized_by() {
        assert_eq!(stretched_len(100, None), 100);
        assert_eq!(stretched_len(100, Some(1.0)), 100);
        assert_eq!(stretched_len(100, Some(2.0)), 100, "faster: the flow still runs on every token");
        assert_eq!(stretched_len(100, Some(0.5)), 200);
        assert_eq!(stretched_len(100, Some(0.8)), 125);
    }

    #[test]
    fn mels_are_packed_left_aligned_with_zeros_past_each_end() {
        let a = Tensor::ones([80, 3], (Kind::Float, tch::Device::Cpu));
        let b = Tensor::ones([80, 5], (Kind::Float, tch::Device::Cpu)).f_mul_scalar(2.0).unwrap();
        let (mel, frames) = pack_mels(&[a, b], tch::Device::Cpu).unwrap();
        assert_eq!((mel.size(), frames), (vec![2, 80, 5], vec![3, 5]));
        assert_eq!(mel.get(0).narrow(1, 3, 2).abs().sum(Kind::Double).double_value(&[]), 0.0);
        assert_eq!(mel.get(1).sum(Kind::Double).double_value(&[]), 2.0 * 80.0 * 5.0);
    }
}
