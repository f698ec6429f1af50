//! `voxbatch voice add|list|show|rm`: the fleet's CosyVoice2 voices, per model, in Postgres.
//!
//! `add` turns a 1-30 s recording and its transcript into a zero-shot voice (`voice::prompt`:
//! speech tokens and x-vector from the checkpoint's ONNX models, the prompt mel, the transcript's
//! tokens) and stores it; every worker of that model picks it up without a restart. Every check
//! runs before anything is stored: the name, the transcript, the model's ONNX files, the audio
//! (not audio, unreadable, too short or long, silence), a name already taken (`--replace`).
//!
//! `list` and `show` read Postgres and the model directory: a directory's own voices are shown
//! before any worker has imported them, and each voice says whether it has a zero-shot prompt.
//!
//! Neighbours: `voice` (the work), `db::voices` (the table), `worker` (`voice::VoiceBook`).

use std::path::{Path, PathBuf};

use serde::Serialize;
use sha2::{Digest, Sha256};

use super::CommandError;
use crate::config::Config;
use crate::db::{VoiceOrigin, VoiceSource, VoiceSummary};
use crate::job::escape_controls;
use crate::report::{Render, Table};
use crate::frontend::segment::SegmentLimits;
use crate::frontend::Frontend;
use crate::model::{Manifest, ModelError};
use crate::voice::onnx::{PromptModels, PromptRecipe};
use crate::voice::prompt::PromptError;
use crate::voice::recording::Recording;
use crate::voice::VoicePrompt;

/// What `voice add` is asked.
#[derive(Debug, Clone)]
pub struct VoiceAdd {
    pub name: String,
    pub audio: PathBuf,
    pub text: String,
    /// The converted model directory (its ONNX files, tokenizer and grammars).
    pub model_dir: PathBuf,
    pub replace: bool,
}

/// What `voice add` stored.
#[derive(Debug, Clone, Serialize)]
pub struct AddedVoice {
    pub model: String,
    pub name: String,
    pub normalized_text: Option<String>,
    pub prompt_text_tokens: usize,
    pub prompt_speech_tokens: usize,
    /// Seconds of prompt the voice keeps (speech tokens at 25 Hz).
    pub prompt_seconds: f64,
    pub recording_seconds: f64,
    pub sha256: String,
    pub replaced: bool,
}

/// A CosyVoice2 model's manifest, or a usage error saying why the directory has no such voices.
fn voice_model(dir: &Path) -> Result<Manifest, CommandError> {
    let manifest = Manifest::load(dir)?;
    if !manifest.kind.has_prompt_voices() {
        return Err(CommandError::Usage(format!(
            "model {} is of kind {}: its voices are fixed by its directory; voices from recordings are for CosyVoice2 models",
            manifest.name,
            manifest.kind.as_str()
        )));
    }
    Ok(manifest)
}

