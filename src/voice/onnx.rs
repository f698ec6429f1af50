//! The prompt's two ONNX models, run with onnxruntime as the reference runs them: the speech
//! tokenizer (CosyVoice2's `speech_tokenizer_v2.onnx`, CosyVoice3's `speech_tokenizer_v3.onnx`:
//! Whisper log-mel `[1, 128, T]` and its length → 25 Hz speech tokens; [`PromptRecipe`] says
//! which) and the speaker model (`campplus.onnx`: Kaldi fbank `[1, T, 80]` → 192-d
//! x-vector). Inputs are passed by position, as `cosyvoice/cli/frontend.py` does, so the files'
//! own input names do not matter.
//!
//! Why onnxruntime (the `ort` crate) and not a tch port: the checkpoint ships these two files and
//! the reference runs them with onnxruntime, so running the same files in the same runtime gives the
//! reference's tokens bit for bit (a port of the tokenizer's FSQ rounding would disagree on ties);
//! they run once per voice added, on the CPU, far from the hot path. The library is loaded at run
//! time from the project venv's pip `onnxruntime` (`voices.onnxruntime`, or `ORT_DYLIB_PATH`), never
//! downloaded at build time; a machine without it can still run workers, only `voice add` needs it.
//!
//! Neighbours: `features` (what goes in), `prompt` (what comes out becomes a voice).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use ort::session::builder::GraphOptimizationLevel;
use ort::session::Session;
use ort::value::{Tensor, TensorElementType};

/// CosyVoice2's speech tokenizer's file in a model directory (the checkpoint's name).
pub const SPEECH_TOKENIZER_FILE: &str = "speech_tokenizer_v2.onnx";
/// CosyVoice3's.
pub const SPEECH_TOKENIZER_V3_FILE: &str = "speech_tokenizer_v3.onnx";

/// How a family makes a voice's prompt from a recording: its speech tokenizer's file and the top
/// frequency of its flow's prompt mel (the reference's `feat_extractor` `fmax`: CosyVoice2's
/// 8,000 Hz, CosyVoice3's none — half of 24 kHz).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PromptRecipe {
    pub speech_tokenizer: &'static str,
    pub mel_fmax: f64,
}

impl PromptRecipe {
    pub const COSYVOICE2: PromptRecipe = PromptRecipe { speech_tokenizer: SPEECH_TOKENIZER_FILE, mel_fmax: 8_000.0 };
    pub const COSYVOICE3: PromptRecipe = PromptRecipe { speech_tokenizer: SPEECH_TOKENIZER_V3_FILE, mel_fmax: 12_000.0 };

    /// `kind`'s recipe, or `None` for a kind whose voices are fixed by its directory.
    pub fn for_kind(kind: crate::model::ModelKind) -> Option<PromptRecipe> {
        use crate::model::ModelKind;
        match kind {
            ModelKind::Cosyvoice2Token2Wav | ModelKind::Cosyvoice2 => Some(PromptRecipe::COSYVOICE2),
            ModelKind::Cosyvoice3Token2Wav | ModelKind::Cosyvoice3 => Some(PromptRecipe::COSYVOICE3),
            ModelKind::TorchScript => None,
        }
    }
}
/// The speaker model's file in a model directory (the checkpoint's name).
pub const CAMPPLUS_FILE: &str = "campplus.onnx";
/// Width of the speaker embedding.
pub use crate::model::voice_prompt::EMBEDDING_DIM;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OnnxError {
    #[error(
        "onnxruntime's shared library was not found (looked for {tried}); install pip's onnxruntime in the \
         project venv (`bash scripts/bootstrap.sh` does) or set voices.onnxruntime (VOXBATCH_VOICES__ONNXRUNTIME) to libonnxruntime.so"
    )]
    NoRuntime { tried: String },
    #[error("cannot load onnxruntime from {path}: {reason}")]
    Load { path: String, reason: String },
    #[error(
        "the model directory {dir} has no {file}: voices from recordings need the checkpoint's speech tokenizer and \
         speaker model (tools/convert_cosyvoice.py copies the checkpoint's speech_tokenizer_v2.onnx or _v3.onnx and campplus.onnx)"
    )]
    MissingModel { dir: String, file: &'static str },
    #[error("{file}: {reason}")]
    Model { file: &'static str, reason: String },
}

/// The loaded runtime: once per process.
static RUNTIME: OnceLock<Result<ort::environment::Environment, String>> = OnceLock::new();

/// Where onnxruntime's library is: `configured` if set, else `ORT_DYLIB_PATH`, else pip's
/// onnxruntime in the project venv (`.venv`, under the working directory or `VOXBATCH_ROOT`).
pub fn runtime_library(configured: Option<&Path>) -> Result<PathBuf, OnnxError> {
    if let Some(p) = configured.filter(|p| !p.as_os_str().is_empty()) {
        return Ok(p.to_path_buf());
    }
    if let Some(p) = std::env::var_os("ORT_DYLIB_PATH").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    let mut roots = vec![PathBuf::from(".")];
    if let Some(root) = std::env::var_os("VOXBATCH_ROOT") {
        roots.insert(0, PathBuf::from(root));
    }
    let mut tried = Vec::new();
    for root in roots {
        let lib = root.join(".venv/lib");
        tried.push(format!("{}/python3*/site-packages/onnxruntime/capi/libonnxruntime.so*", lib.display()));
        let Ok(pythons) = std::fs::read_dir(&lib) else { continue };
        for python in pythons.flatten() {
            let capi = python.path().join("site-packages/onnxruntime/capi");
            let Ok(files) = std::fs::read_dir(&capi) else { continue };
            if let Some(found) = files.flatten().map(|f| f.path()).find(|p| {
                p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("libonnxruntime.so"))
            }) {
                return Ok(found);
            }
        }
    }
    Err(OnnxError::NoRuntime { tried: tried.join(", ") })
}

