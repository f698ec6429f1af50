//! Named tensors from a safetensors file, checked against what the model asks for.
//!
//! The model's constructors ask for each tensor by name and shape; every miss and every shape
//! mismatch is recorded, and [`Weights::finish`] reports them all at once together with the
//! tensors the file has but nothing asked for, so a wrong or partial conversion is one clear error.
//! Both model families read their weights through it, and a converted directory's voices
//! ([`checkpoint_voices`], the same `voices.safetensors` layout for both).

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};
use std::path::Path;

use tch::{Device, Kind, Tensor};

use super::ModelError;

/// The voices a converted directory carries (its checkpoint's `spk2info.pt`), read by
/// [`checkpoint_voices`].
pub const VOICES_FILE: &str = "voices.safetensors";

pub struct Weights {
    path: String,
    tensors: HashMap<String, Tensor>,
    used: RefCell<BTreeSet<String>>,
    problems: RefCell<Vec<String>>,
}

impl Weights {
    /// Reads every tensor of `path` onto `device` (floating point as fp32).
    pub fn load(path: &Path, device: Device) -> Result<Weights, ModelError> {
        Weights::load_as(path, device, Kind::Float)
    }

    /// Reads every tensor of `path` onto `device`, floating point as `kind` — but float64, which
    /// stays float64: a layer that runs in float64 keeps the weights its converter computed there
    /// (CosyVoice3's F0 predictor, folded as upstream evaluates it: `tools/convert_cosyvoice.py`).
    pub fn load_as(path: &Path, device: Device, kind: Kind) -> Result<Weights, ModelError> {
        let shown = path.display().to_string();
        let list = Tensor::read_safetensors(path).map_err(|source| ModelError::Load { path: shown.clone(), source })?;
        let tensors = list
            .into_iter()
            .map(|(name, t)| {
                let t = if t.is_floating_point() && t.kind() != Kind::Double { t.f_to_kind(kind)? } else { t };
                Ok((name, t.f_to_device(device)?))
            })
            .collect::<Result<_, tch::TchError>>()
            .map_err(|source| ModelError::Load { path: shown.clone(), source })?;
        Ok(Weights { path: shown, tensors, used: RefCell::default(), problems: RefCell::default() })
    }

    /// The tensor `name`, which must have `shape`. A miss is recorded and answered with zeros.
    pub fn get(&self, name: &str, shape: &[i64]) -> Tensor {
        self.used.borrow_mut().insert(name.to_string());
        match self.tensors.get(name) {
            Some(t) if t.size() == shape => t.shallow_clone(),
            Some(t) => {
                self.problems.borrow_mut().push(format!("{name}: shape {:?}, expected {shape:?}", t.size()));
                Tensor::zeros(shape, (Kind::Float, t.device()))
            }
            None => {
                self.problems.borrow_mut().push(format!("{name}: missing"));
                Tensor::zeros(shape, (Kind::Float, Device::Cpu))
            }
        }
    }

    /// The tensors `names`, each of `shape`, concatenated along their first dimension (the weights
    /// of projections of one input, run as one matmul). A missing or misshapen part is recorded as
    /// [`Weights::get`] records it, and the result is zeros of the concatenated shape.
    pub fn get_concatenated(&self, names: &[String], shape: &[i64]) -> Tensor {
        let before = self.problems.borrow().len();
        let parts: Vec<Tensor> = names.iter().map(|n| self.get(n, shape)).collect();
        let mut total = shape.to_vec();
        if let Some(first) = total.first_mut() {
            *first *= names.len() as i64;
        }
        let device = parts.first().map_or(Device::Cpu, Tensor::device);
        if self.problems.borrow().len() > before {
            return Tensor::zeros(total.as_slice(), (Kind::Float, device));
        }
        Tensor::f_cat(&parts, 0).unwrap_or_else(|e| {
            self.problems.borrow_mut().push(format!("{}: {e}", names.join(" + ")));
            Tensor::zeros(total.as_slice(), (Kind::Float, device))
        })
    }

    /// The 1-D integer tensor `name` as ids, or `None` when the file has no such tensor.
    pub fn get_ids(&self, name: &str) -> Option<Vec<i64>> {
        let t = self.tensors.get(name)?;
        self.used.borrow_mut().insert(name.to_string());
        if t.dim() != 1 || t.is_floating_point() {
            self.problems.borrow_mut().push(format!("{name}: expected a 1-D integer tensor, found {:?} {:?}", t.kind(), t.size()));
            return Some(Vec::new());
        }
        Vec::<i64>::try_from(t.to_kind(Kind::Int64).to_device(Device::Cpu)).ok()
    }

