//! Compiled kernels (issue 16): AOTInductor packages (`.pt2`, made by
//! `tools/compile_token2wav.py` on the machine that will run them) loaded through the C++ shim
//! (`csrc/aoti.cpp`, `torch::inductor::AOTIModelPackageLoader`) and run on tch tensors, no Python
//! at run time.
//!
//! A model directory keeps them under `compiled/<key>/<stage>.pt2`, key =
//! `<arch>-torch<version>-<precision>` (`sm90-torch2.11.0-bf16`, `cpu-torch2.11.0-fp32`): a worker
//! on another GPU, torch or precision finds none of its key and runs the eager port. A package of
//! its key is used only if its metadata agrees (stage, torch, precision, the weights' digest);
//! otherwise — or if it cannot be loaded — the eager port runs and a warning says why. Never a
//! failure: compiled kernels are an optimisation.
//!
//! Stages, per family (`tools/compile/families/`): CosyVoice2's `encoder` (the flow's encoder and
//! its projection to mu; lengths in tokens) and `estimator` (its U-Net, the flow's Euler steps),
//! CosyVoice3's `estimator` (its DiT, called with the same six inputs), both at the flow's
//! precision; and each family's `hift` (the vocoder's convolutional body between the source STFT
//! and the iSTFT: the shared `model::vocoder` in the family's layout, at the vocoder's precision).
//! A package serves batches within the limits its metadata states (`voxbatch.max_batch`,
//! `voxbatch.max_frames`); larger ones run eager.
//!
//! Neighbours: `cosyvoice2::flow`, `cosyvoice3::flow` and `vocoder` (call the packages; the flows'
//! steps through `flow_graphs` on CUDA), the families' loaders (find them with
//! [`compiled_stage`] when a model loads), `shim` (errors).

use std::cell::Cell;
use std::ffi::{c_char, c_void, CString};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

use sha2::{Digest, Sha256};

use super::shim::{checked, ShimError};
use super::{Device, Precision};

extern "C" {
    fn voxbatch_aoti_load(path: *const c_char, device_index: i32, out: *mut *mut c_void, err: *mut c_char, err_len: usize) -> i32;
    fn voxbatch_aoti_metadata(handle: *mut c_void, key: *const c_char, value: *mut c_char, value_len: usize, err: *mut c_char, err_len: usize) -> i32;
    fn voxbatch_aoti_run(
        handle: *mut c_void,
        inputs: *mut *mut c_void,
        n_inputs: i32,
        outputs: *mut *mut c_void,
        max_outputs: i32,
        n_outputs: *mut i32,
        err: *mut c_char,
        err_len: usize,
    ) -> i32;
    fn voxbatch_aoti_free(handle: *mut c_void);
}

/// The most outputs a package may return.
const MAX_OUTPUTS: usize = 8;

/// A loaded AOTInductor package.
pub struct CompiledPackage {
    handle: NonNull<c_void>,
    pub path: PathBuf,
}

// SAFETY: the loader is created, run and freed on the thread that owns this value; moving it to
// another thread before use (the inference thread) is fine, sharing it is not (no Sync).
unsafe impl Send for CompiledPackage {}

impl CompiledPackage {
    /// Loads `path` for `device`.
    pub fn load(path: &Path, device: Device) -> Result<CompiledPackage, ShimError> {
        let c_path = CString::new(path.as_os_str().to_string_lossy().as_bytes()).map_err(|_| ShimError { call: "load package", message: "a NUL in the path".into() })?;
        let index = match device {
            Device::Cpu => -1,
            Device::Cuda(n) => n as i32,
        };
        let mut handle = std::ptr::null_mut();
        // SAFETY: `c_path` outlives the call; the shim writes a new loader into `handle` on success.
        checked("load package", |err, len| unsafe { voxbatch_aoti_load(c_path.as_ptr(), index, &mut handle, err, len) })?;
        let handle = NonNull::new(handle).ok_or_else(|| ShimError { call: "load package", message: "no handle".into() })?;
        Ok(CompiledPackage { handle, path: path.to_path_buf() })
    }

    /// The package's metadata value of `key` (empty when absent).
    pub fn metadata(&self, key: &str) -> Result<String, ShimError> {
        let c_key = CString::new(key).map_err(|_| ShimError { call: "package metadata", message: "a NUL in the key".into() })?;
        let mut value = vec![0 as c_char; 512];
        // SAFETY: a live handle; `value` is a buffer of its stated length the shim NUL-terminates.
        checked("package metadata", |err, len| unsafe {
            voxbatch_aoti_metadata(self.handle.as_ptr(), c_key.as_ptr(), value.as_mut_ptr(), value.len(), err, len)
        })?;
        // SAFETY: NUL-terminated by the shim.
        Ok(unsafe { std::ffi::CStr::from_ptr(value.as_ptr()) }.to_string_lossy().into_owned())
    }