fn runtime(library: &Path) -> Result<&'static ort::environment::Environment, OnnxError> {
    let loaded = RUNTIME.get_or_init(|| {
        let builder = ort::init_from(library).map_err(|e| e.to_string())?;
        builder.with_name("voxbatch-voice").build().map_err(|e| e.to_string())
    });
    loaded.as_ref().map_err(|reason| OnnxError::Load { path: library.display().to_string(), reason: reason.clone() })
}

/// The speech tokenizer and speaker model of one model directory.
pub struct PromptModels {
    tokenizer: Session,
    campplus: Session,
    recipe: PromptRecipe,
}

impl PromptModels {
    /// Loads `dir`'s two ONNX files (`recipe`'s speech tokenizer) with onnxruntime (`library`,
    /// else as [`runtime_library`] finds it). Blocking: off the async runtime.
    pub fn load(dir: &Path, recipe: PromptRecipe, library: Option<&Path>) -> Result<PromptModels, OnnxError> {
        for file in [recipe.speech_tokenizer, CAMPPLUS_FILE] {
            if !dir.join(file).is_file() {
                return Err(OnnxError::MissingModel { dir: dir.display().to_string(), file });
            }
        }
        let env = runtime(&runtime_library(library)?)?;
        let open = |file: &'static str| -> Result<Session, OnnxError> {
            let model = |e: ort::Error| OnnxError::Model { file, reason: e.to_string() };
            Session::builder(env)
                .map_err(model)?
                // The reference's options: full graph optimisation, one thread.
                .with_optimization_level(GraphOptimizationLevel::All)
                .map_err(|e| OnnxError::Model { file, reason: e.to_string() })?
                .with_intra_threads(1)
                .map_err(|e| OnnxError::Model { file, reason: e.to_string() })?
                .commit_from_file(dir.join(file))
                .map_err(model)
        };
        let models = PromptModels { tokenizer: open(recipe.speech_tokenizer)?, campplus: open(CAMPPLUS_FILE)?, recipe };
        for (file, session, inputs) in [(recipe.speech_tokenizer, &models.tokenizer, 2), (CAMPPLUS_FILE, &models.campplus, 1)] {
            if session.inputs().len() != inputs || session.outputs().is_empty() {
                return Err(OnnxError::Model {
                    file,
                    reason: format!("expected {inputs} input(s) and an output, found {} and {}", session.inputs().len(), session.outputs().len()),
                });
            }
        }
        Ok(models)
    }

    /// The recipe the models were loaded for.
    pub fn recipe(&self) -> PromptRecipe {
        self.recipe
    }

    /// Speech tokens of a 128-bin log-mel (`mel[frame][bin]`), as
    /// `frontend._extract_speech_token`: `feats [1, 128, T]`, `feats_length [T]` (int32).
    pub fn speech_tokens(&mut self, mel: &[Vec<f32>]) -> Result<Vec<i64>, OnnxError> {
        let file = self.recipe.speech_tokenizer;
        let fail = |e: ort::Error| OnnxError::Model { file, reason: e.to_string() };
        let (frames, bins) = (mel.len(), mel.first().map_or(0, Vec::len));
        let mut data = vec![0f32; frames * bins];
        for (t, row) in mel.iter().enumerate() {
            for (b, v) in row.iter().enumerate() {
                data[b * frames + t] = *v;
            }
        }
        let frames_i32 = i32::try_from(frames).map_err(|_| OnnxError::Model { file, reason: format!("{frames} frames") })?;
        let feats = Tensor::from_array(([1usize, bins, frames], data)).map_err(fail)?;
        let length = Tensor::from_array(([1usize], vec![frames_i32])).map_err(fail)?;
        let outputs = self.tokenizer.run(ort::inputs![feats, length]).map_err(fail)?;
        let out = &outputs[0];
        match out.dtype().tensor_type() {
            Some(TensorElementType::Int32) => Ok(out.try_extract_tensor::<i32>().map_err(fail)?.1.iter().map(|&t| i64::from(t)).collect()),
            Some(TensorElementType::Int64) => Ok(out.try_extract_tensor::<i64>().map_err(fail)?.1.to_vec()),
            other => Err(OnnxError::Model { file, reason: format!("speech tokens come out as {other:?}, not int32 or int64") }),
        }
    }

    /// The x-vector of a mean-removed Kaldi fbank (`fbank[frame][bin]`), as
    /// `frontend._extract_spk_embedding`: `[1, T, 80]` → 192 values.
    pub fn embedding(&mut self, fbank: &[Vec<f32>]) -> Result<Vec<f32>, OnnxError> {
        let file = CAMPPLUS_FILE;
        let fail = |e: ort::Error| OnnxError::Model { file, reason: e.to_string() };
        let (frames, bins) = (fbank.len(), fbank.first().map_or(0, Vec::len));
        let data: Vec<f32> = fbank.iter().flatten().copied().collect();
        let input = Tensor::from_array(([1usize, frames, bins], data)).map_err(fail)?;
        let outputs = self.campplus.run(ort::inputs![input]).map_err(fail)?;
        let embedding = outputs[0].try_extract_tensor::<f32>().map_err(fail)?.1.to_vec();
        if embedding.len() != EMBEDDING_DIM {
            return Err(OnnxError::Model { file, reason: format!("the embedding has {} values, not {EMBEDDING_DIM}", embedding.len()) });
        }
        Ok(embedding)
    }
}