/// Registers a voice from a recording. Nothing is stored unless every check passes.
pub async fn voice_add(cfg: &Config, add: &VoiceAdd) -> Result<AddedVoice, CommandError> {
    crate::job::check_name(&add.name).map_err(|reason| CommandError::Usage(format!("voice name {reason}")))?;
    if add.text.trim().is_empty() {
        return Err(CommandError::Usage("the transcript (--text) is empty: give the words spoken in the recording".into()));
    }
    let (add2, library) = (add.clone(), cfg.voices.onnxruntime.clone());
    let segment_limits = SegmentLimits::from_config(cfg);
    // Files, grammars and ONNX models: blocking, off the async runtime.
    let (manifest, models, normalized, text_tokens, recording, sha256) = tokio::task::spawn_blocking(move || -> Result<_, CommandError> {
        let manifest = voice_model(&add2.model_dir)?;
        let Some(recipe) = PromptRecipe::for_kind(manifest.kind) else {
            return Err(CommandError::Usage(format!(
                "model {} is of kind {}: its voices are fixed by its directory (voices from recordings are made for CosyVoice models)",
                manifest.name,
                manifest.kind.as_str()
            )));
        };
        let models = PromptModels::load(&add2.model_dir, recipe, library.as_deref()).map_err(PromptError::from)?;
        // The LLM's prompt: the transcript as the text frontend gives it (models with an LLM).
        let (normalized, text_tokens) = if manifest.kind.takes_text() {
            let frontend = Frontend::load(&add2.model_dir, segment_limits)?;
            match frontend.prompt_tokens(&add2.text) {
                Ok((n, t)) => (Some(n), t),
                Err(e) if e.is_input() => return Err(CommandError::Usage(format!("the transcript (--text) cannot be used: {e}"))),
                Err(e) => return Err(e.into()),
            }
        } else {
            (None, Vec::new())
        };
        let bytes = std::fs::read(&add2.audio).map_err(|source| CommandError::Io { what: "read the recording", source })?;
        let sha256 = hex::encode(Sha256::digest(&bytes));
        let extension = add2.audio.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
        let recording = Recording::decode(bytes, extension.as_deref()).map_err(PromptError::from)?;
        recording.check_prompt().map_err(PromptError::from)?;
        Ok((manifest, models, normalized, text_tokens, recording, sha256))
    })
    .await
    .map_err(|_| ModelError::ThreadGone)??;

    let db = super::open_db(cfg).await?;
    let exists = db.list_voices(Some(&manifest.name)).await?.iter().any(|v| v.name == add.name);
    if exists && !add.replace {
        return Err(CommandError::Usage(format!(
            "voice {} already exists for model {}: `voxbatch voice add … --replace` overwrites it, `voxbatch voice rm {}` removes it",
            add.name, manifest.name, add.name
        )));
    }
    let (name, text, seconds) = (add.name.clone(), add.text.clone(), recording.seconds());
    let mut models = models;
    let voice = tokio::task::spawn_blocking(move || VoicePrompt::from_recording(&name, &recording, &text, text_tokens, &mut models))
        .await
        .map_err(|_| ModelError::ThreadGone)??;
    let origin = VoiceOrigin { source: VoiceSource::Recording, sha256: Some(&sha256), seconds: Some(seconds) };
    let stored = db.put_voice(&manifest.name, &voice, &origin, add.replace).await?;
    if !stored {
        return Err(CommandError::Usage(format!("voice {} was added for model {} meanwhile; --replace overwrites it", add.name, manifest.name)));
    }
    Ok(AddedVoice {
        model: manifest.name,
        name: voice.name.clone(),
        normalized_text: normalized,
        prompt_text_tokens: voice.prompt_text_tokens.len(),
        prompt_speech_tokens: voice.speech_tokens.len(),
        prompt_seconds: voice.speech_tokens.len() as f64 / crate::frontend::SpeakingRates::TOKENS_PER_SECOND,
        recording_seconds: seconds,
        sha256,
        replaced: exists,
    })
}

/// The model name voices are filed under: `model_dir`'s manifest's.
async fn model_name(model_dir: &Path) -> Result<String, CommandError> {
    let dir = model_dir.to_path_buf();
    let manifest = tokio::task::spawn_blocking(move || voice_model(&dir)).await.map_err(|_| ModelError::ThreadGone)??;
    Ok(manifest.name)
}

/// The voices `model_dir` carries itself (its `voices.safetensors`), as a worker of the model
/// would import them at its start (names jobs cannot use left out), with the model's name.
async fn directory_voices(model_dir: &Path) -> Result<(String, Vec<VoiceSummary>), CommandError> {
    let dir = model_dir.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let manifest = voice_model(&dir)?;
        let voices = crate::voice::prompt::checkpoint_voices(&dir, &manifest)?;
        let summaries = voices
            .iter()
            .filter(|v| crate::job::check_name(&v.name).is_ok())
            .map(|v| VoiceSummary::of(&manifest.name, v, VoiceSource::Checkpoint, None))
            .collect();
        Ok((manifest.name, summaries))
    })
    .await
    .map_err(|_| ModelError::ThreadGone)?
}

/// `stored` and the directory's voices that are not among them, by model and name.
fn with_directory(mut stored: Vec<VoiceSummary>, directory: Vec<VoiceSummary>) -> Vec<VoiceSummary> {
    for v in directory {
        if !stored.iter().any(|s| s.model == v.model && s.name == v.name) {
            stored.push(v);
        }
    }
    stored.sort_by(|a, b| (&a.model, &a.name).cmp(&(&b.model, &b.name)));
    stored
}

/// The voices of the model in `model_dir` (every model's with `None`): those in Postgres, and
/// the model directory's own not imported yet (`created_at` `None`; with `None`, the configured
/// model's, when it takes voices).
pub async fn voice_list(cfg: &Config, model_dir: Option<&Path>) -> Result<Vec<VoiceSummary>, CommandError> {
    let (model, directory) = match model_dir {
        Some(dir) => {
            let (name, voices) = directory_voices(dir).await?;
            (Some(name), voices)
        }
        // Every model's: the configured directory's voices too, if it is a model of such voices.
        None => (None, directory_voices(&cfg.model.dir).await.map(|(_, v)| v).unwrap_or_default()),
    };
    let db = super::open_db(cfg).await?;
    Ok(with_directory(db.list_voices(model.as_deref()).await?, directory))
}