    /// Runs the package on `inputs`, each made what the traced example was: dense (the compiled
    /// kernels index an input as the contiguous example, so an expanded view would be misread)
    /// and, if floating-point, fp32 — every package `tools/compile_token2wav.py` makes takes fp32
    /// and applies its precision inside (autocast). The kernels do not check dtypes: a bf16 tensor
    /// (what a linear layer returns under bf16 autocast) would be read as fp32, past its end.
    pub fn run(&self, inputs: &[&tch::Tensor]) -> Result<Vec<tch::Tensor>, ShimError> {
        let dense: Vec<tch::Tensor> = inputs
            .iter()
            .map(|t| if t.is_floating_point() { t.f_to_kind(tch::Kind::Float) } else { Ok(t.shallow_clone()) }.and_then(|t| t.f_contiguous()))
            .collect::<Result<_, _>>()
            .map_err(|e| ShimError { call: "run package", message: e.to_string() })?;
        let mut ptrs: Vec<*mut c_void> = dense.iter().map(|t| t.as_ptr() as *mut c_void).collect();
        let mut outs = [std::ptr::null_mut::<c_void>(); MAX_OUTPUTS];
        let mut n = 0i32;
        // SAFETY: every input is a live tch tensor (an at::Tensor*) borrowed for the call; the shim
        // writes up to MAX_OUTPUTS new heap at::Tensors and their count.
        checked("run package", |err, len| unsafe {
            voxbatch_aoti_run(self.handle.as_ptr(), ptrs.as_mut_ptr(), ptrs.len() as i32, outs.as_mut_ptr(), MAX_OUTPUTS as i32, &mut n, err, len)
        })?;
        // SAFETY: each of the first `n` pointers is an at::Tensor the shim allocated; from_ptr owns it.
        Ok(outs[..n.max(0) as usize].iter().map(|&p| unsafe { tch::Tensor::from_ptr(p.cast()) }).collect())
    }
}

impl Drop for CompiledPackage {
    fn drop(&mut self) {
        // SAFETY: the handle came from voxbatch_aoti_load and is freed once.
        unsafe { voxbatch_aoti_free(self.handle.as_ptr()) }
    }
}

/// torch's version as packages are keyed (`2.11.0`, without a local suffix).
pub fn torch_version() -> &'static str {
    // tch 0.24 pairs with torch 2.11.0 exactly (build.rs checks the libtorch it links).
    "2.11.0"
}

/// The key packages for `device` and `precision` are filed under, or why there is none (NVML
/// cannot say the GPU's architecture). On a CPU tf32 is fp32. Blocking (NVML).
pub fn package_key(device: Device, precision: Precision) -> Result<String, String> {
    let precision = if device == Device::Cpu && precision == Precision::Tf32 { Precision::Fp32 } else { precision };
    let arch = match device {
        Device::Cpu => "cpu".to_string(),
        Device::Cuda(n) => {
            let (major, minor) = crate::gpu::compute_capability(n).map_err(|e| format!("the GPU's architecture is unknown ({e})"))?;
            format!("sm{major}{minor}")
        }
    };
    Ok(format!("{arch}-torch{}-{precision}", torch_version()))
}

/// The first 16 hex digits of `file`'s sha256: what a package's `voxbatch.weights` must say.
pub fn weights_digest(file: &Path) -> Result<String, String> {
    let mut f = std::fs::File::open(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut f, &mut hasher).map_err(|e| format!("{}: {e}", file.display()))?;
    Ok(hex::encode(hasher.finalize())[..16].to_string())
}

/// Whether a model directory's token2wav runs compiled kernels on `device`: it holds a package of
/// this machine's key for either stage (the estimator at `precision`, the vocoder at `vocoder`) —
/// judged from the files alone, before any model loads (the memory profile is
/// chosen before). A package that then proves unusable runs eager under a compiled profile: the
/// batch sizing's out-of-memory back-off covers that case, and the load warns. Blocking (NVML).
pub fn has_packages(dir: &Path, device: Device, precision: Precision, vocoder: Precision) -> bool {
    has_package(dir, device, "encoder", precision) || has_estimator_package(dir, device, precision) || has_package(dir, device, "hift", vocoder)
}

/// Whether a model directory holds this machine's estimator package at `precision`: what the flow
/// step graphs capture (without it they capture nothing, and the batch sizing reserves nothing for
/// them). Blocking (NVML).
pub fn has_estimator_package(dir: &Path, device: Device, precision: Precision) -> bool {
    has_package(dir, device, "estimator", precision)
}

