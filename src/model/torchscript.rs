//! TorchScript models (`kind = "torchscript"`): the reference CNN and any model exported with the
//! same signature.

use std::path::Path;

use tch::{CModule, IValue, Kind, Tensor};

use super::shim::{set_tf32, AutocastGuard};
use super::{Device, Manifest, ModelError, Precision, SynthItem, Synthesizer};

pub struct TorchScriptModel {
    module: CModule,
    manifest: Manifest,
    device: Device,
    precision: Precision,
}

/// Checks that `device` exists before anything is loaded on it.
fn check_device(device: Device) -> Result<(), ModelError> {
    if let Device::Cuda(n) = device {
        if !tch::Cuda::is_available() {
            return Err(ModelError::DeviceUnavailable {
                device,
                reason: "CUDA is not available to libtorch (no GPU, no driver, or a CPU-only libtorch)".into(),
            });
        }
        let count = tch::Cuda::device_count();
        if n as i64 >= count {
            return Err(ModelError::DeviceUnavailable { device, reason: format!("only {count} CUDA device(s)") });
        }
    }
    Ok(())
}

/// Checks `device` and `precision` before a model is loaded and sets the TF32 switch:
/// libtorch lets cuDNN convolutions use TF32 by default, and fp32 must mean fp32.
pub(crate) fn prepare_device(device: Device, precision: Precision) -> Result<(), ModelError> {
    check_device(device)?;
    if precision == Precision::Tf32 && device == Device::Cpu {
        return Err(ModelError::PrecisionUnsupported { precision, device, reason: "TF32 is a CUDA tensor-core mode".into() });
    }
    if let Device::Cuda(_) = device {
        set_tf32(precision == Precision::Tf32)?;
    }
    Ok(())
}

impl TorchScriptModel {
    pub fn load(dir: &Path, manifest: Manifest, device: Device, precision: Precision) -> Result<Self, ModelError> {
        prepare_device(device, precision)?;
        let path = dir.join("model.pt");
        let mut module = CModule::load_on_device(&path, device.to_tch())
            .map_err(|source| ModelError::Load { path: path.display().to_string(), source })?;
        module.set_eval();
        Ok(TorchScriptModel { module, manifest, device, precision })
    }

    fn forward(&self, items: &[SynthItem]) -> Result<Vec<Vec<f32>>, ModelError> {
        let dev = self.device.to_tch();
        let max_len = items.iter().map(|i| i.tokens.len()).max().unwrap_or(0).max(1);
        let mut flat = vec![0i64; items.len() * max_len];
        for (row, item) in items.iter().enumerate() {
            flat[row * max_len..row * max_len + item.tokens.len()].copy_from_slice(&item.tokens);
        }
        let b = items.len() as i64;
        let tokens = Tensor::from_slice(&flat).view([b, max_len as i64]).to_device(dev);
        let lengths: Vec<i64> = items.iter().map(|i| i.tokens.len() as i64).collect();
        let lengths_t = Tensor::from_slice(&lengths).to_device(dev);
        let voices: Vec<i64> = items.iter().map(|i| i.voice).collect();
        let speakers = Tensor::from_slice(&voices).to_device(dev);

        let _no_grad = tch::no_grad_guard();
        let out = {
            let _autocast = AutocastGuard::enter(self.device, self.precision)?;
            self.module.forward_is(&[IValue::Tensor(tokens), IValue::Tensor(lengths_t), IValue::Tensor(speakers)])
        }
        .map_err(|e| classify(e, items.len()))?;
        let (audio, audio_lengths) = match out {
            IValue::Tuple(mut v) if v.len() == 2 => match (v.remove(0), v.remove(0)) {
                (IValue::Tensor(a), IValue::Tensor(l)) => (a, l),
                _ => return Err(ModelError::BadOutput("expected (Tensor, Tensor)".into())),
            },
            other => return Err(ModelError::BadOutput(format!("expected a 2-tuple, got {:?}", ivalue_kind(&other)))),
        };
        let audio = audio.to_kind(Kind::Float).to_device(tch::Device::Cpu);
        let audio_lengths = audio_lengths.to_device(tch::Device::Cpu);
        let size = audio.size();
        if size.len() != 2 || size[0] != b {
            return Err(ModelError::BadOutput(format!("audio has shape {size:?}, expected [{b}, S]")));
        }
        let samples = size[1] as usize;
        let lens = Vec::<i64>::try_from(&audio_lengths).map_err(|e| ModelError::BadOutput(e.to_string()))?;
        let data = Vec::<f32>::try_from(audio.contiguous().view([-1])).map_err(|e| ModelError::BadOutput(e.to_string()))?;
        if lens.len() != items.len() {
            return Err(ModelError::BadOutput(format!("{} audio lengths for {} items", lens.len(), items.len())));
        }
        lens.iter()
            .enumerate()
            .map(|(row, &len)| {
                let len = usize::try_from(len).ok().filter(|&l| l <= samples).ok_or_else(|| {
                    ModelError::BadOutput(format!("audio length {len} outside 0..={samples}"))
                })?;
                Ok(data[row * samples..row * samples + len].to_vec())
            })
            .collect()
    }
}

fn ivalue_kind(v: &IValue) -> &'static str {
    match v {
        IValue::Tensor(_) => "Tensor",
        IValue::Tuple(_) => "Tuple",
        IValue::GenericList(_) => "List",
        _ => "other",
    }
}

/// Sorts libtorch errors into out-of-memory (retry smaller) and the rest.
pub(crate) fn classify(e: tch::TchError, batch_size: usize) -> ModelError {
    let msg = e.to_string();
    if msg.contains("out of memory") || msg.contains("OutOfMemory") {
        ModelError::OutOfMemory { batch_size, source: e }
    } else {
        ModelError::Inference(e)
    }
}

impl Synthesizer for TorchScriptModel {
    fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    fn synthesize(&mut self, items: &[SynthItem]) -> Result<Vec<Vec<f32>>, ModelError> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        self.forward(items)
    }
}