/// One voice of the model in `model_dir` (stored, or the directory's own).
pub async fn voice_show(cfg: &Config, model_dir: &Path, name: &str) -> Result<VoiceSummary, CommandError> {
    let (model, directory) = directory_voices(model_dir).await?;
    let db = super::open_db(cfg).await?;
    with_directory(db.list_voices(Some(&model)).await?, directory)
        .into_iter()
        .find(|v| v.name == name)
        .ok_or_else(|| CommandError::Usage(format!("model {model} has no voice {} (`voxbatch voice list` shows its voices)", escape_controls(name))))
}

/// Removes a voice of the model in `model_dir`. Workers forget it at their next refresh; jobs
/// naming it are then refused as naming an unknown voice.
pub async fn voice_rm(cfg: &Config, model_dir: &Path, name: &str) -> Result<(), CommandError> {
    let model = model_name(model_dir).await?;
    let db = super::open_db(cfg).await?;
    if db.remove_voice(&model, name).await? {
        Ok(())
    } else {
        Err(CommandError::Usage(format!("model {model} has no voice {} in Postgres (`voxbatch voice list` shows its voices)", escape_controls(name))))
    }
}

/// What `voice rm` says it did.
pub fn voice_rm_text(name: &str) -> String {
    format!("removed voice {}; running workers forget it within [voices] refresh\n", escape_controls(name))
}

fn seconds(speech_tokens: usize) -> String {
    if speech_tokens == 0 {
        "-".to_string()
    } else {
        format!("{:.1}", speech_tokens as f64 / crate::frontend::SpeakingRates::TOKENS_PER_SECOND)
    }
}

fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

/// When a voice was stored, or that it is not yet.
fn added(v: &VoiceSummary) -> String {
    v.created_at.map(|t| t.format("%Y-%m-%d %H:%M").to_string()).unwrap_or_else(|| "not imported yet".to_string())
}

/// `voice list` as one table.
fn voice_table(voices: &[VoiceSummary]) -> Table {
    let mut t = Table::new(["model", "voice", "zero_shot", "prompt_s", "source", "added", "transcript"]);
    for v in voices {
        let text = v.prompt_text.as_deref().map(|s| crate::job::truncate(s, 40)).unwrap_or_else(|| "-".into());
        t.row([v.model.clone(), v.name.clone(), yes_no(v.zero_shot).into(), seconds(v.prompt_speech_tokens), v.source.clone(), added(v), text]);
    }
    t
}

impl Render for [VoiceSummary] {
    fn text(&self) -> String {
        if self.is_empty() {
            return "no voices (`voxbatch voice add NAME --audio FILE --text \"…\"` registers one)\n".to_string();
        }
        let mut out = voice_table(self).to_string();
        if self.iter().any(|v| !v.zero_shot) {
            out.push_str("zero_shot no: the voice has no prompt; its jobs run cross_lingual or instruct, and mode zero_shot is refused\n");
        }
        if self.iter().any(|v| v.created_at.is_none()) {
            out.push_str("not imported yet: the model directory's own voice; a worker of the model imports it when it starts\n");
        }
        out
    }

    fn csv(&self) -> Option<String> {
        Some(voice_table(self).csv())
    }
}

impl Render for VoiceSummary {
    fn text(&self) -> String {
        let mut t = Table::new(["field", "value"]);
        let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
        t.row(["model", self.model.as_str()]);
        t.row(["voice", self.name.as_str()]);
        t.row(["zero_shot", yes_no(self.zero_shot)]);
        t.row(["prompt_s".to_string(), seconds(self.prompt_speech_tokens)]);
        t.row(["prompt_speech_tokens".to_string(), self.prompt_speech_tokens.to_string()]);
        t.row(["prompt_text_tokens".to_string(), self.prompt_text_tokens.to_string()]);
        t.row(["transcript".to_string(), opt(&self.prompt_text)]);
        t.row(["source", self.source.as_str()]);
        t.row(["source_sha256".to_string(), opt(&self.source_sha256)]);
        t.row(["source_seconds".to_string(), self.source_seconds.map(|s| format!("{s:.1}")).unwrap_or_else(|| "-".into())]);
        t.row(["added".to_string(), added(self)]);
        t.to_string()
    }
}

impl Render for AddedVoice {
    fn text(&self) -> String {
        format!(
            "{} voice {} for model {}: {:.1} s of prompt ({} speech tokens, {} transcript tokens) from {:.1} s of recording (sha256 {})\n",
            if self.replaced { "replaced" } else { "added" },
            escape_controls(&self.name),
            escape_controls(&self.model),
            self.prompt_seconds,
            self.prompt_speech_tokens,
            self.prompt_text_tokens,
            self.recording_seconds,
            &self.sha256[..self.sha256.len().min(12)]
        )
    }
}