/// Whether `dir/compiled/<this machine's key at precision>/<stage>.pt2` is a file.
fn has_package(dir: &Path, device: Device, stage: &str, precision: Precision) -> bool {
    package_key(device, precision).is_ok_and(|key| dir.join("compiled").join(key).join(format!("{stage}.pt2")).is_file())
}

/// What [`profile_precision`] appends for a directory whose token2wav runs compiled kernels.
const COMPILED_PROFILE_SUFFIX: &str = "+compiled";
/// What [`profile_precision`] appends on CUDA with cuDNN's per-shape algorithm search.
const CUDNN_BENCHMARK_PROFILE_SUFFIX: &str = "+cudnn-benchmark";

/// The precision a memory profile is filed under: `bf16`; `bf16+compiled` for a directory whose
/// token2wav runs compiled kernels (their peak memory is not the eager port's); then
/// `+cudnn-benchmark` on CUDA with `cudnn_benchmark` (`[model] cudnn_benchmark`: the algorithms it
/// picks take larger workspaces — 7.3 GiB more at token2wav batch 256 on the H200). Blocking (NVML).
pub fn profile_precision(manifest: &super::Manifest, device: Device, precision: Precision, cudnn_benchmark: bool) -> String {
    let family = manifest.cosyvoice2.is_some() || manifest.cosyvoice3.is_some();
    let compiled = family && has_packages(&manifest.dir, device, precision, manifest.vocoder_precision(precision));
    let mut name = precision.to_string();
    if compiled {
        name.push_str(COMPILED_PROFILE_SUFFIX);
    }
    if cudnn_benchmark && matches!(device, Device::Cuda(_)) {
        name.push_str(CUDNN_BENCHMARK_PROFILE_SUFFIX);
    }
    name
}

/// A usable package: what it runs at and the largest batch and length (mel frames) it takes.
pub struct CompiledStage {
    pub package: CompiledPackage,
    pub precision: Precision,
    pub max_batch: i64,
    pub max_frames: i64,
    /// Lengths it takes are multiples of this (`voxbatch.frame_multiple`: 8 for estimators exported
    /// since 2026-12-04, whose attention needs aligned rows; 2 for earlier estimators, which took
    /// even lengths; 1 for the vocoder body and the encoder), and at least two of them.
    pub frame_multiple: i64,
    /// How the package computes its stage, as its metadata says (`layout=… mish=…`: the compile
    /// tool's variant, tuning and inductor options; [`VARIANT_KEYS`]), for the log.
    pub variant: String,
}

/// The metadata keys (after `voxbatch.`) that say how a package computes its stage: what
/// tools/compile_token2wav.py's `Variant`, `--tuning` and `--inductor-option` wrote.
pub const VARIANT_KEYS: [&str; 9] =
    ["layout", "attention", "ff_gelu", "mish", "qkv", "hift_channel_multiple", "hift_dilation", "tuning", "inductor_options"];

impl CompiledStage {
    /// Whether a call of `batch` rows and `frames` (mel frames; tokens for the encoder) is within
    /// the package's shapes.
    pub fn fits(&self, batch: i64, frames: i64) -> bool {
        batch <= self.max_batch && frames <= self.max_frames && frames >= 2 * self.frame_multiple && frames % self.frame_multiple == 0
    }
}

/// Calls a stage ran (compiled, eager) since the last [`KernelCounts::take`]: what `batches.kernels` says.
#[derive(Default)]
pub struct KernelCounts(Cell<(u64, u64)>);

impl KernelCounts {
    pub fn count(&self, compiled: bool) {
        let (c, e) = self.0.get();
        self.0.set(if compiled { (c + 1, e) } else { (c, e + 1) });
    }
    pub fn take(&self) -> (u64, u64) {
        self.0.replace((0, 0))
    }
}

/// What a model directory offers for a stage on a device at a precision.
pub enum PackageChoice {
    Compiled(CompiledStage),
    /// No package of this key: eager, quietly.
    Absent { key: String },
    /// A package that cannot be used: eager, with a warning saying why.
    Unusable { path: PathBuf, reason: String },
}