    /// Number of `prefix{i}.` groups in the file (blocks of a stack).
    pub fn count(&self, prefix: &str) -> usize {
        self.tensors
            .keys()
            .filter_map(|k| k.strip_prefix(prefix)?.split('.').next()?.parse::<usize>().ok())
            .max()
            .map_or(0, |m| m + 1)
    }

    /// Ok when everything asked for was there with its shape and nothing else is in the file.
    pub fn finish(self) -> Result<(), ModelError> {
        let used = self.used.into_inner();
        let mut problems = self.problems.into_inner();
        let mut unexpected: Vec<&String> = self.tensors.keys().filter(|k| !used.contains(*k)).collect();
        unexpected.sort();
        problems.extend(unexpected.into_iter().map(|k| format!("{k}: unexpected")));
        if problems.is_empty() {
            return Ok(());
        }
        let shown: Vec<String> = problems.iter().take(40).cloned().collect();
        let more = problems.len().saturating_sub(shown.len());
        Err(ModelError::Manifest {
            dir: self.path,
            reason: format!(
                "the weights do not match model.toml ({} problem(s){}): {}; convert the model again with \
                 tools/convert_cosyvoice.py",
                problems.len(),
                if more > 0 { format!(", {more} not shown") } else { String::new() },
                shown.join("; ")
            ),
        })
    }
}

/// The voices a converted model directory carries (`voices.safetensors`, from the checkpoint's
/// `spk2info.pt`), in `model.toml`'s order. Blocking (reads the file).
pub fn checkpoint_voices(dir: &std::path::Path, manifest: &crate::model::Manifest) -> Result<Vec<crate::model::VoicePrompt>, crate::model::ModelError> {
    use crate::model::voice_prompt::{EMBEDDING_DIM, FRAMES_PER_TOKEN, MEL_BINS};
    let err = |reason: String| crate::model::ModelError::Manifest { dir: dir.display().to_string(), reason };
    let w = Weights::load(&dir.join(VOICES_FILE), tch::Device::Cpu)?;
    let floats = |t: tch::Tensor| Vec::<f32>::try_from(t.reshape([-1])).map_err(|e| err(format!("{VOICES_FILE}: {e}")));
    let mut voices = Vec::new();
    for name in &manifest.voices {
        let embedding = floats(w.get(&format!("{name}.embedding"), &[EMBEDDING_DIM as i64]))?;
        let (flow, prompt_mel) = match w.get_ids(&format!("{name}.prompt_token")) {
            Some(tokens) => {
                let mel = floats(w.get(&format!("{name}.prompt_feat"), &[(FRAMES_PER_TOKEN * tokens.len()) as i64, MEL_BINS as i64]))?;
                (tokens, mel)
            }
            None => (Vec::new(), Vec::new()),
        };
        let llm = w.get_ids(&format!("{name}.llm_prompt_token")).unwrap_or_else(|| flow.clone());
        let prompt_text_tokens = w.get_ids(&format!("{name}.prompt_text")).unwrap_or_default();
        let flow_tokens = (llm != flow).then_some(flow);
        voices.push(crate::model::VoicePrompt { name: name.clone(), prompt_text: None, prompt_text_tokens, speech_tokens: llm, flow_tokens, prompt_mel, embedding });
    }
    w.finish()?;
    Ok(voices)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weights(tensors: Vec<(&str, Tensor)>) -> Weights {
        let dir = std::env::temp_dir().join(format!("voxbatch-weights-{}-{}", std::process::id(), tensors.len()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("w.safetensors");
        Tensor::write_safetensors(&tensors, &path).unwrap();
        let w = Weights::load(&path, Device::Cpu).unwrap();
        let _ = std::fs::remove_dir_all(dir);
        w
    }

    #[test]
    fn concatenated_projections_are_their_parts_in_order_and_a_missing_part_is_reported() {
        let (a, b) = (Tensor::ones([2, 3], (Kind::Float, Device::Cpu)), Tensor::ones([2, 3], (Kind::Float, Device::Cpu)) * 2.0);
        let w = weights(vec![("a.weight", a.shallow_clone()), ("b.weight", b.shallow_clone())]);
        let both = w.get_concatenated(&["a.weight".into(), "b.weight".into()], &[2, 3]);
        assert!(both.equal(&Tensor::cat(&[a, b], 0)));
        assert!(w.finish().is_ok(), "both parts used");
        let w = weights(vec![("a.weight", Tensor::ones([2, 3], (Kind::Float, Device::Cpu)))]);
        let missing = w.get_concatenated(&["a.weight".into(), "c.weight".into()], &[2, 3]);
        assert_eq!(missing.size(), [4, 3]);
        let e = w.finish().unwrap_err().to_string();
        assert!(e.contains("c.weight: missing"), "{e}");
    }
}