/// Finds and checks `dir/compiled/<key>/<stage>.pt2`; `weights` is the digest
/// ([`weights_digest`]) of the file the model's weights came from. Blocking (NVML, files).
pub fn find_package(dir: &Path, stage: &str, device: Device, precision: Precision, weights: &str) -> PackageChoice {
    let key = match package_key(device, precision) {
        Ok(k) => k,
        Err(reason) => return PackageChoice::Unusable { path: dir.join("compiled"), reason },
    };
    let path = dir.join("compiled").join(&key).join(format!("{stage}.pt2"));
    if !path.is_file() {
        return PackageChoice::Absent { key };
    }
    let unusable = |reason: String| PackageChoice::Unusable { path: path.clone(), reason };
    let package = match CompiledPackage::load(&path, device) {
        Ok(p) => p,
        Err(e) => return unusable(format!("cannot be loaded: {e}")),
    };
    let expected = [("voxbatch.key", key.as_str()), ("voxbatch.stage", stage), ("voxbatch.weights", weights)];
    for (k, want) in expected {
        match package.metadata(k) {
            Ok(have) if have == want => {}
            Ok(have) => {
                return unusable(format!(
                    "its {k} is `{have}`, this model and machine need `{want}`: compile it again (tools/compile_token2wav.py)"
                ))
            }
            Err(e) => return unusable(format!("metadata: {e}")),
        }
    }
    let mut limits = [0i64; 2];
    for (slot, k) in limits.iter_mut().zip(["voxbatch.max_batch", "voxbatch.max_frames"]) {
        match package.metadata(k).map(|v| v.parse::<i64>()) {
            Ok(Ok(n)) if n > 0 => *slot = n,
            Ok(_) => return unusable(format!("its {k} is missing or not a positive number: compile it again (tools/compile_token2wav.py)")),
            Err(e) => return unusable(format!("metadata: {e}")),
        }
    }
    // Absent from packages made before it was written: estimators then took even lengths.
    let frame_multiple = match package.metadata("voxbatch.frame_multiple") {
        Ok(v) if v.is_empty() => i64::from(stage == "estimator") + 1,
        Ok(v) => match v.parse::<i64>() {
            Ok(n) if n > 0 => n,
            _ => return unusable(format!("its voxbatch.frame_multiple `{v}` is not a positive number: compile it again (tools/compile_token2wav.py)")),
        },
        Err(e) => return unusable(format!("metadata: {e}")),
    };
    let variant = VARIANT_KEYS
        .iter()
        .filter_map(|k| package.metadata(&format!("voxbatch.{k}")).ok().filter(|v| !v.is_empty()).map(|v| format!("{k}={v}")))
        .collect::<Vec<_>>()
        .join(" ");
    PackageChoice::Compiled(CompiledStage { package, precision, max_batch: limits[0], max_frames: limits[1], frame_multiple, variant })
}

/// The digest [`compiled_stage`] checks packages against: the weights file's (`weights`, in the
/// model directory `dir`), read once, and only when the directory has a `compiled/` folder (`None`:
/// no packages, nothing read). Blocking (reads the file).
pub fn packages_digest(dir: &Path, weights: &Path) -> Option<Result<String, String>> {
    dir.join("compiled").is_dir().then(|| weights_digest(weights))
}

/// The model directory's compiled `stage` for this device and precision, if it has a usable one
/// ([`find_package`]); the eager port otherwise, with a warning when a package was there but
/// cannot serve. `weights` is the weights file's digest ([`packages_digest`]), `None` for a
/// directory without packages. Both families' loaders call it for each of their stages.
/// Blocking (NVML, files).
pub fn compiled_stage(dir: &Path, stage: &str, device: Device, precision: Precision, weights: Option<&Result<String, String>>) -> Option<CompiledStage> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_with_packages_of_this_machines_key_files_its_memory_profile_as_compiled() {
        let dir = tempfile::tempdir().unwrap();
        let (cpu, fp32, tf32) = (Device::Cpu, Precision::Fp32, Precision::Tf32);
        assert!(!has_packages(dir.path(), cpu, fp32, tf32));
        let other = dir.path().join("compiled").join("sm90-torch2.11.0-bf16");
        std::fs::create_dir_all(&other).unwrap();
        std::fs::write(other.join("estimator.pt2"), b"x").unwrap();
        assert!(!has_packages(dir.path(), cpu, fp32, tf32), "another machine's packages do not count");
        let mine = dir.path().join("compiled").join("cpu-torch2.11.0-fp32");
        std::fs::create_dir_all(&mine).unwrap();
        std::fs::write(mine.join("hift.pt2"), b"x").unwrap();
        assert!(has_packages(dir.path(), cpu, Precision::Bf16, tf32), "the vocoder's package, keyed by its own precision");
        assert!(!has_estimator_package(dir.path(), cpu, Precision::Fp32), "a vocoder package is no estimator package");
        std::fs::write(mine.join("encoder.pt2"), b"x").unwrap();
        assert!(!has_estimator_package(dir.path(), cpu, Precision::Fp32), "nor is an encoder package");
        std::fs::write(mine.join("estimator.pt2"), b"x").unwrap();
        assert!(has_estimator_package(dir.path(), cpu, Precision::Fp32));
        assert!(!has_estimator_package(dir.path(), cpu, Precision::Bf16), "keyed by the flow's precision");
    }
}
